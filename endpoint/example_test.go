package endpoint_test

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
)

// One-sided access: the server registers a region the client may write
// and read, and sends its 20-byte descriptor in a message; the client
// writes into it with RDMA WRITE and reads it back with RDMA READ, which
// the server's CPU never sees; then it says it is done.
func Example_oneSided() {
	ctx := context.Background()
	l, err := cm.Listen(ctx, net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() { served <- serveRegion(ctx, l) }()

	// The client posts the receive for the descriptor before the
	// connection is up, so that the server may send it at once.
	var pool *bufpool.Pool
	var desc *bufpool.Buffer
	ep, err := cm.Dial(ctx, l.Addr().String(), cm.WithSetup(func(ep *endpoint.Endpoint) error {
		var err error
		if pool, err = bufpool.New(ep.PD(), bufpool.Size(64), bufpool.Count(2)); err != nil {
			return err
		}
		desc, _ = pool.TryGet()
		return ep.PostRecv("descriptor", desc)
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	defer ep.CloseAndDrain(nil)

	c, err := ep.Next(ctx)
	if err == nil {
		err = c.Err
	}
	var remote bufpool.Remote
	if err == nil {
		err = remote.UnmarshalBinary(desc.Bytes()[:c.Len])
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	b := desc // the descriptor's buffer is free again: reuse it
	n := copy(b.Bytes(), "written by RDMA")
	if err := oneSided(ctx, ep, endpoint.Request{Op: endpoint.OpWrite, Buffer: b, Length: n, Remote: remote}); err != nil {
		fmt.Println(err)
		return
	}
	clear(b.Bytes())
	if err := oneSided(ctx, ep, endpoint.Request{Op: endpoint.OpRead, Buffer: b, Length: n, Remote: remote}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("read back: %s\n", b.Bytes()[:n])
	// A zero-byte message tells the server the region may go.
	if err := oneSided(ctx, ep, endpoint.Request{Op: endpoint.OpSend, Buffer: b}); err != nil {
		fmt.Println(err)
		return
	}
	pool.Put(b)
	fmt.Println("server:", <-served)
	// Output:
	// read back: written by RDMA
	// server saw: written by RDMA
	// server: <nil>
}

// oneSided posts r and waits for its completion.
func oneSided(ctx context.Context, ep *endpoint.Endpoint, r endpoint.Request) error {
	r.Context = r.Op
	if err := ep.PostBatch([]endpoint.Request{r}); err != nil {
		return err
	}
	c, err := ep.Next(ctx)
	if err != nil {
		return err
	}
	if c.Context != r.Op {
		return fmt.Errorf("completion of %v, want %v", c.Context, r.Op)
	}
	return c.Err
}

// serveRegion accepts one connection, exposes a region to it, and waits
// for the client's message that it is done.
func serveRegion(ctx context.Context, l *cm.Listener) error {
	ep, err := l.Accept(ctx)
	if err != nil {
		return err
	}
	defer ep.CloseAndDrain(nil)
	region, err := bufpool.NewRegion(ep.PD(), 4096, bufpool.RemoteRead|bufpool.RemoteWrite)
	if err != nil {
		return err
	}
	defer region.Close()
	pool, err := bufpool.New(ep.PD(), bufpool.Size(64), bufpool.Count(2))
	if err != nil {
		return err
	}
	defer pool.Close()
	done, _ := pool.TryGet()
	if err := ep.PostRecv("done", done); err != nil {
		return err
	}
	desc, _ := pool.TryGet()
	enc, _ := region.Remote().AppendBinary(desc.Bytes()[:0])
	if err := ep.PostSend("descriptor", desc, len(enc)); err != nil {
		return err
	}
	for range 2 { // the descriptor sent, and the client's done
		c, err := ep.Next(ctx)
		if err != nil {
			return err
		}
		if c.Err != nil {
			return c.Err
		}
		pool.Put(c.Buffer)
		if c.Context == "done" {
			fmt.Printf("server saw: %s\n", region.Bytes()[:15])
		}
	}
	return nil
}
