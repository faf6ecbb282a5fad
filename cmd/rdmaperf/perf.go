package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/msg"
)

// serverRecvs is how many receives the server keeps posted (perftest's
// default rx depth is 512).
const serverRecvs = 512

// peer is one side's connection plus the descriptor receive every test
// posts before connecting, so the peer may send its region's Remote at once.
type peer struct {
	ep   *endpoint.Endpoint
	desc *bufpool.Buffer
	pool *bufpool.Pool
}

// connOptions are the connection's options, on both sides. The RNR retry
// and timer are perftest's (retry for ever, 0.64 ms apart), not the
// library's bounded defaults, so that a receiver falling behind costs both
// the same.
func (c config) connOptions(recvDepth int) []cm.Option {
	return []cm.Option{cm.WithSendDepth(c.depth + 1), cm.WithRecvDepth(recvDepth),
		c.polling(), cm.WithReadDepth(c.reads),
		cm.WithRNRRetry(7), cm.WithRNRTimer(640 * time.Microsecond)}
}

// polling is -poll, with -spin when it is hybrid (a spin is hybrid
// polling's only).
func (c config) polling() cm.Option {
	if c.poll == endpoint.PollHybrid {
		return cm.WithPolling(c.poll, c.spin)
	}
	return cm.WithPolling(c.poll, 0)
}

// setup posts p's descriptor receive before the connection is made.
func (p *peer) setup() cm.HandshakeOption {
	return cm.WithSetup(func(ep *endpoint.Endpoint) error {
		var err error
		if p.pool, err = bufpool.New(ep.PD(), bufpool.Size(64), bufpool.Count(2)); err != nil {
			return err
		}
		p.desc, _ = p.pool.TryGet()
		return ep.PostRecv("desc", p.desc)
	})
}

// close ends the connection and frees the descriptor pool: the
// descriptor buffer comes back from CloseAndDrain if its receive was still
// posted, and from the Put otherwise (the other one is refused, harmlessly).
func (p *peer) close() {
	p.ep.CloseAndDrain(nil)
	p.pool.Put(p.desc)
	p.pool.Close()
}

// exchange sends mine (the zero Remote when this side exposes nothing) and
// returns the peer's: both sides do it first, so that each descriptor
// receive posted at setup is used before the test's own traffic. The
// dialer speaks first: the accepting side sends its descriptor once the
// dialer's has come (on iWARP it must not send sooner; see
// cm.Request.Accept).
func (p *peer) exchange(mine bufpool.Remote, dialer bool) (bufpool.Remote, error) {
	var theirs bufpool.Remote
	b, _ := p.pool.TryGet()
	defer p.pool.Put(b)
	enc, _ := mine.AppendBinary(b.Bytes()[:0])
	send := func() error { return p.ep.PostSend("desc-send", b, len(enc)) }
	if dialer {
		if err := send(); err != nil {
			return theirs, err
		}
	}
	sent, got := false, false
	for c := range p.ep.Completions() {
		if c.Err != nil {
			return theirs, c.Err
		}
		switch c.Context {
		case "desc-send":
			sent = true
		case "desc":
			if err := theirs.UnmarshalBinary(p.desc.Bytes()[:c.Len]); err != nil {
				return theirs, err
			}
			got = true
			if !dialer {
				if err := send(); err != nil {
					return theirs, err
				}
			}
		}
		if sent && got {
			return theirs, nil
		}
	}
	return theirs, endpoint.ErrClosed
}

// testRegion is the region a side exposes for cfg.test, or nil.
func testRegion(p *peer, cfg config, client bool) (*bufpool.Region, bufpool.Remote, error) {
	need := cfg.test == "write_lat" ||
		!client && (cfg.test == "write_bw" || cfg.test == "read_bw" || cfg.test == "read_lat" || cfg.test == "write_imm_bw")
	if !need {
		return nil, bufpool.Remote{}, nil
	}
	region, err := bufpool.NewRegion(p.ep.PD(), max(cfg.size, 8), bufpool.RemoteRead|bufpool.RemoteWrite)
	if err != nil {
		return nil, bufpool.Remote{}, err
	}
	return region, region.Remote(), nil
}

