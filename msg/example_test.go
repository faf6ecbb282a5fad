package msg_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"

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

// Request and response: a Server answers each call with its Handler,
// concurrently; a handler's error reaches the caller as a *RemoteError.
func ExampleServer() {
	ctx := context.Background()
	l, err := msg.Listen(ctx, net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := msg.NewServer(func(ctx context.Context, method string, req []byte) ([]byte, error) {
		if method == "upper" {
			return bytes.ToUpper(req), nil // req is the handler's to keep
		}
		return nil, fmt.Errorf("no method %q", method)
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }() // Serve owns l

	cl, err := msg.DialClient(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := cl.Call(ctx, "upper", []byte("call"))
	fmt.Println(string(resp), err)
	_, err = cl.Call(ctx, "lower", []byte("call"))
	var remote *msg.RemoteError
	fmt.Println(errors.As(err, &remote), remote.Msg)

	if err := cl.Close(); err != nil {
		fmt.Println(err)
	}
	fmt.Println(srv.Shutdown(ctx), errors.Is(<-served, msg.ErrShutdown))
	// Output:
	// CALL <nil>
	// true no method "lower"
	// <nil> true
}
