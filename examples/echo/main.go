// Command echo is an RDMA echo server and client over this library.
//
//	echo -mode server -addr 10.0.0.1:7471
//	echo -mode client -addr 10.0.0.1:7471 -size 64 -count 1000
//	echo -mode demo            # both in one process, on $RDMACM_TEST_ADDR
//
// The client sends -count messages of -size bytes one at a time, waits for
// each echo, checks it byte for byte (-verify), and prints a latency summary.
//
// It speaks librdmacm's own example protocol (plain messages, no header), so
// it works with rdma_client and rdma_server from rdmacm-utils:
//
//	echo -mode server -addr 10.0.0.1:7471 &  rdma_client -s 10.0.0.1 -p 7471
//	rdma_server -p 7471 &  echo -mode client -addr 10.0.0.1:7471 -size 16 -count 1 -verify=false
//
// (rdma_server answers one 16-byte message with 16 bytes of its own, then
// disconnects; hence -count 1 and -verify=false.)
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
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/exampleaddr"
	"github.com/go-rdma/rdmacm/internal/flagcheck"
)

func main() {
	mode := flag.String("mode", "demo", "server, client, or demo (both, in one process)")
	addr := flag.String("addr", "", "address to listen on or dial (default $RDMACM_TEST_ADDR:7471)")
	size := flag.Int("size", 64, "message size in bytes")
	count := flag.Int("count", 1000, "messages each client connection sends")
	concurrency := flag.Int("concurrency", 1, "client connections running at once")
	verify := flag.Bool("verify", true, "check every echoed byte")
	flag.Parse()
	address, err := exampleaddr.Or(*addr, "7471")
	err = cmp.Or(flagcheck.AtLeast(flag.CommandLine, 1, "size", "count", "concurrency"), err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch *mode {
	case "server":
		err = serve(ctx, address, *size, nil)
	case "client":
		err = clients(ctx, address, *size, *count, *concurrency, *verify)
	case "demo":
		err = demo(ctx, address, *size, *count, *concurrency, *verify)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil && !errors.Is(err, context.Canceled) { // SIGINT/SIGTERM is a clean stop
		fmt.Fprintf(os.Stderr, "echo: %v\n", err)
		os.Exit(1)
	}
}

func demo(ctx context.Context, addr string, size, count, concurrency int, verify bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan net.Addr, 1)
	served := make(chan error, 1)
	go func() { served <- serve(ctx, addr, size, ready) }()
	select {
	case a := <-ready:
		fmt.Printf("echo server listening on %v\n", a)
	case err := <-served:
		return err
	}
	err := clients(ctx, addr, size, count, concurrency, verify)
	cancel()
	if serr := <-served; serr != nil && !errors.Is(serr, context.Canceled) {
		err = errors.Join(err, serr)
	}
	return err
}

// serve accepts connections one at a time and echoes every message back.
func serve(ctx context.Context, addr string, size int, ready chan<- net.Addr) error {
	l, err := cm.Listen(ctx, addr)
	if err != nil {
		return err
	}
	defer l.Close()
	if ready != nil {
		ready <- l.Addr()
	}
	var conns sync.WaitGroup
	defer conns.Wait() // every connection ends with ctx
	for {
		ep, err := l.Accept(ctx)
		if err != nil {
			return err
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			if err := echoConn(ctx, ep, size); err != nil && !errors.Is(err, endpoint.ErrClosed) && !errors.Is(err, context.Canceled) {
				fmt.Fprintf(os.Stderr, "echo server: connection: %v\n", err)
			}
		}()
	}
}

func echoConn(ctx context.Context, ep *endpoint.Endpoint, size int) error {
	const depth = 16
	pool, err := bufpool.New(ep.PD(), bufpool.Size(size), bufpool.Count(depth))
	if err != nil {
		ep.CloseAndDrain(nil)
		return err
	}
	defer func() { // close, take every buffer back, then free the pool
		ep.CloseAndDrain(func(c endpoint.Completion) { pool.Put(c.Buffer) })
		pool.Close()
	}()
	for range depth {
		b, _ := pool.TryGet()
		if err := ep.PostRecv(nil, b); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ep.Done():
			return nil // the client left
		case c := <-ep.Completions():
			if c.Err != nil {
				pool.Put(c.Buffer)
				return c.Err
			}
			switch c.Op {
			case endpoint.OpRecv: // echo the message from the buffer it arrived in
				err = ep.PostSend(nil, c.Buffer, c.Len)
			case endpoint.OpSend: // the echo left: the buffer receives again
				err = ep.PostRecv(nil, c.Buffer)
			}
			if err != nil {
				pool.Put(c.Buffer) // a refused post leaves the buffer with us
				if errors.Is(err, endpoint.ErrClosed) {
					return nil // the client left between the completion and the post
				}
				return err
			}
		}
	}
}

// clients runs concurrency client connections at once and prints one
// summary of all their round trips.
func clients(ctx context.Context, addr string, size, count, concurrency int, verify bool) error {
	rtts := make([][]time.Duration, concurrency)
	errs := make([]error, concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rtts[i], errs[i] = client(ctx, addr, size, count, verify)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	all := slices.Concat(rtts...)
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		return all[min(len(all)-1, int(p*float64(len(all))))].Round(time.Microsecond)
	}
	checked := "verified byte for byte"
	if !verify {
		checked = "not verified (-verify=false)"
	}
	fmt.Printf("echo client: %d x %d messages of %d B to %s in %v, %s\n",
		concurrency, count, size, addr, elapsed.Round(time.Millisecond), checked)
	fmt.Printf("echo client: round trip p50 %v, p99 %v, max %v; %.0f round trips/s, %.2f MB/s each way\n",
		pct(0.50), pct(0.99), all[len(all)-1].Round(time.Microsecond),
		float64(len(all))/elapsed.Seconds(), float64(len(all)*size)/elapsed.Seconds()/1e6)
	return nil
}

// client sends count messages one at a time on one connection, waiting for
// each echo, and returns the round-trip times.
func client(ctx context.Context, addr string, size, count int, verify bool) ([]time.Duration, error) {
	ep, err := cm.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	pool, err := bufpool.New(ep.PD(), bufpool.Size(size), bufpool.Count(2))
	if err != nil {
		ep.CloseAndDrain(nil)
		return nil, err
	}
	send, _ := pool.TryGet()
	recv, _ := pool.TryGet()
	defer func() { // the QP first, so the device is done with the buffers
		ep.CloseAndDrain(nil)
		pool.Put(send)
		pool.Put(recv)
		pool.Close()
	}()
	rtts := make([]time.Duration, 0, count)
	for i := range count {
		for j := range send.Bytes() {
			send.Bytes()[j] = byte(i + j)
		}
		if err := ep.PostRecv(nil, recv); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := ep.PostSend(nil, send, size); err != nil {
			return nil, err
		}
		for got := 0; got < 2; got++ {
			select {
			case c := <-ep.Completions():
				if c.Err != nil {
					return nil, fmt.Errorf("message %d: %w", i, c.Err)
				}
				if c.Op == endpoint.OpRecv {
					rtts = append(rtts, time.Since(t0))
					if c.Len != size {
						return nil, fmt.Errorf("message %d: echo of %d bytes, sent %d", i, c.Len, size)
					}
					if verify && string(recv.Bytes()[:size]) != string(send.Bytes()[:size]) {
						return nil, fmt.Errorf("message %d: echo differs from what was sent", i)
					}
				}
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return rtts, nil
}
