package endpoint_test

import (
	"context"
	"fmt"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
)

// Send a message and wait for its completion: the context passed to the
// post comes back exactly once.
func ExampleEndpoint_PostSend() {
	ctx := context.Background()
	ep, err := cm.Dial(ctx, "10.77.0.1:7471")
	if err != nil {
		return
	}
	defer func() {
		ep.CloseAndDrain(nil)
	}()
	pool, err := bufpool.New(ep.PD(), bufpool.Size(4096), bufpool.Count(16))
	if err != nil {
		return
	}
	defer pool.Close()
	b, _ := pool.Get(ctx)
	n := copy(b.Bytes(), "hello")
	if err := ep.PostSend("my-send", b, n, endpoint.Inline()); err != nil {
		pool.Put(b)
		return
	}
	c := <-ep.Completions()
	fmt.Println(c.Context, c.Err) // my-send <nil>
	pool.Put(c.Buffer)
}

// Write into the peer's region, whose descriptor arrived in a message.
func ExampleEndpoint_PostWriteImm() {
	ctx := context.Background()
	ep, err := cm.Dial(ctx, "10.77.0.1:7471")
	if err != nil {
		return
	}
	defer func() {
		ep.CloseAndDrain(nil)
	}()
	var remote bufpool.Remote
	// ... remote.UnmarshalBinary(the 16 bytes the peer sent) ...
	pool, _ := bufpool.New(ep.PD(), bufpool.Size(64<<10), bufpool.Count(1))
	defer pool.Close()
	b, _ := pool.Get(ctx)
	// The peer's posted receive completes with OpRecvWriteImm and Imm 7.
	if err := ep.PostWriteImm(nil, b, b.Len(), remote, 7); err == nil {
		<-ep.Completions()
	}
	pool.Put(b)
}
