package bufpool_test

import (
	"context"
	"fmt"
	"os"

	"github.com/go-rdma/rdmacm/bufpool"
)

// A pool of registered buffers and a region a peer may read, made at
// start-up on a protection domain of the device with the given address.
// Connections that use them share the PD: cm.Dial(ctx, addr,
// cm.WithPD(pd)). (An endpoint's own PD, ep.PD(), serves that connection
// alone.)
func Example() {
	ctx := context.Background()
	pd, err := bufpool.OpenPD(ctx, os.Getenv("RDMACM_TEST_ADDR"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pd.Close() // freed once its pools and regions are closed too

	pool, err := bufpool.New(pd, bufpool.Size(4096), bufpool.Count(16))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	b, err := pool.Get(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	copy(b.Bytes(), "payload") // fill it, then post it with ep.PostSend
	fmt.Printf("%+v\n", pool.Stats())
	if err := pool.Put(b); err != nil {
		fmt.Println(err)
	}
	fmt.Println(pool.Put(b)) // a second Put is refused and changes nothing

	region, err := bufpool.NewRegion(pd, 1<<20, bufpool.RemoteRead)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer region.Close()
	desc, _ := region.Remote().MarshalBinary() // send desc to the peer in a message
	fmt.Println(len(desc), region.Remote().Len)
	// Output:
	// {Size:4096 Count:16 Free:15 Out:1}
	// bufpool: buffer put twice (it is already back in its pool)
	// 20 1048576
}

// The descriptor's encoding is fixed and needs no device.
func ExampleRemote_MarshalBinary() {
	b, _ := bufpool.Remote{Addr: 0x1000, RKey: 42, Len: 4096}.MarshalBinary()
	var r bufpool.Remote
	if err := r.UnmarshalBinary(b); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(b), r.Addr, r.RKey, r.Len)
	// Output: 20 4096 42 4096
}
