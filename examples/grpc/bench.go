package main

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/go-rdma/rdmacm/examples/grpc/echopb"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// bench runs the same load over rdmanet and over TCP on the same host, in
// turn, and prints one line for each: the same gRPC code, only the
// transport differs. The first calls of each warm the connection up.
func bench(ctx context.Context, addr string, load load) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	transports := []struct {
		name   string
		listen func() (net.Listener, error)
		dial   grpc.DialOption
	}{
		{"rdmanet",
			func() (net.Listener, error) { return rdmanet.Listen(ctx, net.JoinHostPort(host, "0")) },
			grpc.WithContextDialer(dialRdmanet)},
		{"tcp",
			func() (net.Listener, error) { return net.Listen("tcp", net.JoinHostPort(host, "0")) },
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			})},
	}
	for _, tr := range transports {
		r, err := benchOne(ctx, tr.listen, tr.dial, load)
		if err != nil {
			return fmt.Errorf("%s: %w", tr.name, err)
		}
		fmt.Printf("grpc over %s, %d B, %d callers: %v\n", tr.name, load.size, load.callers, r)
	}
	return nil
}

func benchOne(ctx context.Context, listen func() (net.Listener, error), dial grpc.DialOption, l load) (result, error) {
	ln, err := listen()
	if err != nil {
		return result{}, err
	}
	s := newServer()
	go s.Serve(ln)
	defer s.Stop()
	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), dial)
	if err != nil {
		return result{}, err
	}
	defer cc.Close()
	c := echopb.NewClient(cc)
	warm := load{size: l.size, count: min(l.count, 100), callers: l.callers}
	if _, err := warm.run(ctx, c); err != nil {
		return result{}, err
	}
	return l.run(ctx, c)
}