// serve accepts one connection and plays the passive side of cfg.test.
func serve(ctx context.Context, cfg config) error {
	switch cfg.test {
	case "rpc":
		return serveRPC(ctx, cfg)
	case "stream_bw", "stream_lat":
		return serveStream(ctx, cfg)
	case "rendezvous":
		return serveRendezvous(ctx, cfg)
	case "ud_bw":
		return serveUD(ctx, cfg)
	case "connect":
		return serveConnect(ctx, cfg)
	}
	l, err := cm.Listen(ctx, cfg.addr)
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("ready")
	switch cfg.test {
	case "write_bw", "read_bw", "read_lat":
		// The passive side of a one-sided test has nothing to poll for
		// (perftest's sleeps): spinning would only take a CPU from the
		// client and from rxe's work in the kernel.
		cfg.poll = endpoint.PollEvent
	}
	var p peer
	opts := []cm.AcceptOption{p.setup()}
	for _, o := range cfg.connOptions(serverRecvs + 1) {
		opts = append(opts, o)
	}
	p.ep, err = l.Accept(ctx, opts...)
	if err != nil {
		return err
	}
	defer p.close()
	region, mine, err := testRegion(&p, cfg, false)
	if err != nil {
		return err
	}
	if region != nil {
		defer region.Close()
	}
	// Receives are posted before the exchange, which the client waits
	// for: its first message must not find the queue empty (an RNR NAK
	// and its retry timer would land in the measurement).
	var recv *receiver
	switch cfg.test {
	case "send_bw", "send_lat":
		recv, err = postReceives(&p, cfg.size, cfg.test == "send_lat")
	case "write_imm_bw":
		recv, err = postReceives(&p, 64, false) // the receive only carries the immediate
	}
	if err != nil {
		return err
	}
	if recv != nil {
		defer recv.pool.Close()
	}
	theirs, err := p.exchange(mine, false)
	if err != nil {
		return err
	}
	switch cfg.test {
	case "send_bw", "send_lat", "write_imm_bw":
		return recv.serve(ctx)
	case "write_bw", "read_bw", "read_lat":
		<-p.ep.Done() // the client is done when it disconnects
		return nil
	case "write_lat":
		return writeLatency(ctx, &p, cfg, false, region, theirs, nil)
	}
	return fmt.Errorf("unknown test %q", cfg.test)
}

// receiver keeps serverRecvs receives posted. For bandwidth they all
// point at one buffer, as perftest's do (the data is not looked at), and
// are reposted in batches; with echo (send_lat) each has its own buffer
// and every message is answered with one of the same size.
type receiver struct {
	p     *peer
	pool  *bufpool.Pool
	size  int
	reply *bufpool.Buffer // echo only
	batch []endpoint.Request
}

// repostBatch bounds the receives reposted (and, with echo, the replies
// posted) in one call. It must stay well below serverRecvs: receives taken
// but not yet reposted are missing from the queue, and a message that finds
// it empty is refused (RNR); rxe then drops the packets behind it and
// resends them only after the QP's timeout, stalling the run for ~0.7 s.
// The replies share the send queue (cfg.depth+1 deep).
const repostBatch = 32

// postReceives posts the first serverRecvs receives.
func postReceives(p *peer, size int, echo bool) (*receiver, error) {
	count := 1
	if echo {
		count = serverRecvs + 1
	}
	pool, err := bufpool.New(p.ep.PD(), bufpool.Size(size), bufpool.Count(count))
	if err != nil {
		return nil, err
	}
	r := &receiver{p: p, pool: pool, size: size, batch: make([]endpoint.Request, 0, serverRecvs)}
	shared, _ := pool.TryGet()
	if echo {
		r.reply = shared
	}
	for range serverRecvs {
		b := shared
		if echo {
			b, _ = pool.TryGet()
		}
		r.batch = append(r.batch, endpoint.Request{Op: endpoint.OpRecv, Buffer: b, Length: size})
	}
	if err := p.ep.PostBatch(r.batch); err != nil {
		pool.Close()
		return nil, err
	}
	return r, nil
}

