// Command rpc is a small RPC service over this library's msg package, and a
// load-generating client.
//
//	rpc -mode server -addr 10.0.0.1:7472
//	rpc -mode client -addr 10.0.0.1:7472 -callers 32 -calls 500
//	rpc -mode demo        # both in one process, on $RDMACM_TEST_ADDR
//
// Methods: echo (returns its request), sum (adds little-endian uint64s),
// kv.put and kv.get (an in-memory key-value store), and blob.put (takes a
// large upload, which travels by rendezvous, and returns its SHA-256). The
// server takes requests of at most 64 MiB (-max-request): a client's call
// with a larger one fails at once with msg.ErrTooLarge.
package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/internal/exampleaddr"
	"github.com/go-rdma/rdmacm/internal/flagcheck"
	"github.com/go-rdma/rdmacm/msg"
)

func main() {
	mode := flag.String("mode", "demo", "server, client, or demo (both, in one process)")
	addr := flag.String("addr", "", "address to listen on or dial (default $RDMACM_TEST_ADDR:7472)")
	callers := flag.Int("callers", 32, "concurrent callers")
	calls := flag.Int("calls", 500, "calls per caller")
	blob := flag.Int("blob", 8<<20, "bytes of the blob.put upload")
	metrics := flag.String("metrics", "", "server and demo: serve the server's counters at http://`host:port`/metrics (Prometheus)")
	maxRequest := flag.Int("max-request", 64<<20, "server and demo: the largest request, in bytes, a client may send (at most 2 GiB)")
	flag.Parse()
	address, err := exampleaddr.Or(*addr, "7472")
	err = cmp.Or(flagcheck.AtLeast(flag.CommandLine, 1, "callers", "calls", "blob", "max-request"), err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rpc:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch *mode {
	case "server":
		err = serve(ctx, address, *metrics, *maxRequest, nil)
	case "client":
		err = load(ctx, address, *callers, *calls, *blob)
	case "demo":
		err = demo(ctx, address, *metrics, *maxRequest, *callers, *calls, *blob)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, msg.ErrShutdown) {
		fmt.Fprintf(os.Stderr, "rpc: %v\n", err)
		os.Exit(1)
	}
}

// store is the kv service's memory.
type store struct {
	mu sync.Mutex
	m  map[string][]byte
}

// methods registers the service's methods on a Mux. Errors carry codes
// the client matches with errors.Is.
func (s *store) methods() (*msg.Mux, error) {
	var mux msg.Mux
	for name, f := range map[string]msg.MethodFunc{
		"echo":     func(ctx context.Context, req []byte) ([]byte, error) { return req, nil },
		"sum":      sum,
		"kv.put":   s.put,
		"kv.get":   s.get,
		"blob.put": func(ctx context.Context, req []byte) ([]byte, error) { d := sha256.Sum256(req); return d[:], nil },
	} {
		if err := mux.Handle(name, f); err != nil {
			return nil, err
		}
	}
	return &mux, nil
}

func sum(ctx context.Context, req []byte) ([]byte, error) {
	if len(req)%8 != 0 {
		return nil, fmt.Errorf("sum takes little-endian uint64s, got %d bytes: %w", len(req), msg.CodeInvalidArgument)
	}
	var total uint64
	for i := 0; i < len(req); i += 8 {
		total += binary.LittleEndian.Uint64(req[i:])
	}
	return binary.LittleEndian.AppendUint64(nil, total), nil
}

func (s *store) put(ctx context.Context, req []byte) ([]byte, error) {
	if len(req) < 1 || len(req) < 1+int(req[0]) {
		return nil, fmt.Errorf("kv.put takes a key length byte, the key, then the value: %w", msg.CodeInvalidArgument)
	}
	key, val := string(req[1:1+req[0]]), req[1+req[0]:] // req is the handler's to keep
	s.mu.Lock()
	s.m[key] = val
	s.mu.Unlock()
	return nil, nil
}

func (s *store) get(ctx context.Context, req []byte) ([]byte, error) {
	s.mu.Lock()
	v, ok := s.m[string(req)]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no key %q: %w", req, msg.CodeNotFound)
	}
	return v, nil
}

// serve serves the service on addr until ctx ends, and its counters on
// metricsAddr unless that is empty. ready gets the address it listens on.
func serve(ctx context.Context, addr, metricsAddr string, maxRequest int, ready chan<- string) error {
	// A request is read into memory registered for it: the bound keeps
	// what one client can make the server pin (msg.WithMaxRecvSize).
	l, err := msg.Listen(ctx, addr, msg.WithMaxRecvSize(maxRequest))
	if err != nil {
		return err
	}
	st := &store{m: map[string][]byte{}}
	mux, err := st.methods()
	if err != nil {
		l.Close()
		return err
	}
	srv := msg.NewServer(mux.Serve)
	metricsDone := make(chan error, 1)
	if metricsAddr != "" {
		mctx, stop := context.WithCancel(ctx)
		defer func() { stop(); <-metricsDone }()
		mready := make(chan string, 1)
		go func() { metricsDone <- serveMetrics(mctx, metricsAddr, srv, mready) }()
		select {
		case a := <-mready:
			fmt.Printf("rpc metrics at http://%s/metrics\n", a)
		case err := <-metricsDone:
			metricsDone <- nil
			l.Close()
			return fmt.Errorf("metrics: %w", err)
		}
	}
	if ready != nil {
		ready <- l.Addr().String()
	}
	return serveUntil(ctx, func() error { return srv.Serve(ctx, l) }, srv.Shutdown)
}

