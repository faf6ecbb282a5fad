package cm_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/cm"
)

// Listen, accept one connection, and close it. (Examples need an RDMA
// device, so they are compiled, not run, by go test; run them under
// bin/rxevm.)
func ExampleListen() {
	ctx := context.Background()
	l, err := cm.Listen(ctx, "10.77.0.1:7471", cm.WithQueueDepth(64))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	ep, err := l.Accept(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		ep.CloseAndDrain(nil)
	}()
	fmt.Println("accepted; connection ends:", <-ep.Done())
}

// Dial with a deadline, and tell a refused connection from other errors.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ep, err := cm.Dial(ctx, "10.77.0.1:7471", cm.WithPrivateData([]byte("hello")))
	var rej *cm.RejectError
	switch {
	case errors.As(err, &rej):
		fmt.Printf("refused, the server said %q\n", rej.PrivateData)
		return
	case errors.Is(err, syscall.ECONNREFUSED), err != nil:
		fmt.Println(err)
		return
	}
	defer func() {
		ep.CloseAndDrain(nil)
	}()
	fmt.Println("connected")
}

// Accept or reject by the dialer's private data.
func ExampleListener_AcceptRequest() {
	ctx := context.Background()
	l, err := cm.Listen(ctx, "10.77.0.1:7471")
	if err != nil {
		return
	}
	defer l.Close()
	req, err := l.AcceptRequest(ctx)
	if err != nil {
		return
	}
	if string(req.PrivateData()[:5]) != "hello" {
		req.Reject([]byte("unknown client"))
		return
	}
	ep, err := req.Accept(ctx, cm.WithPrivateData([]byte("welcome")))
	if err == nil {
		ep.CloseAndDrain(nil)
	}
}