// serve answers (echo) and reposts until the client leaves. What is ready
// goes back in one call: the receives reposted, then the replies.
func (r *receiver) serve(ctx context.Context) error {
	ep := r.p.ep
	ctx, cancel := untilDone(ctx, ep) // the client left: close drains the rest
	defer cancel()
	limit := repostBatch
	var reply endpoint.Request
	if r.reply != nil {
		limit = 2 * repostBatch
		reply = endpoint.Request{Op: endpoint.OpSend, Buffer: r.reply, Flags: endpoint.Silent}
	}
	for {
		batch := r.batch[:0]
		c, err := ep.Next(ctx)
		if err != nil {
			return nil
		}
		for { // take what else is ready
			if c.Err == nil && (c.Op == endpoint.OpRecv || c.Op == endpoint.OpRecvWriteImm) {
				batch = append(batch, endpoint.Request{Op: endpoint.OpRecv, Buffer: c.Buffer, Length: r.size})
				if r.reply != nil {
					reply.Length = c.Len
					batch = append(batch, reply)
				}
			}
			if len(batch)+2 > limit {
				break
			}
			select {
			case c = <-ep.Completions():
				continue
			default:
			}
			break
		}
		if err := ep.PostBatch(batch); err != nil && !errors.Is(err, endpoint.ErrClosed) {
			return err
		}
	}
}

// untilDone is ctx, also cancelled when the endpoint's connection ends
// (for loops on Next, which would otherwise wait for completions that
// will never come).
func untilDone(ctx context.Context, ep *endpoint.Endpoint) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-ep.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// runClient connects and measures cfg.test.
func runClient(ctx context.Context, cfg config) (result, error) {
	switch cfg.test {
	case "rpc":
		return rpcClient(ctx, cfg)
	case "stream_bw", "stream_lat":
		return streamClient(ctx, cfg)
	case "rendezvous":
		return rendezvousClient(ctx, cfg)
	case "ud_bw":
		return udClient(ctx, cfg)
	case "connect":
		return connectClient(ctx, cfg)
	}
	var p peer
	var err error
	opts := []cm.DialOption{p.setup()}
	for _, o := range cfg.connOptions(2) {
		opts = append(opts, o)
	}
	p.ep, err = cm.Dial(ctx, cfg.addr, opts...)
	if err != nil {
		return result{}, err
	}
	defer p.close()
	region, mine, err := testRegion(&p, cfg, true)
	if err != nil {
		return result{}, err
	}
	if region != nil {
		defer region.Close()
	}
	remote, err := p.exchange(mine, true)
	if err != nil {
		return result{}, err
	}
	r := result{Test: cfg.test, Size: cfg.size, Iters: cfg.iters}
	switch cfg.test {
	case "send_bw", "write_bw", "read_bw", "write_imm_bw":
		err = bandwidth(ctx, &p, cfg, remote, &r)
	case "send_lat", "read_lat":
		err = latency(ctx, &p, cfg, remote, &r)
	case "write_lat":
		err = writeLatency(ctx, &p, cfg, true, region, remote, &r)
	default:
		err = fmt.Errorf("unknown test %q", cfg.test)
	}
	return r, err
}

