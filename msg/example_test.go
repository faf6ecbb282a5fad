package msg_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/msg"
)

// Messages over one connection: a server that answers every message in
// upper case, and a client. Listen and Dial take the address of an
// RDMA-capable interface (here the testbed's, in RDMACM_TEST_ADDR).
func ExampleConn() {
	ctx := context.Background()
	l, err := msg.Listen(ctx, net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	served := make(chan error, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		for {
			m, err := c.Recv(ctx)
			if err != nil { // the client closed
				served <- nil
				return
			}
			if err := c.Send(ctx, bytes.ToUpper(m)); err != nil {
				served <- err
				return
			}
		}
	}()

	c, err := msg.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, word := range []string{"hello", "rdma"} {
		if err := c.Send(ctx, []byte(word)); err != nil {
			fmt.Println(err)
			return
		}
		reply, err := c.Recv(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(string(reply))
	}
	if err := c.Close(); err != nil {
		fmt.Println(err)
	}
	fmt.Println("server:", <-served)
	// Output:
	// HELLO
	// RDMA
	// server: <nil>
}

// Request and response: a Server answers each call with the method a Mux
// routes it to, concurrently; a handler's error reaches the caller as a
// *RemoteError whose Code errors.Is matches.
func ExampleServer() {
	ctx := context.Background()
	l, err := msg.Listen(ctx, net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	var mux msg.Mux
	err = mux.Handle("upper", func(ctx context.Context, req []byte) ([]byte, error) {
		if len(req) == 0 {
			return nil, fmt.Errorf("nothing to upper-case: %w", msg.CodeInvalidArgument)
		}
		return bytes.ToUpper(req), nil // req is the handler's to keep
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := msg.NewServer(mux.Serve)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }() // Serve owns l

	cl, err := msg.DialClient(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := cl.Call(ctx, "upper", []byte("call"))
	fmt.Println(string(resp), err)
	_, err = cl.Call(ctx, "upper", nil)
	fmt.Println(errors.Is(err, msg.CodeInvalidArgument))
	_, err = cl.Call(ctx, "lower", []byte("call"))
	fmt.Println(errors.Is(err, msg.CodeUnimplemented), err)

	if err := cl.Close(); err != nil {
		fmt.Println(err)
	}
	fmt.Println(srv.Shutdown(ctx), errors.Is(<-served, msg.ErrShutdown))
	// Output:
	// CALL <nil>
	// true
	// true msg: lower: remote error (unimplemented): no method "lower": msg: unimplemented
	// <nil> true
}

// A server that bounds what its clients may send: a message above the
// bound would be read into memory registered for it, so the Listener says
// how much it takes, and a client's larger Send fails at once, with the
// connection still up.
func ExampleWithMaxRecvSize() {
	ctx := context.Background()
	l, err := msg.Listen(ctx, net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0"), msg.WithMaxRecvSize(1<<20))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	received := make(chan int, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			received <- -1
			return
		}
		m, err := c.Recv(ctx)
		c.Close() // the client's Send returns once its message is read
		if err != nil {
			received <- -1
			return
		}
		received <- len(m)
	}()

	c, err := msg.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	err = c.Send(ctx, make([]byte, 2<<20))
	fmt.Println(errors.Is(err, msg.ErrTooLarge), err)
	fmt.Println(c.Send(ctx, make([]byte, 1<<20)))
	c.Close()
	fmt.Println(<-received)
	// Output:
	// true msg: message too large: 2097152 bytes, more than the 1048576 the peer receives
	// <nil>
	// 1048576
}

// A handler that answers from memory the server registered once: the
// server's connections share one protection domain (cm.WithPD), the
// region lives in it, and Respond lends it, so the caller reads the 1 MiB
// response straight from it, with no copy on the server.
func ExampleRespond() {
	ctx := context.Background()
	addr := os.Getenv("RDMACM_TEST_ADDR")
	pd, err := bufpool.OpenPD(ctx, addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pd.Close() // after the region, which is closed first
	blob, err := bufpool.NewRegion(pd, 1<<20, bufpool.RemoteRead)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer blob.Close() // after the server's Shutdown
	copy(blob.Bytes(), "the blob")

	l, err := msg.Listen(ctx, net.JoinHostPort(addr, "0"), msg.WithCMOptions(cm.WithPD(pd)))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := msg.NewServer(func(ctx context.Context, method string, req []byte) ([]byte, error) {
		// Respond returns once the caller's side has read the region.
		return nil, msg.Respond(ctx, blob, len(blob.Bytes()))
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()

	cl, err := msg.DialClient(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := cl.Call(ctx, "blob", nil)
	fmt.Println(len(resp), string(resp[:8]), err)

	if err := cl.Close(); err != nil {
		fmt.Println(err)
	}
	fmt.Println(srv.Shutdown(ctx), errors.Is(<-served, msg.ErrShutdown))
	// Output:
	// 1048576 the blob <nil>
	// <nil> true
}
