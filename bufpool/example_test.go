package bufpool_test

import (
	"context"
	"fmt"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
)

// A pool of registered buffers on an endpoint's protection domain.
func ExampleNew() {
	ctx := context.Background()
	ep, err := cm.Dial(ctx, "10.77.0.1:7471")
	if err != nil {
		return
	}
	defer func() {
		ep.CloseAndDrain(nil)
	}()
	pool, err := bufpool.New(ep.PD(), bufpool.Size(4096), bufpool.Count(256))
	if err != nil {
		return
	}
	defer pool.Close()
	b, _ := pool.Get(ctx)
	copy(b.Bytes(), "payload")
	fmt.Println(pool.Stats().Out) // 1
	pool.Put(b)
}

// A region the peer may read, and the 16 bytes that describe it.
func ExampleNewRegion() {
	ctx := context.Background()
	ep, err := cm.Dial(ctx, "10.77.0.1:7471")
	if err != nil {
		return
	}
	defer func() {
		ep.CloseAndDrain(nil)
	}()
	region, err := bufpool.NewRegion(ep.PD(), 1<<20, bufpool.RemoteRead)
	if err != nil {
		return
	}
	defer region.Close()
	desc, _ := region.Remote().MarshalBinary() // send desc to the peer in a message
	fmt.Println(len(desc))                     // 16
}

// The descriptor's encoding is fixed and needs no device.
func ExampleRemote_MarshalBinary() {
	b, _ := bufpool.Remote{Addr: 0x1000, RKey: 42, Len: 4096}.MarshalBinary()
	var r bufpool.Remote
	r.UnmarshalBinary(b)
	fmt.Println(len(b), r.Addr, r.RKey, r.Len)
	// Output: 16 4096 42 4096
}