// bandwidth keeps cfg.depth work requests in flight, posting them in
// batches of -batch (64) in one call, all but the last of a batch silent
// (unsignaled, and no Completion to take): as perftest's cq_mod, one
// completion stands for a batch.
func bandwidth(ctx context.Context, p *peer, cfg config, remote bufpool.Remote, r *result) error {
	pool, err := bufpool.New(p.ep.PD(), bufpool.Size(cfg.size), bufpool.Count(1))
	if err != nil {
		return err
	}
	defer pool.Close()
	buf, _ := pool.TryGet()
	defer pool.Put(buf)
	op := map[string]endpoint.Op{"send_bw": endpoint.OpSend, "write_bw": endpoint.OpWrite,
		"read_bw": endpoint.OpRead, "write_imm_bw": endpoint.OpWrite}[cfg.test]
	batch := max(1, min(cfg.batch, cfg.depth/2))
	// A batch's sends and writes but the last are Silent: one completion
	// stands for the batch. Reads are only Unsignaled (a read's completion
	// says its data has arrived, so the library delivers each), and each
	// comes back with the batch's signaled one.
	perCompletion := batch
	if op == endpoint.OpRead {
		perCompletion = 1
	}
	reqs := make([]endpoint.Request, batch)
	for i := range reqs {
		reqs[i] = endpoint.Request{Op: op, Buffer: buf, Length: cfg.size, Remote: remote}
		if i < batch-1 {
			reqs[i].Flags = endpoint.Silent
			if op == endpoint.OpRead {
				reqs[i].Flags = endpoint.Unsignaled
			}
		}
		if cfg.test == "write_imm_bw" {
			reqs[i].HasImm, reqs[i].Imm = true, uint32(i)
		}
	}
	inflight, posted, done := 0, 0, 0
	start := time.Now()
	for done < cfg.iters {
		for posted < cfg.iters && inflight+batch <= cfg.depth {
			n := min(batch, cfg.iters-posted)
			if err := p.ep.PostBatch(reqs[batch-n:]); err != nil {
				if errors.Is(err, endpoint.ErrQueueFull) {
					break
				}
				return err
			}
			posted += n
			inflight += n
		}
		if _, err := nextOK(ctx, p.ep); err != nil {
			return err
		}
		// Batches complete in order and only the last may be short.
		n := min(perCompletion, cfg.iters-done)
		inflight -= n
		done += n
	}
	dt := since(start)
	r.BW = float64(cfg.iters) * float64(cfg.size) / dt / (1 << 20)
	r.MsgRate = float64(cfg.iters) / dt / 1e6
	return nil
}

// latency: send_lat is a ping-pong (half the round trip, like
// ib_send_lat); read_lat times each RDMA READ (the whole round trip).
func latency(ctx context.Context, p *peer, cfg config, remote bufpool.Remote, r *result) error {
	pool, err := bufpool.New(p.ep.PD(), bufpool.Size(cfg.size), bufpool.Count(2))
	if err != nil {
		return err
	}
	defer pool.Close()
	sb, _ := pool.TryGet()
	rb, _ := pool.TryGet()
	defer pool.Put(sb)
	defer pool.Put(rb)
	next := func(want endpoint.Op) error {
		for {
			c, err := nextOK(ctx, p.ep)
			if err != nil || c.Op == want {
				return err
			}
		}
	}
	// One clock read per iteration, as perftest stamps each post: an
	// iteration's time is the gap to the next stamp (reading the clock
	// costs microseconds under emulation; twice would count it twice).
	// The pong's receive and the ping go in one call (one crossing into
	// C). The send is unsignaled, as ib_send_lat's, and silent: no
	// Completion of it to take on the timed path.
	pingPong := []endpoint.Request{
		{Op: endpoint.OpRecv, Context: "pong", Buffer: rb, Length: rb.Len()},
		{Op: endpoint.OpSend, Buffer: sb, Length: cfg.size, Flags: endpoint.Silent},
	}
	stamps := make([]time.Time, 0, cfg.iters+1)
	for range cfg.iters {
		stamps = append(stamps, time.Now())
		if cfg.test == "read_lat" {
			if err := p.ep.PostRead(nil, rb, cfg.size, remote); err != nil {
				return err
			}
			if err := next(endpoint.OpRead); err != nil {
				return err
			}
			continue
		}
		if err := p.ep.PostBatch(pingPong); err != nil {
			return err
		}
		if err := next(endpoint.OpRecv); err != nil {
			return err
		}
	}
	stamps = append(stamps, time.Now())
	div := 1
	if cfg.test == "send_lat" {
		div = 2 // half the round trip
	}
	times := gaps(stamps, div)
	summarize(times, r)
	return nil
}

