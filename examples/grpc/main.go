// Command grpc is a grpc-go server and client whose connections are RDMA:
// package rdmanet's listener and dialer, plugged into grpc's own hooks
// (grpc.Server.Serve takes a net.Listener; grpc.WithContextDialer a dial
// function). Nothing else in the gRPC code changes.
//
//	grpc -mode server -addr 10.0.0.1:7473
//	grpc -mode client -addr 10.0.0.1:7473 -size 64 -count 1000
//	grpc -mode demo     # both in one process, on $RDMACM_TEST_ADDR
//	grpc -mode bench    # unary calls/s and latency, over rdmanet and over TCP (-json: as JSON)
//
// The client makes -count unary Echo calls from -callers goroutines, then
// streams -count messages through one Stream call, checking every byte.
//
// It is a module of its own, so that the library's go.mod does not require
// grpc; its go.mod points at the library in this repository.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/go-rdma/rdmacm/examples/grpc/echopb"
	"github.com/go-rdma/rdmacm/internal/exampleaddr"
	"github.com/go-rdma/rdmacm/internal/flagcheck"
	"github.com/go-rdma/rdmacm/rdmanet"
)

func main() {
	mode := flag.String("mode", "demo", "server, client, demo (both, in one process) or bench")
	addr := flag.String("addr", "", "address to listen on or dial (default $RDMACM_TEST_ADDR:7473)")
	size := flag.Int("size", 64, "message size in bytes")
	count := flag.Int("count", 1000, "unary calls, then stream messages, the client makes")
	callers := flag.Int("callers", 1, "goroutines making the unary calls")
	asJSON := flag.Bool("json", false, "bench: print one JSON object per transport")
	flag.Parse()
	address, err := exampleaddr.Or(*addr, "7473")
	err = cmp.Or(flagcheck.AtLeast(flag.CommandLine, 0, "size"),
		flagcheck.AtLeast(flag.CommandLine, 1, "count", "callers"), err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	load := load{size: *size, count: *count, callers: *callers}
	switch *mode {
	case "server":
		err = serve(ctx, address)
	case "client":
		err = client(ctx, address, load)
	case "demo":
		err = demo(ctx, address, load)
	case "bench":
		err = bench(ctx, os.Stdout, address, load, *asJSON)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil && !errors.Is(err, context.Canceled) { // SIGINT/SIGTERM is a clean stop
		fmt.Fprintf(os.Stderr, "grpc: %v\n", err)
		os.Exit(1)
	}
}

// newServer is a gRPC server of the Echo service.
func newServer() *grpc.Server {
	s := grpc.NewServer()
	echopb.Register(s, echoServer{})
	return s
}

// rdmanetClientConn is a gRPC client connection whose transport is rdmanet.
func rdmanetClientConn(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialRdmanet))
}

// dialRdmanet is grpc.WithContextDialer's dial function: an rdmanet
// connection to addr.
func dialRdmanet(ctx context.Context, addr string) (net.Conn, error) { return rdmanet.Dial(ctx, addr) }

// serve serves gRPC on an rdmanet listener until ctx ends.
func serve(ctx context.Context, addr string) error {
	l, err := rdmanet.Listen(ctx, addr)
	if err != nil {
		return err
	}
	fmt.Printf("grpc: serving on %v\n", l.Addr())
	return serveUntil(ctx, newServer(), l)
}

// serveUntil serves on l until ctx ends, then stops gracefully.
func serveUntil(ctx context.Context, s *grpc.Server, l net.Listener) error {
	stop := context.AfterFunc(ctx, s.GracefulStop)
	defer stop()
	err := s.Serve(l)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func client(ctx context.Context, addr string, load load) error {
	cc, err := rdmanetClientConn(addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	r, err := load.run(ctx, echopb.NewClient(cc))
	if err != nil {
		return err
	}
	fmt.Println("grpc client:", r)
	return nil
}

func demo(ctx context.Context, addr string, load load) error {
	l, err := rdmanet.Listen(ctx, addr)
	if err != nil {
		return err
	}
	s := newServer()
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	err = client(ctx, l.Addr().String(), load)
	s.GracefulStop()
	return errors.Join(err, <-served)
}
