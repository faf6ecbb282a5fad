package bufpool_test

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
)

// A pool of registered buffers on a connection's protection domain, and a
// region the peer may read. Memory is registered in a protection domain,
// which a connection's endpoint provides; the pool and region serve that
// connection only.
func Example() {
	ctx := context.Background()
	l, err := cm.Listen(ctx, net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	go func() {
		if ep, err := l.Accept(ctx); err == nil {
			<-ep.Done() // until the dialer closes
			ep.CloseAndDrain(nil)
		}
	}()
	ep, err := cm.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ep.CloseAndDrain(nil)

	pool, err := bufpool.New(ep.PD(), bufpool.Size(4096), bufpool.Count(16))
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

	region, err := bufpool.NewRegion(ep.PD(), 1<<20, bufpool.RemoteRead)
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