// serveUntil runs serve until it fails or ctx ends, then shuts it down
// (waiting at most 5 s for what is in progress) and waits for it to return.
// The error serve returns after a shutdown is not one.
func serveUntil(ctx context.Context, serve func() error, shutdown func(context.Context) error) error {
	served := make(chan error, 1)
	go func() { served <- serve() }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := shutdown(shutCtx)
	<-served
	return err
}

func demo(ctx context.Context, addr, metricsAddr string, maxRequest, callers, calls, blob int) error {
	ctx, cancel := context.WithCancel(ctx)
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- serve(ctx, addr, metricsAddr, maxRequest, ready) }()
	select {
	case a := <-ready:
		fmt.Printf("rpc server listening on %s\n", a)
	case err := <-served:
		cancel()
		return err
	}
	err := load(ctx, addr, callers, calls, blob)
	cancel()
	if serr := <-served; serr != nil {
		err = errors.Join(err, serr)
	}
	return err
}

// load runs callers x calls echo/sum calls, checking every result, then the
// kv and blob methods, and prints what happened.
func load(ctx context.Context, addr string, callers, calls, blob int) error {
	cl, err := msg.DialClient(ctx, addr)
	if err != nil {
		return err
	}
	defer cl.Close()

	lat := make([][]time.Duration, callers)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				a, b := uint64(c), uint64(i)
				req := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, a), b)
				t0 := time.Now()
				resp, err := cl.Call(ctx, "sum", req)
				lat[c] = append(lat[c], time.Since(t0))
				if err != nil {
					errs <- err
					return
				}
				if got := binary.LittleEndian.Uint64(resp); got != a+b {
					errs <- fmt.Errorf("sum(%d, %d) = %d", a, b, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		return all[min(len(all)-1, int(p*float64(len(all))))].Round(time.Microsecond)
	}
	fmt.Printf("rpc client: %d callers x %d sum calls, every result checked: %.0f calls/s\n",
		callers, calls, float64(len(all))/elapsed.Seconds())
	fmt.Printf("rpc client: latency p50 %v, p99 %v, p99.9 %v\n", pct(0.50), pct(0.99), pct(0.999))

	if _, err := cl.Call(ctx, "kv.put", append([]byte{5}, "hello world"...)); err != nil {
		return err
	}
	v, err := cl.Call(ctx, "kv.get", []byte("hello"))
	if err != nil || string(v) != " world" {
		return fmt.Errorf("kv.get(hello) = %q, %v", v, err)
	}
	if _, err := cl.Call(ctx, "kv.get", []byte("absent")); !errors.Is(err, msg.CodeNotFound) {
		return fmt.Errorf("kv.get of a missing key: %v, want an error with CodeNotFound", err)
	} else {
		fmt.Printf("rpc client: kv.put/kv.get round trip ok; a missing key gives: %v\n", err)
	}

	return putBlob(ctx, cl, blob)
}

// putBlob uploads n bytes with blob.put the way a service moves bulk data:
// from a region registered in the connection's protection domain and lent
// to the call (CallRegion), which the server reads with RDMA READ, with no
// copy on this side. The time printed is the call's, and the call includes
// the server's SHA-256 of the blob, so this side's hash of the same bytes
// is timed and printed beside it.
func putBlob(ctx context.Context, cl *msg.Client, n int) error {
	region, err := bufpool.NewRegion(cl.PD(), n, bufpool.RemoteRead)
	if err != nil {
		return err
	}
	defer region.Close()
	data := region.Bytes()[:n]
	for i := range data {
		data[i] = byte(i * 31)
	}
	t0 := time.Now()
	want := sha256.Sum256(data)
	hashed := time.Since(t0)
	t0 = time.Now()
	sum, err := cl.CallRegion(ctx, "blob.put", region, n)
	if err != nil {
		return err
	}
	d := time.Since(t0)
	if string(sum) != string(want[:]) {
		return errors.New("blob.put: the server's SHA-256 differs")
	}
	fmt.Printf("rpc client: blob.put of %.1f MiB lent from a registered region (CallRegion) in %v, SHA-256 matches;\n",
		float64(n)/(1<<20), d.Round(time.Millisecond))
	fmt.Printf("rpc client: that includes the server's SHA-256 of it, which took %v on this side\n",
		hashed.Round(time.Millisecond))
	return nil
}