// writeLatency is ib_write_lat's ping-pong: each side writes into the
// other's region and waits by watching its own region's last word change;
// like ib_write_lat, each side also takes its write's completion before it
// waits for the peer's.
func writeLatency(ctx context.Context, p *peer, cfg config, client bool, region *bufpool.Region, remote bufpool.Remote, r *result) error {
	size := max(cfg.size, 8)
	pool, err := bufpool.New(p.ep.PD(), bufpool.Size(size), bufpool.Count(1))
	if err != nil {
		return err
	}
	defer pool.Close()
	b, _ := pool.TryGet()
	defer pool.Put(b)
	word := (*uint64)(unsafe.Pointer(&region.Bytes()[(size-8)&^7]))
	off := (size - 8) &^ 7
	// The wait spins on the word, now and then looking whether the peer
	// left and yielding (rarely: each runtime.Gosched wakes an idle
	// thread, which costs more under emulation than a round trip).
	wait := func(want uint64) error {
		for spins := 0; atomic.LoadUint64(word) != want; spins++ {
			if spins%(1<<14) == 1<<14-1 {
				runtime.Gosched()
				select {
				case <-p.ep.Done():
					return endpoint.ErrClosed
				default:
				}
			}
		}
		return nil
	}
	stamps := make([]time.Time, 0, cfg.iters+1) // one clock read per iteration, as in latency
	for i := uint64(1); i <= uint64(cfg.iters); i++ {
		if client {
			stamps = append(stamps, time.Now())
		}
		if !client {
			if err := wait(i); err != nil {
				return err
			}
		}
		binary.NativeEndian.PutUint64(b.Bytes()[off:], i)
		if err := p.ep.PostWrite(nil, b, size, remote); err != nil {
			return err
		}
		if _, err := nextOK(ctx, p.ep); err != nil {
			return err
		}
		if client {
			if err := wait(i); err != nil {
				return err
			}
		}
	}
	if client {
		stamps = append(stamps, time.Now())
		summarize(gaps(stamps, 2), r) // half the round trip
	} else {
		<-p.ep.Done()
	}
	return nil
}

// nextOK waits for ep's next completion; a failed one is an error.
func nextOK(ctx context.Context, ep *endpoint.Endpoint) (endpoint.Completion, error) {
	c, err := ep.Next(ctx)
	if err == nil {
		err = c.Err
	}
	return c, err
}

// gaps turns clock stamps into the time between each and the next,
// divided by div.
func gaps(stamps []time.Time, div int) []time.Duration {
	times := make([]time.Duration, len(stamps)-1)
	for i := range times {
		times[i] = stamps[i+1].Sub(stamps[i]) / time.Duration(div)
	}
	return times
}

func summarize(times []time.Duration, r *result) {
	slices.Sort(times)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	var sum time.Duration
	for _, t := range times {
		sum += t
	}
	at := func(p float64) time.Duration { return times[min(len(times)-1, int(p*float64(len(times))))] }
	r.Typical, r.Avg, r.P99, r.P999 = us(at(0.5)), us(sum/time.Duration(len(times))), us(at(0.99)), us(at(0.999))
}

// serveRPC answers echo calls; rpcClient runs cfg.callers callers.
func serveRPC(ctx context.Context, cfg config) error {
	l, err := msg.Listen(ctx, cfg.addr, msg.WithCMOptions(cfg.polling()))
	if err != nil {
		return err
	}
	fmt.Println("ready")
	s := msg.NewServer(func(_ context.Context, _ string, req []byte) ([]byte, error) { return req, nil })
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	s.Shutdown(context.Background())
	<-done
	return nil
}

func rpcClient(ctx context.Context, cfg config) (result, error) {
	cl, err := msg.DialClient(ctx, cfg.addr, msg.WithCMOptions(cfg.polling()))
	if err != nil {
		return result{}, err
	}
	defer cl.Close()
	req := make([]byte, cfg.size)
	lat := make([][]time.Duration, cfg.callers)
	errs := make(chan error, cfg.callers)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range cfg.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range cfg.iters {
				t0 := time.Now()
				if _, err := cl.Call(ctx, "echo", req); err != nil {
					errs <- err
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	dt := since(start)
	close(errs)
	if err := <-errs; err != nil {
		return result{}, err
	}
	all := slices.Concat(lat...)
	eps := cl.Stats().Conn.Endpoint
	r := result{Test: "rpc", Size: cfg.size, Iters: len(all), Calls: float64(len(all)) / dt,
		PerDoorbell: eps.SendsPerDoorbell(), PerWakeup: eps.CompletionsPerEvent()}
	summarize(all, &r)
	return r, nil
}
