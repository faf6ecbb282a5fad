package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// msgPair is a connected msg client and server conn.
func msgPair(t testing.TB, ctx context.Context, opts ...msg.Option) (*msg.Conn, *msg.Conn, *msg.Listener) {
	t.Helper()
	return unevenMsgPair(t, ctx, opts, opts)
}

// unevenMsgPair is msgPair with the listener's options and the dialer's
// apart.
func unevenMsgPair(t testing.TB, ctx context.Context, listenOpts, dialOpts []msg.Option) (*msg.Conn, *msg.Conn, *msg.Listener) {
	t.Helper()
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), listenOpts...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	got := make(chan *msg.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			t.Errorf("accept: %v", err)
		}
		got <- c
	}()
	client, err := msg.Dial(ctx, l.Addr().String(), dialOpts...)
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	server := <-got
	require.NotNil(t, server)
	t.Cleanup(func() { server.Close() })
	return client, server, l
}

// listenMsg listens for msg connections on the device, with opts, and
// accepts n of them in the background, each onto the channel, which is
// closed after the n-th or the first error. The listener closes at cleanup.
func listenMsg(t *testing.T, ctx context.Context, n int, opts ...msg.Option) (*msg.Listener, <-chan *msg.Conn) {
	t.Helper()
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	accepted := make(chan *msg.Conn, n)
	go func() {
		defer close(accepted)
		for range n {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	return l, accepted
}

// TestMsgLargestMessage: a Listener that receives at most 1 MiB
// (WithMaxRecvSize) tells its clients so in the hello: a client's Send or
// SendRegion of a larger message fails at once with an error matching
// msg.ErrTooLarge, not ErrClosed, and sends nothing, while messages up to
// the bound arrive whole and the connection goes on. The client's own
// bound is the default: the server sends it 4 MiB.
func TestMsgLargestMessage(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const most = 1 << 20
	client, server, _ := unevenMsgPair(t, ctx, []msg.Option{msg.WithMaxRecvSize(most)}, nil)

	region, err := bufpool.NewRegion(client.PD(), 2*most, bufpool.RemoteRead)
	require.NoError(t, err)
	defer region.Close()
	refusals := map[string]func() error{
		"Send":       func() error { return client.Send(ctx, make([]byte, most+1)) },
		"SendRegion": func() error { return client.SendRegion(ctx, region, 2*most) },
	}
	for name, send := range refusals {
		err := send()
		require.ErrorIs(t, err, msg.ErrTooLarge, name)
		require.NotErrorIs(t, err, msg.ErrClosed, name)
		require.ErrorContains(t, err, fmt.Sprintf("more than the %d the peer receives", most), name)
	}
	for i, n := range []int{most, 5} {
		want := make([]byte, n)
		pattern(want, i)
		sent := make(chan error, 1)
		go func() { sent <- client.Send(ctx, want) }()
		got, err := server.Recv(ctx)
		require.NoError(t, err)
		require.NoError(t, <-sent)
		require.True(t, bytes.Equal(want, got), "%d bytes, the next message after the refusals", n)
	}
	require.EqualValues(t, 1, server.Stats().RendezvousReceived, "the refused messages were never offered")

	big := make([]byte, 4*most)
	pattern(big, 9)
	sent := make(chan error, 1)
	go func() { sent <- server.Send(ctx, big) }()
	got, err := client.Recv(ctx)
	require.NoError(t, err)
	require.NoError(t, <-sent)
	require.True(t, bytes.Equal(big, got), "the client's own bound is the default")
}

// TestRPCLargestMessage: a request larger than the server receives
// (WithMaxRecvSize on its Listener) fails the Call at once with an error
// matching msg.ErrTooLarge; a response larger than the caller receives
// (WithMaxRecvSize on DialClient) fails the call with a *msg.RemoteError
// of CodeResourceExhausted, counted as an error by the server. The client
// calls on after both.
func TestRPCLargestMessage(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const most = 1 << 20
	s, addr, served := rpcServer(t, ctx, msg.WithMaxRecvSize(2*most))
	cl, err := msg.DialClient(ctx, addr, msg.WithMaxRecvSize(most))
	require.NoError(t, err)

	_, err = cl.Call(ctx, "echo", make([]byte, 2*most))
	require.ErrorIs(t, err, msg.ErrTooLarge, "the method's name counts: the request is larger than 2 MiB")
	require.Zero(t, s.Stats().Calls, "the request was never sent")

	_, err = cl.Call(ctx, "echo", make([]byte, most+1))
	var re *msg.RemoteError
	require.ErrorAs(t, err, &re)
	require.ErrorIs(t, err, msg.CodeResourceExhausted)
	require.ErrorContains(t, err, fmt.Sprintf("a %d-byte response, more than the caller receives", most+1))

	req := make([]byte, most)
	pattern(req, 1)
	got, err := cl.Call(ctx, "echo", req)
	require.NoError(t, err)
	require.True(t, bytes.Equal(req, got), "the calls go on")
	// The server counts a call once its answer has gone to the
	// connection, which can be just after the caller has it.
	var st msg.ServerStats
	require.Eventually(t, func() bool { st = s.Stats(); return st.Calls >= 2 }, 5*time.Second, time.Millisecond,
		"every call answered is counted")
	require.EqualValues(t, 2, st.Calls)
	require.EqualValues(t, 1, st.Errors, "the response too large")

	require.NoError(t, cl.Close())
	require.NoError(t, s.Shutdown(ctx))
	require.ErrorIs(t, <-served, msg.ErrShutdown)
}

func TestMsgSizesIncludingRendezvous(t *testing.T) {
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, testContext(t))
	require.Equal(t, 4096-msg.HeaderSize, client.MaxInline())
	for i, n := range []int{0, 1, 64, 4076, 4077, 64 << 10, 1 << 20, 64 << 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			// Each size is bounded on its own, against a hang. The largest
			// keeps its bytes off the Go heap (its payload mapped here, the
			// received message read in place): under -race the detector
			// marks its shadow for every byte of a copy to or from the heap
			// in one call, which the garbage collector cannot preempt and
			// spins waiting for (BENCHMARKS.md).
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			large := n > 1<<20
			var payload []byte
			if large {
				payload = offHeap(t, n)
			} else {
				payload = make([]byte, n)
			}
			pattern(payload, i)
			sent := make(chan error, 1)
			go func() { sent <- client.Send(ctx, payload) }()
			var got []byte
			var err error
			if large { // read in place, in memory the library mapped
				var m *msg.Message
				m, err = server.RecvMessage(ctx)
				if err == nil {
					defer m.Release()
					got = m.Payload
				}
			} else {
				got, err = server.Recv(ctx)
			}
			require.NoError(t, err)
			require.NoError(t, <-sent)
			require.Equal(t, n, len(got))
			require.Equal(t, sha256.Sum256(payload), sha256.Sum256(got), "payload differs")
		})
	}
}

// offHeap is n bytes of anonymous memory outside the Go heap, unmapped
// when t ends.
func offHeap(t *testing.T, n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

// TestMsgSlowReceiver: the receiver takes nothing for 2 s, then reads
// slowly. With 6 receives the sender stalls on credits; the QPs run with
// rnr_retry 0, so a single RNR would fail the connection. None does, and
// every message arrives in order.
func TestMsgSlowReceiver(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx, msg.WithRecvDepth(6), msg.WithBufferSize(256))
	const n = 60
	sent := make(chan error, 1)
	start := time.Now()
	go func() {
		for i := range n {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(i))
			if err := client.Send(ctx, b[:]); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(2 * time.Second)
	for i := range n {
		got, err := server.Recv(ctx)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, uint64(i), binary.LittleEndian.Uint64(got))
		if i%10 == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	require.NoError(t, <-sent)
	require.NoError(t, client.Err())
	require.NoError(t, server.Err())
	t.Logf("%d messages through 6 credits with a stalled receiver in %v, no RNR", n, time.Since(start))
}

// TestMsgBothWaysManySenders floods a connection from both ends at once,
// with more senders than buffers on each side: every message arrives
// exactly once and in each sender's order, and no side waits forever for
// credits the other cannot send (a sender waiting for a credit must not
// hold a send buffer, or both sides' buffers end up held by such senders
// and neither control loop can send the credits they wait for).
func TestMsgBothWaysManySenders(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx, msg.WithRecvDepth(6), msg.WithBufferSize(256), msg.WithKeepalive(0, 0))
	const senders, each = 16, 40
	flow, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4*senders)
	for _, c := range []*msg.Conn{client, server} {
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if err := c.Send(flow, []byte{byte(s), byte(i)}); err != nil {
						errs <- fmt.Errorf("sender %d, message %d: %w", s, i, err)
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := make([]int, senders)
			for range senders * each {
				got, err := c.Recv(flow)
				if err != nil {
					errs <- fmt.Errorf("receive after %v: %w", next, err)
					return
				}
				if s, i := int(got[0]), int(got[1]); next[s] != i {
					errs <- fmt.Errorf("from sender %d: message %d, want %d", s, i, next[s])
					return
				} else {
					next[s]++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.NoError(t, client.Err())
	require.NoError(t, server.Err())
	// Each side counts the asks it sent and those it heard; a credit
	// message may still be on its way.
	var cs, ss msg.Stats
	require.Eventually(t, func() bool {
		cs, ss = client.Stats(), server.Stats()
		return cs.CreditAsksSent == ss.CreditAsksReceived && ss.CreditAsksSent == cs.CreditAsksReceived
	}, 5*time.Second, time.Millisecond, "asks sent are asks received")
	t.Logf("%d messages each way through 6 credits; asks %d and %d; %v", senders*each,
		cs.CreditAsksSent, ss.CreditAsksSent, cs.Endpoint)
}

// TestMsgSendsAreMostlyUnsignaled: a ping-pong of many more messages than
// there are send buffers (64, the default receive depth) posts most sends
// unsignaled: one in 16 (a quarter of the buffers) is signaled and brings
// back the buffers of those before it, so the ping-pong never runs out of
// them; the goodbye is signaled, and the peer reads every message before
// io.EOF. Before, every message was signaled: a CQ entry, and in event mode
// a wake-up, each.
func TestMsgSendsAreMostlyUnsignaled(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx, msg.WithKeepalive(0, 0))
	const rounds = 400
	for i := range rounds {
		require.NoError(t, client.Send(ctx, []byte{byte(i)}))
		got, err := server.Recv(ctx)
		require.NoError(t, err, "round %d", i)
		require.NoError(t, server.Send(ctx, got))
		_, err = client.Recv(ctx)
		require.NoError(t, err, "round %d", i)
	}
	for _, c := range []*msg.Conn{client, server} {
		st := c.Stats()
		require.GreaterOrEqual(t, st.MessagesSent, uint64(rounds))
		require.Equal(t, st.MessagesSent, st.Endpoint.SendRequests, "one work request a message")
		require.Positive(t, st.Endpoint.SignaledSends, "buffers come back")
		require.LessOrEqual(t, st.Endpoint.SignaledSends, st.MessagesSent/16+1, "%+v", st)
	}
	sendThenClose(t, ctx, client, server, 5) // the last 5 sends unsignaled
	_, err := server.Recv(ctx)
	require.Equal(t, io.EOF, err)
}

// TestMsgConcurrentReadersTakeEveryMessage: a reader that finds the inbox
// empty polls the CQ itself and handles what comes, so with several
// readers on one side each message is handled by whichever polls, maybe
// for another. None may be lost or taken twice, and every reader must
// see the end. The peer sends at an uneven pace (the readers go idle and
// sleep on the CQ), then half-closes. Keepalives are off, so a reader
// that slept through what it waits for would sleep until the deadline,
// not until the next keepalive.
func TestMsgConcurrentReadersTakeEveryMessage(t *testing.T) {
	for name, mode := range map[string]endpoint.PollMode{"event": endpoint.PollEvent, "busy": endpoint.PollBusy} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			rxetest.CheckResources(t)
			client, server, _ := msgPair(t, ctx, msg.WithCMOptions(cm.WithPolling(mode, 0)), msg.WithKeepalive(0, 0))
			const readers, msgs = 3, 1000
			var mu sync.Mutex
			seen := make(map[uint32]int)
			errs := make(chan error, readers)
			var wg sync.WaitGroup
			for range readers {
				wg.Go(func() {
					for {
						m, err := server.Recv(ctx)
						if err != nil {
							if err == io.EOF {
								err = nil
							}
							errs <- err
							return
						}
						mu.Lock()
						seen[binary.LittleEndian.Uint32(m)]++
						mu.Unlock()
					}
				})
			}
			b := make([]byte, 4)
			for i := range msgs {
				binary.LittleEndian.PutUint32(b, uint32(i))
				require.NoError(t, client.Send(ctx, b))
				if i%50 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			require.NoError(t, client.CloseWrite())
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err, "every reader ends with io.EOF")
			}
			require.Len(t, seen, msgs, "every message arrived")
			for i, n := range seen {
				require.Equal(t, 1, n, "message %d taken once", i)
			}
		})
	}
}

// TestMsgIdleBusyConnectionSpinsNoCore: with busy polling, the goroutines
// that wait on a msg connection spin for what they wait for, and nothing
// spins while nobody waits. Both ends of an idle pair live in this
// process: a completion goroutine spinning for nobody would take about a
// core for each end over the idle stretch, and nothing else here works.
// The pair must still answer at once afterwards.
func TestMsgIdleBusyConnectionSpinsNoCore(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx, msg.WithCMOptions(cm.WithPolling(endpoint.PollBusy, 0)), msg.WithKeepalive(0, 0))
	require.NoError(t, client.Send(ctx, []byte("warm")))
	_, err := server.Recv(ctx)
	require.NoError(t, err)

	const idle = time.Second
	before, start := processCPU(t), time.Now()
	time.Sleep(idle)
	used, elapsed := processCPU(t)-before, time.Since(start)
	t.Logf("CPU %v over %v idle", used, elapsed)
	require.Less(t, used, elapsed/4, "CPU while both ends of a busy-polling pair sat idle for %v", elapsed)

	require.NoError(t, server.Send(ctx, []byte("still there")))
	got, err := client.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "still there", string(got))
}

// processCPU is the CPU time this process has used so far, user and
// system.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
}

// sendThenClose sends n one-byte messages from one side, closes it, and
// checks that the other side reads every one, in order.
func sendThenClose(t *testing.T, ctx context.Context, from, to *msg.Conn, n int) {
	t.Helper()
	for i := range n {
		require.NoError(t, from.Send(ctx, []byte{byte(i)}))
	}
	require.NoError(t, from.Close())
	for i := range n {
		got, err := to.Recv(ctx)
		require.NoError(t, err, "message %d, sent before Close", i)
		require.Equal(t, []byte{byte(i)}, got)
	}
}

// TestCallsGivenUpKeepTheirCredits: calls whose ctx ends around the time
// their response arrives must not keep that response's receive: each one
// kept would be a credit the server never gets back, and with 6 receives
// the client would soon take no response at all.
func TestCallsGivenUpKeepTheirCredits(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	cl, _, stop := rpcClient(t, ctx, msg.WithRecvDepth(6))
	// Timeouts around one round trip, so that some end as the response comes.
	rtt := time.Now()
	_, err := cl.Call(ctx, "echo", []byte("x"))
	require.NoError(t, err)
	round := time.Since(rtt)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 150 {
				short, cancel := context.WithTimeout(ctx, round*time.Duration(i%4+g%2)/2)
				cl.Call(short, "echo", []byte("x"))
				cancel()
			}
		})
	}
	wg.Wait()
	for i := range 20 {
		call, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := cl.Call(call, "echo", []byte("after"))
		cancel()
		require.NoError(t, err, "call %d after the given-up ones", i)
	}
	stop()
}

// TestLargeCallsGivenUp: calls whose request and response both go by
// rendezvous (256 KiB each way), given up at every point of a call, from
// 4 callers at once: deadlines from 0 to one and a half times 4 whole
// calls (the callers share the link). Afterwards calls still get their
// own bytes back, Shutdown returns (no handler is left waiting for a
// response nobody will read), and no region is left registered.
func TestLargeCallsGivenUp(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	cl, _, stop := rpcClient(t, ctx)
	req := make([]byte, 256<<10)
	pattern(req, 9)
	var whole time.Duration // the fastest of 3 calls with time to finish
	for i := range 3 {
		start := time.Now()
		got, err := cl.Call(ctx, "echo", req)
		require.NoError(t, err)
		require.True(t, bytes.Equal(req, got))
		if took := time.Since(start); i == 0 || took < whole {
			whole = took
		}
	}
	const callers, calls = 4, 40
	step := whole * callers * 3 / 2 / calls // callers at once share the link
	var wg sync.WaitGroup
	var answered atomic.Int32
	for range callers {
		wg.Go(func() {
			for i := range calls {
				short, cancel := context.WithTimeout(ctx, time.Duration(i)*step)
				if _, err := cl.Call(short, "echo", req); err == nil {
					answered.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	t.Logf("a call took %v; %d of %d calls given up to %v answered", whole, answered.Load(), callers*calls, step*calls)
	for i := range 5 {
		call, cancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := cl.Call(call, "echo", req)
		cancel()
		require.NoError(t, err, "call %d after the given-up ones", i)
		require.True(t, bytes.Equal(req, got), "call %d after the given-up ones", i)
	}
	stop() // its Shutdown waits for every handler
}

// TestLargeCallsFewReceives: with the fewest receives a side may post,
// more callers than credits make large calls both ways by rendezvous, so
// both sides run out of credits while each owes the other confirmations
// of reads and credits: every call is answered all the same.
func TestLargeCallsFewReceives(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	cl, _, stop := rpcClient(t, ctx, msg.WithRecvDepth(6))
	defer stop()
	req := make([]byte, 256<<10)
	pattern(req, 5)
	const callers, calls = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			for i := range calls {
				call, cancel := context.WithTimeout(ctx, 20*time.Second)
				got, err := cl.Call(call, "echo", req)
				cancel()
				if err == nil && !bytes.Equal(req, got) {
					err = fmt.Errorf("call %d: the echo differs", i)
				}
				if err != nil {
					errs <- fmt.Errorf("call %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := cl.Stats().Conn
	t.Logf("the client sent %d messages, %d of them credits only; %d credit waits", st.MessagesSent, st.CreditMessagesSent, st.CreditWaits)
}

// TestCreditsSettleWhileBothHold: two sides whose applications hold all
// the messages of data the other may send them, one of which then
// releases one. Each credit message takes a receive on the other side,
// which owes it back: returning those at once while the peer is low would
// have the two sides pass credit messages back and forth for as long as
// the applications hold on. Within a second of the release the
// connection must be quiet, and once everything is released both sides
// send again.
func TestCreditsSettleWhileBothHold(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	a, b, _ := msgPair(t, ctx, msg.WithRecvDepth(6), msg.WithKeepalive(0, 0))
	var held []*msg.Message
	defer func() {
		for _, m := range held {
			m.Release()
		}
	}()
	held = append(held, fillUntilHeld(t, ctx, a, b)...)
	held = append(held, fillUntilHeld(t, ctx, b, a)...)
	asks := func() uint64 { return a.Stats().CreditAsksSent + b.Stats().CreditAsksSent }
	asksWhileFilling := asks()
	held[0].Release() // one of a's messages, which b holds
	held = held[1:]
	credits := func() uint64 { return a.Stats().CreditMessagesSent + b.Stats().CreditMessagesSent }
	time.Sleep(time.Second)
	before := credits()
	time.Sleep(time.Second)
	require.Equal(t, before, credits(), "credit messages a second after the release, both applications holding")
	t.Logf("%d credit messages in all", before)
	// A side asks only while the peer's receives have room for its data:
	// none after each filled the other's.
	require.Equal(t, asksWhileFilling, asks(), "asks once the peer holds all")

	for _, m := range held {
		m.Release()
	}
	held = nil
	for _, pair := range [][2]*msg.Conn{{a, b}, {b, a}} {
		require.NoError(t, pair[0].Send(ctx, []byte("again")))
		got, err := pair[1].Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, "again", string(got))
	}
}

// fillUntilHeld sends one-byte messages 0, 1, ... from one side, which
// the other takes with RecvMessage and holds, until a send cannot get a
// credit within 300 ms: the receiver then holds all that data may take.
// It returns the held messages, which the caller releases.
func fillUntilHeld(t *testing.T, ctx context.Context, from, to *msg.Conn) []*msg.Message {
	t.Helper()
	var held []*msg.Message
	for i := 0; ; i++ {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := from.Send(short, []byte{byte(i)})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			require.Positive(t, i)
			return held
		}
		require.NoError(t, err)
		m, err := to.RecvMessage(ctx)
		require.NoError(t, err)
		held = append(held, m)
	}
}

// TestGoodbyeReachesAPeerThatHoldsAll: a peer whose application holds
// every message of data it may (it took them with RecvMessage and
// releases none) still gets the goodbye, which goes on a credit data
// never takes: it reads io.EOF, not a crash's error, and Err says
// ErrPeerClosed.
func TestGoodbyeReachesAPeerThatHoldsAll(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	a, b, _ := msgPair(t, ctx, msg.WithRecvDepth(6), msg.WithKeepalive(0, 0))
	held := fillUntilHeld(t, ctx, a, b)
	defer func() {
		for _, m := range held {
			m.Release()
		}
	}()
	require.NoError(t, a.Close())
	_, err := b.RecvMessage(ctx)
	require.ErrorIs(t, err, io.EOF, "the goodbye came")
	require.ErrorIs(t, b.Err(), msg.ErrPeerClosed)
	for i, m := range held {
		require.Equal(t, []byte{byte(i)}, m.Payload, "message %d", i)
	}
}

// TestRendezvousReadBeforeCloseIsConfirmed: a message the peer has
// received counts as sent, even when the peer closes right after its
// Recv. The sender's rendezvous Send returns nil, not ErrPeerClosed: the
// goodbye goes after the confirmations the receiver owes for what it read.
// Each round is a new connection, several at once, for the race between
// the confirmation and the goodbye to have its chance.
func TestRendezvousReadBeforeCloseIsConfirmed(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const pairs, rounds = 8, 8
	listeners := make([]*msg.Listener, pairs)
	accepted := make([]<-chan *msg.Conn, pairs)
	for p := range pairs { // one each, so that a client's connection is the next its listener accepts
		listeners[p], accepted[p] = listenMsg(t, ctx, rounds)
	}
	concurrently(t, pairs, func(p int) error {
		for i := range rounds {
			if err := readThenClose(ctx, listeners[p].Addr().String(), accepted[p], p*rounds+i); err != nil {
				return fmt.Errorf("pair %d, round %d: %w", p, i, err)
			}
		}
		return nil
	})
}

// readThenClose dials addr, sends a 1 MiB message by rendezvous to the
// connection its listener accepted (the next on accepted), which closes
// right after its Recv, and says what went wrong: the Send failing, the
// message not arriving whole, or the sender not reading io.EOF after it.
func readThenClose(ctx context.Context, addr string, accepted <-chan *msg.Conn, seed int) error {
	client, err := msg.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer client.Close()
	want := make([]byte, 1<<20)
	pattern(want, seed)
	sent := make(chan error, 1)
	go func() { sent <- client.Send(ctx, want) }()
	server, ok := <-accepted
	if !ok {
		return errors.New("no connection accepted")
	}
	got, err := server.Recv(ctx)
	closeErr := server.Close()
	if err != nil {
		return fmt.Errorf("server's Recv: %w", err)
	}
	if closeErr != nil {
		return fmt.Errorf("server's Close: %w", closeErr)
	}
	if err := <-sent; err != nil {
		return fmt.Errorf("the server read the message before it closed, but Send failed: %w", err)
	}
	if !bytes.Equal(want, got) {
		return errors.New("the message arrived changed")
	}
	if _, err := client.Recv(ctx); !errors.Is(err, io.EOF) {
		return fmt.Errorf("after the server's goodbye, Recv: %v, want io.EOF", err)
	}
	return nil
}

// TestMsgBothSendBeforeReading: each side sends first and reads after,
// with 6 receives a side: one side more small messages than it has
// credits, the other a message large enough for rendezvous, whose send
// returns only when the first side confirms it read it. That side's
// writer is then waiting for a credit and its application releases
// nothing, yet its confirmation must go: the other side reads only after
// its send returns.
func TestMsgBothSendBeforeReading(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	// No keepalives: a keepalive would free the confirmation late.
	small, large, _ := msgPair(t, ctx, msg.WithRecvDepth(6), msg.WithKeepalive(0, 0))
	big := make([]byte, 4*large.MaxInline())
	pattern(big, 11)
	const n = 8
	call, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			if err := small.Send(call, []byte{byte(i)}); err != nil {
				t.Errorf("small message %d: %v", i, err)
				return
			}
		}
		got, err := small.Recv(call)
		if err != nil || !bytes.Equal(got, big) {
			t.Errorf("the large message: %v (%d bytes)", err, len(got))
		}
	})
	wg.Go(func() {
		if err := large.Send(call, big); err != nil {
			t.Errorf("the large message: %v", err)
			return
		}
		for i := range n {
			got, err := large.Recv(call)
			if err != nil || !bytes.Equal(got, []byte{byte(i)}) {
				t.Errorf("small message %d: %v (%x)", i, err, got)
				return
			}
		}
	})
	wg.Wait()
}

// TestSendsGivenUpArriveExactlyOnce: Sends whose deadlines fall at every
// point of a send, small ones and rendezvous ones in turn, over 4
// receives a side to a reader that keeps the sender waiting for credits:
// the reader gets exactly the messages whose Send returned nil, in order,
// and every other Send failed with its context's error.
func TestSendsGivenUpArriveExactlyOnce(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	sender, reader, _ := msgPair(t, ctx, msg.WithRecvDepth(6))
	large := 16 * sender.MaxInline()
	message := func(i int) []byte {
		size := 64
		if i%2 == 1 {
			size = large
		}
		b := make([]byte, size)
		pattern(b, i)
		binary.LittleEndian.PutUint32(b, uint32(i))
		return b
	}
	var whole time.Duration // the fastest of 3 pairs of sends read at once
	for i := range 3 {
		start := time.Now()
		for j := range 2 {
			require.NoError(t, sender.Send(ctx, message(j)))
			_, err := reader.Recv(ctx)
			require.NoError(t, err)
		}
		if took := time.Since(start); i == 0 || took < whole {
			whole = took
		}
	}
	const sends = 200
	// Deadlines from 0 to three pairs' time, sweeping again every 50
	// sends: a send may wait behind one of the reader's pauses too.
	step := whole * 3 / 50
	got := make(chan []int, 1)
	go func() {
		var seqs []int
		defer func() { got <- seqs }()
		for {
			b, err := reader.Recv(ctx)
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Errorf("after %d messages: %v", len(seqs), err)
				return
			}
			i := int(binary.LittleEndian.Uint32(b))
			if !bytes.Equal(b, message(i)) {
				t.Errorf("message %d: the bytes differ", i)
			}
			seqs = append(seqs, i)
			if len(seqs)%8 == 0 {
				time.Sleep(whole) // the sender runs out of credits
			}
		}
	}()
	var sent []int
	for i := range sends {
		short, cancel := context.WithTimeout(ctx, time.Duration(i%50)*step)
		err := sender.Send(short, message(i))
		cancel()
		if err == nil {
			sent = append(sent, i)
			continue
		}
		require.ErrorIs(t, err, context.DeadlineExceeded, "send %d", i)
	}
	require.NoError(t, sender.CloseWrite())
	arrived := <-got
	t.Logf("a pair of sends took %v; %d of %d sends went", whole, len(sent), sends)
	require.Equal(t, sent, arrived)
}

// TestRPCRequestsBeforeServe: requests that arrive before the server
// serves their connection wait in its inbox (the Server routes requests
// from the completion loop only once it serves the connection), and are
// answered, in order with the later ones, once it does; their handlers
// run at once, not one after the other: each waits until all have
// started. The listener sets the connection up before any Accept, so the
// client can call at once.
func TestRPCRequestsBeforeServe(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	cl, err := msg.DialClient(ctx, l.Addr().String())
	require.NoError(t, err)
	const early = 4
	var started atomic.Int32
	all := make(chan struct{})
	handler := func(ctx context.Context, method string, req []byte) ([]byte, error) {
		if method != "together" {
			return rpcHandler(ctx, method, req)
		}
		if started.Add(1) == early {
			close(all)
		}
		select {
		case <-all:
			return req, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	call, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	answers := make(chan error, early)
	for i := range early {
		go func() {
			got, err := cl.Call(call, "together", []byte{byte(i)})
			if err == nil && !bytes.Equal(got, []byte{byte(i)}) {
				err = fmt.Errorf("call %d: got %v", i, got)
			}
			answers <- err
		}()
	}
	require.Eventually(t, func() bool { return cl.Stats().CallsInFlight == early }, 5*time.Second, time.Millisecond)
	time.Sleep(100 * time.Millisecond) // for the requests to reach the server's inbox
	s := msg.NewServer(handler)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, l) }()
	for range early {
		require.NoError(t, <-answers)
	}
	got, err := cl.Call(ctx, "echo", []byte("later"))
	require.NoError(t, err)
	require.Equal(t, []byte("later"), got)
	require.NoError(t, cl.Close())
	require.NoError(t, s.Shutdown(ctx))
	require.ErrorIs(t, <-served, msg.ErrShutdown)
}

func rpcHandler(ctx context.Context, method string, req []byte) ([]byte, error) {
	switch method {
	case "echo":
		return req, nil
	case "sum":
		var s uint64
		for i := 0; i+8 <= len(req); i += 8 {
			s += binary.LittleEndian.Uint64(req[i:])
		}
		return binary.LittleEndian.AppendUint64(nil, s), nil
	case "sleep":
		d, _ := time.ParseDuration(string(req))
		select {
		case <-time.After(d):
			return []byte("slept"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case "fail":
		return nil, fmt.Errorf("you asked for it: %w", msg.CodeNotFound)
	case "peer":
		return []byte(msg.PeerAddr(ctx).String()), nil
	case "panic":
		panic("you asked for it")
	}
	return nil, fmt.Errorf("no method %q", method)
}

func rpcServer(t testing.TB, ctx context.Context, opts ...msg.Option) (*msg.Server, string, chan error) {
	t.Helper()
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), opts...)
	require.NoError(t, err)
	s := msg.NewServer(rpcHandler)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, l) }()
	return s, l.Addr().String(), served
}

// rpcClient starts an rpcServer and dials it with opts. stop closes the
// client, shuts the server down and checks that Serve returned
// ErrShutdown.
func rpcClient(t testing.TB, ctx context.Context, opts ...msg.Option) (cl *msg.Client, s *msg.Server, stop func()) {
	t.Helper()
	s, addr, served := rpcServer(t, ctx, opts...)
	cl, err := msg.DialClient(ctx, addr, opts...)
	require.NoError(t, err)
	return cl, s, func() {
		require.NoError(t, cl.Close())
		require.NoError(t, s.Shutdown(ctx))
		require.ErrorIs(t, <-served, msg.ErrShutdown)
	}
}

// TestRPCCallRegion: a request lent from the caller's region reaches the
// handler byte for byte behind its method, read by the server straight
// from that region (the client takes no rendezvous region of its own),
// from one byte to 1 MiB and across MaxInline, with methods of 1 and 255
// bytes; concurrent calls each lend their own region. Regions the server
// could not read, or that are not the connection's, are refused before
// anything is sent, and the client calls on.
func TestRPCCallRegion(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const bufSize = 4096
	cl, _, stop := rpcClient(t, ctx, msg.WithBufferSize(bufSize))
	defer stop()
	const size = 1 << 20
	region, err := bufpool.NewRegion(cl.PD(), size, bufpool.RemoteRead)
	require.NoError(t, err)
	defer region.Close()
	pattern(region.Bytes(), 3)

	const maxInline = bufSize - msg.HeaderSize
	before := cl.Stats().Conn
	lent := 0
	for _, n := range []int{size, 100000, maxInline + 1, maxInline - 1, 1} {
		got, err := cl.CallRegion(ctx, "sum", region, n) // a short response: only the request is large
		require.NoError(t, err, "%d bytes", n)
		require.Equal(t, sumWords(region.Bytes()[:n]), got, "%d bytes: the sum differs", n)
		if 1+len("sum")+n > maxInline {
			lent++
		}
	}
	long := strings.Repeat("m", 255)
	_, err = cl.CallRegion(ctx, long, region, size)
	require.ErrorContains(t, err, `no method "`+long+`"`, "a 255-byte method goes with the offer")
	lent++
	after := cl.Stats().Conn
	require.Equal(t, before.RegionCacheHits+before.RegionCacheMisses, after.RegionCacheHits+after.RegionCacheMisses,
		"the client took no rendezvous region of its own")
	require.Equal(t, before.RendezvousSent+uint64(lent), after.RendezvousSent, "lent by rendezvous above MaxInline")

	// Refusals before the concurrent calls below: their responses come by
	// rendezvous, and the client's confirmations of them (messages of
	// their own) may still leave after the calls returned.
	writeOnly, others, closed := refusedRegions(t, ctx, cl.PD())
	sentBefore := cl.Stats().Conn.MessagesSent - cl.Stats().Conn.CreditMessagesSent
	for name, refusal := range lendingRefusals(writeOnly, others, closed, region) {
		_, err := cl.CallRegion(ctx, "echo", refusal.region, refusal.n)
		require.ErrorIs(t, err, refusal.want, name)
	}
	_, err = cl.CallRegion(ctx, "", region, 10)
	require.Error(t, err, "an empty method")
	now := cl.Stats().Conn
	require.Equal(t, sentBefore, now.MessagesSent-now.CreditMessagesSent, "a refused CallRegion sends nothing")
	require.Zero(t, cl.Stats().CallsInFlight)

	concurrently(t, 4, func(i int) error {
		own, err := bufpool.NewRegion(cl.PD(), 256<<10, bufpool.RemoteRead)
		if err != nil {
			return err
		}
		defer own.Close()
		pattern(own.Bytes(), 10+i)
		for call := range 5 {
			got, err := cl.CallRegion(ctx, "echo", own, len(own.Bytes()))
			if err != nil {
				return err
			}
			if err := sameEcho(got, own.Bytes()); err != nil {
				return fmt.Errorf("caller %d, call %d: %w", i, call, err)
			}
		}
		return nil
	})

	got, err := cl.Call(ctx, "echo", []byte("still here"))
	require.NoError(t, err)
	require.Equal(t, "still here", string(got))
}

// refusedRegions makes 64 KiB regions that a call lending them must
// refuse before it sends anything, beside pd's readable ones: one
// registered without remote read, one of another PD, and one closed. They
// are closed when the test ends.
func refusedRegions(t *testing.T, ctx context.Context, pd *bufpool.PD) (writeOnly, others, closed *bufpool.Region) {
	t.Helper()
	writeOnly, err := bufpool.NewRegion(pd, 1<<16, bufpool.RemoteWrite)
	require.NoError(t, err)
	t.Cleanup(func() { writeOnly.Close() })
	otherPD, err := bufpool.OpenPD(ctx, rxetest.Addr(t))
	require.NoError(t, err)
	t.Cleanup(func() { otherPD.Close() })
	others, err = bufpool.NewRegion(otherPD, 1<<16, bufpool.RemoteRead)
	require.NoError(t, err)
	t.Cleanup(func() { others.Close() })
	closed, err = bufpool.NewRegion(pd, 1<<16, bufpool.RemoteRead)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	return writeOnly, others, closed
}

// regionRefusal is a region a call lending it must refuse before it sends
// anything, the bytes it is asked to lend, and the error the refusal
// matches.
type regionRefusal struct {
	region *bufpool.Region
	n      int
	want   error
}

// lendingRefusals are refusedRegions' three regions, region read one byte
// past its end or for a negative length, and no region, as a lending call
// must refuse them.
func lendingRefusals(writeOnly, others, closed, region *bufpool.Region) map[string]regionRefusal {
	return map[string]regionRefusal{
		"not readable":      {writeOnly, 1 << 16, endpoint.ErrInvalid},
		"another PD":        {others, 1 << 16, endpoint.ErrInvalid},
		"closed":            {closed, 1 << 16, bufpool.ErrClosed},
		"past its end":      {region, len(region.Bytes()) + 1, bufpool.ErrRange},
		"a negative length": {region, -1, bufpool.ErrRange},
		"nil":               {nil, 1, endpoint.ErrInvalid},
	}
}

// sameEcho says where echo differs from sent, if it does: its length,
// the first and last bytes that differ and how many do, so that a failure
// shows whether bytes were lost, shifted or came from another buffer.
func sameEcho(echo, sent []byte) error {
	if len(echo) != len(sent) {
		return fmt.Errorf("the echo has %d bytes, not %d", len(echo), len(sent))
	}
	first, last, n := -1, -1, 0
	for i := range sent {
		if echo[i] != sent[i] {
			if first < 0 {
				first = i
			}
			last, n = i, n+1
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("the echo differs in %d of %d bytes, from byte %d to %d (byte %d is %#x, not %#x)",
		n, len(sent), first, last, first, echo[first], sent[first])
}

// concurrently runs f(0) to f(n-1) in goroutines of their own and
// requires each to return nil.
func concurrently(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- f(i) }()
	}
	for range n {
		require.NoError(t, <-errs)
	}
}

// sumWords is rpcHandler's "sum" of b: its whole little-endian 8-byte
// words added up.
func sumWords(b []byte) []byte {
	var s uint64
	for i := 0; i+8 <= len(b); i += 8 {
		s += binary.LittleEndian.Uint64(b[i:])
	}
	return binary.LittleEndian.AppendUint64(nil, s)
}

// TestRPCCallRegionSmallBuffers: with 64-byte payloads, an offer holds a
// short method but not a 255-byte one; that request's bytes are copied
// into a rendezvous region of the client's instead, and arrive the same.
func TestRPCCallRegionSmallBuffers(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	cl, _, stop := rpcClient(t, ctx, msg.WithBufferSize(msg.HeaderSize+64))
	defer stop()
	region, err := bufpool.NewRegion(cl.PD(), 100000, bufpool.RemoteRead)
	require.NoError(t, err)
	defer region.Close()
	pattern(region.Bytes(), 5)
	regionsTaken := func() uint64 { s := cl.Stats().Conn; return s.RegionCacheHits + s.RegionCacheMisses }

	before := regionsTaken()
	got, err := cl.CallRegion(ctx, "sum", region, len(region.Bytes()))
	require.NoError(t, err)
	require.Equal(t, sumWords(region.Bytes()), got)
	require.Equal(t, before, regionsTaken(), "a short method goes with the offer: lent")

	long := strings.Repeat("m", 255)
	responsesBefore := cl.Stats().Conn.RendezvousReceived
	_, err = cl.CallRegion(ctx, long, region, len(region.Bytes()))
	require.ErrorContains(t, err, `no method "`+long+`"`, "the method arrived")
	responses := cl.Stats().Conn.RendezvousReceived - responsesBefore // an error naming the method is large too
	require.Equal(t, before+1+responses, regionsTaken(), "a 255-byte method does not fit the offer: copied")
}

// TestRPCHandlersRunConcurrentlyOnOneConnection: the connection's serving
// goroutine runs a request itself when it waits for one, but a request
// that arrives while it runs a handler gets a handler of its own: here
// the first call's handler waits for the second's, on one connection, and
// both return. Served one after the other, they would never finish.
func TestRPCHandlersRunConcurrentlyOnOneConnection(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	started, released := make(chan struct{}), make(chan struct{})
	s := msg.NewServer(func(ctx context.Context, method string, req []byte) ([]byte, error) {
		switch method {
		case "wait":
			close(started)
			select {
			case <-released:
				return []byte("waited"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case "release":
			close(released)
			return []byte("released"), nil
		}
		return nil, fmt.Errorf("no method %q", method)
	})
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, l) }()
	cl, err := msg.DialClient(ctx, l.Addr().String())
	require.NoError(t, err)

	call, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		got, err := cl.Call(call, "wait", nil)
		if err == nil && string(got) != "waited" {
			err = fmt.Errorf("wait gave %q", got)
		}
		waited <- err
	}()
	<-started
	got, err := cl.Call(call, "release", nil)
	require.NoError(t, err, "a call while another handler runs")
	require.Equal(t, "released", string(got))
	require.NoError(t, <-waited)

	require.NoError(t, cl.Close())
	require.NoError(t, s.Shutdown(ctx))
	require.ErrorIs(t, <-served, msg.ErrShutdown)
}

// TestRPCConcurrentCallers: 32 callers x 1000 calls on one connection,
// every result checked. Under -race in the testbed the calls take most of
// a minute; the bound is there to catch a hang, not slowness.
func TestRPCConcurrentCallers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	rxetest.CheckResources(t)
	cl, _, stop := rpcClient(t, ctx)
	const callers, calls = 32, 1000
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				req := binary.LittleEndian.AppendUint64(nil, uint64(c))
				req = binary.LittleEndian.AppendUint64(req, uint64(i))
				method := "echo"
				if i%2 == 1 {
					method = "sum"
				}
				resp, err := cl.Call(ctx, method, req)
				if err != nil {
					errs <- fmt.Errorf("caller %d call %d: %w", c, i, err)
					return
				}
				want := req
				if method == "sum" {
					want = binary.LittleEndian.AppendUint64(nil, uint64(c+i))
				}
				if !bytes.Equal(resp, want) {
					errs <- fmt.Errorf("caller %d call %d: %s gave %x, want %x", c, i, method, resp, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	elapsed := time.Since(start)
	t.Logf("%d calls in %v: %.0f calls/s", callers*calls, elapsed, float64(callers*calls)/elapsed.Seconds())
	stop()
}

// TestRPCClientEndsOnAMessageThatIsNoResponse: a Client whose peer is no
// Server and answers a call with a plain message (a msg Conn's Send)
// ends its connection with ErrMalformed: the call waiting fails with it
// at once, and so do the connection's Err and the next call; the peer's
// connection ends too, and nothing hangs or leaks.
func TestRPCClientEndsOnAMessageThatIsNoResponse(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	conn, peer, _ := msgPair(t, ctx)
	cl := msg.NewClient(conn)
	called := make(chan error, 1)
	go func() {
		_, err := cl.Call(ctx, "m", []byte("request"))
		called <- err
	}()
	req, err := peer.Recv(ctx)
	require.NoError(t, err)
	require.Contains(t, string(req), "request")
	require.NoError(t, peer.Send(ctx, []byte("no response")))

	err = <-called
	require.ErrorIs(t, err, msg.ErrMalformed)
	require.ErrorIs(t, conn.Err(), msg.ErrMalformed)
	_, err = cl.Call(ctx, "m", nil)
	require.ErrorIs(t, err, msg.ErrMalformed)
	_, err = peer.Recv(ctx)
	require.ErrorIs(t, err, msg.ErrClosed, "the client's side ended the connection")
	require.NoError(t, cl.Close())
}

func TestRPCErrorsDeadlinesAndLargeCalls(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	cl, _, stop := rpcClient(t, ctx)

	_, err := cl.Call(ctx, "fail", nil)
	var re *msg.RemoteError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "you asked for it: msg: not found", re.Msg)
	require.ErrorIs(t, err, msg.CodeNotFound, "the code crosses the wire")
	resp, err := cl.Call(ctx, "peer", nil)
	require.NoError(t, err)
	require.Equal(t, cl.LocalAddr().String(), string(resp), "the handler sees the caller's address")

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = cl.Call(short, "sleep", []byte("1s"))
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// The connection still serves after a call gave up.
	resp, err = cl.Call(ctx, "echo", []byte("still here"))
	require.NoError(t, err)
	require.Equal(t, "still here", string(resp))

	// A call and its response larger than a buffer go by rendezvous.
	big := make([]byte, 3<<20)
	pattern(big, 9)
	resp, err = cl.Call(ctx, "echo", big)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(big), sha256.Sum256(resp))

	stop()
}

// TestServerShutdownWithCallsInFlight: every call in flight completes or
// returns a clear error; none hangs.
func TestServerShutdownWithCallsInFlight(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	s, addr, served := rpcServer(t, ctx)
	cl, err := msg.DialClient(ctx, addr)
	require.NoError(t, err)
	defer cl.Close()
	results := make(chan error, 10)
	for range 10 {
		go func() {
			_, err := cl.Call(ctx, "sleep", []byte("300ms"))
			results <- err
		}()
	}
	time.Sleep(100 * time.Millisecond) // the calls are in the handlers
	require.NoError(t, s.Shutdown(ctx), "in-flight calls finish within the deadline")
	require.ErrorIs(t, <-served, msg.ErrShutdown)
	ok := 0
	for range 10 {
		select {
		case err := <-results:
			if err == nil {
				ok++
			} else {
				require.ErrorIs(t, err, msg.ErrClosed, "a call cut short says the connection closed")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call hangs after Shutdown")
		}
	}
	require.Equal(t, 10, ok, "Shutdown let the calls in flight finish")
	_, err = cl.Call(ctx, "echo", []byte("after"))
	require.Error(t, err, "the server is gone")
}

// TestHandlerPanicFailsOnlyItsCall: a handler that panics fails its own
// call with a *RemoteError; the server process lives and serves on, on
// that connection and others; the logger given with msg.WithLogger gets
// the panic, its method and the handler's stack.
func TestHandlerPanicFailsOnlyItsCall(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	var log lockedBuffer
	s, addr, served := rpcServer(t, ctx, msg.WithLogger(zerolog.New(&log)))
	cl, err := msg.DialClient(ctx, addr)
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.Call(ctx, "panic", nil)
	var re *msg.RemoteError
	require.ErrorAs(t, err, &re)
	require.Contains(t, re.Msg, "panicked: you asked for it")
	require.ErrorIs(t, err, msg.CodeInternal)
	var entry struct{ Level, Message, Method, Panic, Stack string }
	for line := range strings.Lines(log.String()) {
		require.NoError(t, json.Unmarshal([]byte(line), &entry), "a log line: %s", line)
		if entry.Message == "msg: handler panicked" {
			break
		}
	}
	require.Equal(t, "msg: handler panicked", entry.Message, "the log: %s", log.String())
	require.Equal(t, "error", entry.Level)
	require.Equal(t, "panic", entry.Method)
	require.Equal(t, "you asked for it", entry.Panic)
	require.Contains(t, entry.Stack, "integration.rpcHandler", "the stack names the handler")
	resp, err := cl.Call(ctx, "echo", []byte("still here"))
	require.NoError(t, err, "the same connection serves on")
	require.Equal(t, "still here", string(resp))
	other, err := msg.DialClient(ctx, addr)
	require.NoError(t, err, "the server accepts on")
	_, err = other.Call(ctx, "echo", []byte("x"))
	require.NoError(t, err)
	require.NoError(t, other.Close())
	require.NoError(t, s.Shutdown(ctx))
	require.ErrorIs(t, <-served, msg.ErrShutdown)
}

// TestServerShutdownWhileCallsKeepArriving: Shutdown waits for the calls in
// flight while new ones keep arriving on open connections (and are still
// served); under -race this checks that counting the handlers does not
// race with waiting for them. Every caller ends with an error matching
// ErrClosed once its connection is closed, and nothing leaks.
func TestServerShutdownWhileCallsKeepArriving(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	s, addr, served := rpcServer(t, ctx)
	const clients, callers = 4, 4
	var wg sync.WaitGroup
	var calls atomic.Int64
	ended := make(chan error, clients*callers)
	for range clients {
		cl, err := msg.DialClient(ctx, addr)
		require.NoError(t, err)
		defer cl.Close()
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if _, err := cl.Call(ctx, "sleep", []byte("1ms")); err != nil {
						ended <- err
						return
					}
					calls.Add(1)
				}
			}()
		}
	}
	for calls.Load() < 50 {
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, s.Shutdown(ctx))
	require.ErrorIs(t, <-served, msg.ErrShutdown)
	wg.Wait()
	for range clients * callers {
		require.ErrorIs(t, <-ended, msg.ErrClosed)
	}
	t.Logf("%d calls served before and during Shutdown", calls.Load())
}

// TestMalformedFrameEndsOnlyThatConnection: a peer that sends garbage after
// a valid hello loses its connection with ErrMalformed; another connection
// on the same listener keeps working.
func TestMalformedFrameEndsOnlyThatConnection(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, accepted := listenMsg(t, ctx, 2)
	good, err := msg.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	defer good.Close()
	goodSrv := <-accepted
	require.NotNil(t, goodSrv)
	defer goodSrv.Close()

	raw, err := cm.Dial(ctx, l.Addr().String(), msgHello(t))
	require.NoError(t, err)
	defer closeAndDrain(t, raw)
	badSrv := <-accepted
	require.NotNil(t, badSrv)
	defer badSrv.Close()
	pool, err := bufpool.New(raw.PD(), bufpool.Size(64), bufpool.Count(1))
	require.NoError(t, err)
	defer pool.Close()
	b, _ := pool.TryGet()
	copy(b.Bytes(), "this is not a msg frame at all!!")
	require.NoError(t, raw.PostSend(nil, b, 32))
	c := next(t, raw)
	require.NoError(t, c.Err)
	require.NoError(t, pool.Put(b))

	_, err = badSrv.Recv(ctx)
	require.ErrorIs(t, err, msg.ErrMalformed)
	t.Logf("bad peer: %v", err)

	require.NoError(t, good.Send(ctx, []byte("unaffected")))
	got, err := goodSrv.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "unaffected", string(got))
}

// TestMsgOrderlyCloseIsEOF: a peer that closes in order says goodbye, so
// the reader gets every message sent before Close, then io.EOF; the
// connection's error is ErrPeerClosed (matching ErrClosed, not
// net.ErrClosed, which is for this side's Close), and sending fails with
// it. On the closing side, calls fail with net.ErrClosed, and so do the
// other side's once it closes too, while its Err keeps the peer's reason.
// (TestClientKilledMidStream checks that a crash is not EOF.)
func TestMsgOrderlyCloseIsEOF(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx)
	sendThenClose(t, ctx, client, server, 3)
	_, err := server.Recv(ctx)
	require.Equal(t, io.EOF, err, "after the peer's Close: io.EOF itself, as from a net.Conn")
	_, err = server.Recv(ctx)
	require.Equal(t, io.EOF, err, "and again")
	require.ErrorIs(t, server.Err(), msg.ErrPeerClosed)
	require.NotErrorIs(t, server.Err(), net.ErrClosed, "net.ErrClosed is for this side's Close")
	err = server.Send(ctx, []byte("late"))
	require.ErrorIs(t, err, msg.ErrPeerClosed)
	require.NotErrorIs(t, err, net.ErrClosed)
	for _, err := range []error{client.Send(ctx, []byte("after Close")), client.Err(), recvErr(ctx, client)} {
		require.ErrorIs(t, err, msg.ErrClosed)
		require.ErrorIs(t, err, net.ErrClosed, "after this side's Close")
	}
	// A side that closes after the peer did: its calls say it closed, as
	// net's conns do, and Err still says the peer's Close came first.
	require.NoError(t, server.Close())
	for _, err := range []error{server.Send(ctx, []byte("after Close")), recvErr(ctx, server), server.CloseWrite()} {
		require.ErrorIs(t, err, net.ErrClosed, "after this side's Close, whoever ended the connection first")
	}
	require.ErrorIs(t, server.Err(), msg.ErrPeerClosed)
}

// TestMsgAbortIsNoEOF: a peer that aborts says no goodbye, so the reader
// never gets io.EOF: after what arrived, Recv fails with the connection's
// end (the peer disconnected), which matches ErrClosed but not
// ErrPeerClosed. On the aborting side, calls fail with net.ErrClosed, as
// after Close, and a Close after Abort returns Abort's result.
func TestMsgAbortIsNoEOF(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx)
	require.NoError(t, client.Send(ctx, []byte("cut short")))
	require.NoError(t, client.Abort())
	require.NoError(t, client.Close(), "Close after Abort")
	for _, err := range []error{client.Send(ctx, []byte("after Abort")), recvErr(ctx, client)} {
		require.ErrorIs(t, err, net.ErrClosed, "after this side's Abort")
	}
	var err error
	for err == nil {
		var m []byte
		m, err = server.Recv(ctx)
		if err == nil {
			require.Equal(t, "cut short", string(m))
		}
	}
	require.NotErrorIs(t, err, io.EOF)
	require.ErrorIs(t, err, msg.ErrClosed)
	require.NotErrorIs(t, err, msg.ErrPeerClosed)
	require.ErrorIs(t, err, cm.ErrPeerDisconnected)
}

// recvErr is the error of a Recv on c.
func recvErr(ctx context.Context, c *msg.Conn) error {
	_, err := c.Recv(ctx)
	return err
}

// TestMsgCloseWhileThePeerReads: Close right after the last Send, while
// the peer reads and its credits flow back, still delivers every message
// sent before it, then io.EOF; 20 rounds. On iWARP a send completes once
// TCP took it, and siw resets the connection when it closes its socket
// with the peer's bytes unread, which drops what TCP still held: Close
// must know that the peer has everything before it disconnects, and the
// reader must send nothing after the goodbye (a late credit is reset
// too). The guest's TCP counters catch the reset even when the round's
// timing let the messages through: no connection may end in one (on
// RoCE, whose transport is not TCP, they never move). They are read once
// the sockets are released, before the first round and after each.
func TestMsgCloseWhileThePeerReads(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	resetsBefore := tcpResetsSettled(t, ctx)
	const rounds, msgs, size = 20, 200, 1000
	type result struct {
		n   int
		err error
	}
	for round := range rounds {
		client, server, l := msgPair(t, ctx)
		got := make(chan result, 1)
		go func() {
			n := 0
			for {
				p, err := server.Recv(ctx)
				if err == nil && (len(p) != size || p[0] != byte(n)) {
					err = fmt.Errorf("message %d: %d bytes, numbered %d", n, len(p), p[0])
				}
				if err != nil {
					got <- result{n, err}
					return
				}
				n++
			}
		}()
		payload := make([]byte, size)
		for i := range msgs {
			payload[0] = byte(i)
			require.NoError(t, client.Send(ctx, payload))
		}
		require.NoError(t, client.Close())
		r := <-got
		require.Equal(t, io.EOF, r.err, "round %d, after %d messages", round, r.n)
		require.Equal(t, msgs, r.n, "round %d", round)
		require.NoError(t, server.Close())
		require.NoError(t, l.Close())
		require.Equal(t, resetsBefore, tcpResetsSettled(t, ctx), "round %d: TCP connections reset by a close with data unread", round)
	}
}

// TestMsgCloseWrite: a half-close. The client sends, then CloseWrite: the
// server reads every message, then io.EOF (again on the next call), and
// still sends replies the client reads, more than the client's receive
// depth so that credits must keep flowing both ways; the client's sends,
// by rendezvous and from a region lent too, fail with ErrWriteClosed on a
// connection that is still up.
//
// Keepalives are off, so nothing but the credit rule moves credits: the
// client receives only replies and credit messages, and the server, left
// with the credits it keeps for the protocol's messages, would wait for
// ever if the client granted only on reaching half its receives. Once the
// server closes, its reads fail with net.ErrClosed, not io.EOF, as a
// closed net.Conn's do.
func TestMsgCloseWrite(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx, msg.WithRecvDepth(6), msg.WithKeepalive(0, 0))
	for i := range 2 {
		require.NoError(t, client.Send(ctx, []byte{byte(i)}))
	}
	require.NoError(t, client.CloseWrite())
	require.NoError(t, client.CloseWrite(), "idempotent")
	require.ErrorIs(t, client.Send(ctx, []byte("late")), msg.ErrWriteClosed)
	big := make([]byte, client.MaxInline()+1)
	require.ErrorIs(t, client.Send(ctx, big), msg.ErrWriteClosed, "a message sent by rendezvous")
	region, err := bufpool.NewRegion(client.PD(), len(big), bufpool.RemoteRead)
	require.NoError(t, err)
	defer region.Close()
	require.ErrorIs(t, client.SendRegion(ctx, region, len(big)), msg.ErrWriteClosed, "a region lent")
	for i := range 2 {
		got, err := server.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, got)
	}
	for range 2 {
		_, err := server.Recv(ctx)
		require.Equal(t, io.EOF, err)
	}
	const replies = 20
	go func() {
		for i := range replies {
			if err := server.Send(ctx, []byte{byte(i)}); err != nil {
				t.Errorf("reply %d after the client's CloseWrite: %v", i, err)
				return
			}
		}
	}()
	for i := range replies {
		got, err := client.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, got)
	}
	require.NoError(t, client.Err())
	require.NoError(t, server.Err())
	require.NoError(t, server.Close())
	_, err = server.Recv(ctx)
	require.ErrorIs(t, err, net.ErrClosed, "after this side's Close, not the peer's end of data (io.EOF)")
}

// TestMsgCloseWriteHeldBehindRendezvous: a peer's end of data that
// arrives while the READ of a rendezvous announced before it is still in
// flight. A raw peer (a cm endpoint speaking the wire format) posts the
// announcement of a 16 MiB region and its TypeCloseWrite back to back; the
// reader gets the whole message first, then io.EOF.
func TestMsgCloseWriteHeldBehindRendezvous(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, accepted := listenMsg(t, ctx, 1)
	var rawRecvs *bufpool.Pool
	raw, err := cm.Dial(ctx, l.Addr().String(), msgHello(t),
		receivesOnSetup(&rawRecvs, 4096, 4, 4)) // for the reader's credits and its done
	require.NoError(t, err)
	defer rawRecvs.Close()
	defer closeAndDrain(t, raw)
	srv := <-accepted
	require.NotNil(t, srv)
	defer srv.Close()

	region, err := bufpool.NewRegion(raw.PD(), 16<<20, bufpool.RemoteRead)
	require.NoError(t, err)
	defer region.Close()
	pattern(region.Bytes(), 9)
	sends := newPool(t, raw, 64, 2)
	announce, _ := sends.TryGet()
	(&msg.Header{Type: msg.TypeRendezvous, Flags: msg.FlagRendezvous, Length: 28}).Encode(announce.Bytes())
	// The announcement's payload, as frame.go lays it out.
	info := announce.Bytes()[msg.HeaderSize:]
	remote := region.Remote()
	info[0] = byte(msg.TypeData)
	binary.LittleEndian.PutUint64(info[4:], 1) // rendezvous id
	binary.LittleEndian.PutUint64(info[12:], remote.Addr)
	binary.LittleEndian.PutUint32(info[20:], remote.RKey)
	binary.LittleEndian.PutUint32(info[24:], uint32(remote.Len))
	eof, _ := sends.TryGet()
	(&msg.Header{Type: msg.TypeCloseWrite}).Encode(eof.Bytes())
	require.NoError(t, raw.PostSend(nil, announce, msg.HeaderSize+28))
	require.NoError(t, raw.PostSend(nil, eof, msg.HeaderSize))

	got, err := srv.Recv(ctx)
	require.NoError(t, err, "the message announced before the end of data comes first")
	require.True(t, bytes.Equal(region.Bytes(), got), "%d bytes", len(got))
	_, err = srv.Recv(ctx)
	require.Equal(t, io.EOF, err)
}

// TestMsgConnOneSided: messages and one-sided access on one connection.
// The server registers a region on its Conn's PD and sends its descriptor
// as a message; the client writes, reads and runs both atomics on it, and
// the server sees the bytes land as soon as the write returns (on iWARP
// too, where the write completes once TCP took it). A write into a region
// registered for reads only fails and ends the connection, whose errors
// then match ErrClosed.
func TestMsgConnOneSided(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx)
	region, err := bufpool.NewRegion(server.PD(), 64<<10, bufpool.RemoteRead|bufpool.RemoteWrite|bufpool.RemoteAtomic)
	require.NoError(t, err)
	defer region.Close()
	desc, err := region.Remote().MarshalBinary()
	require.NoError(t, err)
	require.NoError(t, server.Send(ctx, desc))

	got, err := client.Recv(ctx)
	require.NoError(t, err)
	var remote bufpool.Remote
	require.NoError(t, remote.UnmarshalBinary(got))

	payload := make([]byte, 40000)
	pattern(payload, 7)
	at, err := remote.Slice(1024, len(payload))
	require.NoError(t, err)
	require.NoError(t, client.WriteRemote(ctx, at, payload))
	require.Equal(t, payload, region.Bytes()[1024:1024+len(payload)], "the write landed in the server's region")

	copy(region.Bytes()[50000:], "written by the owner")
	back := make([]byte, len("written by the owner"))
	at, err = remote.Slice(50000, len(back))
	require.NoError(t, err)
	require.NoError(t, client.ReadRemote(ctx, at, back))
	require.Equal(t, "written by the owner", string(back))

	word, err := remote.Slice(0, 8)
	require.NoError(t, err)
	binary.NativeEndian.PutUint64(region.Bytes(), 41)
	if rxetest.IWARP() { // no atomics on iWARP: refused, the connection lives on
		_, err := client.FetchAndAdd(ctx, word, 1)
		require.ErrorIs(t, err, endpoint.ErrNoAtomics)
		_, err = client.CompareAndSwap(ctx, word, 41, 100)
		require.ErrorIs(t, err, endpoint.ErrNotSupported)
		require.Equal(t, uint64(41), binary.NativeEndian.Uint64(region.Bytes()))
	} else {
		old, err := client.FetchAndAdd(ctx, word, 1)
		require.NoError(t, err)
		require.Equal(t, uint64(41), old)
		old, err = client.CompareAndSwap(ctx, word, 42, 100)
		require.NoError(t, err)
		require.Equal(t, uint64(42), old)
		require.Equal(t, uint64(100), binary.NativeEndian.Uint64(region.Bytes()))
	}

	// Messages still flow both ways after one-sided traffic.
	require.NoError(t, client.Send(ctx, []byte("done")))
	got, err = server.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "done", string(got))

	err = client.ReadRemote(ctx, remote, nil)
	require.ErrorIs(t, err, endpoint.ErrInvalid, "an empty read is refused before posting")

	readOnly, err := bufpool.NewRegion(server.PD(), 4096, bufpool.RemoteRead)
	require.NoError(t, err)
	defer readOnly.Close()
	err = client.WriteRemote(ctx, readOnly.Remote(), []byte("forbidden"))
	var ce *endpoint.CompletionError
	switch {
	case errors.As(err, &ce):
		require.Equal(t, endpoint.StatusRemoteAccess, ce.Status)
	case rxetest.IWARP():
		// The write completed once TCP took it; the peer's refusal
		// ended the connection before the READ behind it was answered.
		require.ErrorIs(t, err, msg.ErrClosed)
	default:
		require.Fail(t, "the write into a read-only region did not fail with a remote access error", "%v", err)
	}
	select {
	case <-client.Done():
	case <-ctx.Done():
		t.Fatal("the connection outlived a failed write")
	}
	// Every error of the connection that ended matches ErrClosed, whatever
	// ended it (the device's failure, or the peer's end that raced it).
	err = client.Send(ctx, []byte("after"))
	require.ErrorIs(t, err, msg.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "this side did not close it")
	require.ErrorIs(t, client.Err(), msg.ErrClosed)
	// And Err says why: the device's failure, or the peer's disconnect
	// that came first, never a bare flush of the receives it caused. (On
	// iWARP the peer's refusal ends the connection instead.)
	if !rxetest.IWARP() && !errors.Is(client.Err(), cm.ErrPeerDisconnected) {
		require.ErrorAs(t, client.Err(), &ce)
		require.Equalf(t, endpoint.StatusRemoteAccess, ce.Status, "Err: %v", client.Err())
	}
	t.Logf("the connection ended with: %v", client.Err())
}

// TestOneSidedOpsWhenThePeerCloses: RDMA READs in a loop while the peer
// closes. The read the end catches (refused, or flushed once msg has
// closed the endpoint itself) and every one after it fail with an error
// saying the connection ended, matching msg.ErrClosed, and never
// net.ErrClosed: this side did not close (nor did it end the connection
// with its own Close later).
func TestOneSidedOpsWhenThePeerCloses(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx)
	region, err := bufpool.NewRegion(server.PD(), 1<<20, bufpool.RemoteRead)
	require.NoError(t, err)
	defer region.Close()
	closed := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		closed <- server.Close()
	}()
	buf := make([]byte, len(region.Bytes()))
	reads := 0
	for ; ; reads++ {
		if err = client.ReadRemote(ctx, region.Remote(), buf); err != nil {
			break
		}
	}
	require.NoError(t, <-closed)
	t.Logf("%d reads, then %v", reads, err)
	for range 2 { // the failed read, then one after the end
		require.ErrorIs(t, err, msg.ErrClosed, "the connection ended")
		require.NotErrorIs(t, err, net.ErrClosed, "this side did not close")
		err = client.ReadRemote(ctx, region.Remote(), buf)
	}
	require.NoError(t, client.Close())
	err = client.ReadRemote(ctx, region.Remote(), buf)
	require.ErrorIs(t, err, net.ErrClosed, "after this side's Close, as net's conns answer, though the peer ended it first")
	require.ErrorIs(t, client.Err(), msg.ErrPeerClosed, "Err keeps why the connection ended: the peer's Close came first")
}

// TestAcceptingSideWaitsForTheDialer: the accepting side of a msg
// connection sends nothing before the dialer has (iWARP forbids the
// passive side to speak first; msg's dialer greets as soon as it is
// connected). Here the dialer is a raw endpoint that stays silent: the
// accepted Conn's Send waits, fails when its ctx ends and says why, and
// nothing arrives; once the dialer has sent a frame, the Send goes through.
func TestAcceptingSideWaitsForTheDialer(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, accepted := listenMsg(t, ctx, 1)
	var pool *bufpool.Pool
	raw, err := cm.Dial(ctx, l.Addr().String(), msgHello(t),
		receivesOnSetup(&pool, 4096, 5, 4))
	require.NoError(t, err)
	defer pool.Close()
	defer closeAndDrain(t, raw)
	srv := <-accepted
	require.NotNil(t, srv)
	defer srv.Close()

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = srv.Send(short, []byte("too early"))
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "never speaks first")
	select {
	case c := <-raw.Completions():
		t.Fatalf("the accepting side spoke first: %+v", c)
	default:
	}

	b, _ := pool.TryGet()
	greeting := msg.Header{Type: msg.TypeCredit}
	greeting.Encode(b.Bytes())
	require.NoError(t, raw.PostSend("greeting", b, msg.HeaderSize))
	require.NoError(t, srv.Send(ctx, []byte("now")))
	for range 2 { // the greeting's send completion and the message
		c := next(t, raw)
		require.NoError(t, c.Err)
		if c.Op == endpoint.OpRecv {
			var h msg.Header
			require.NoError(t, h.Decode(c.Buffer.Bytes()[:c.Len]))
			require.Equal(t, msg.TypeData, h.Type)
			require.Equal(t, "now", string(c.Buffer.Bytes()[msg.HeaderSize:c.Len]))
		}
		require.NoError(t, pool.Put(c.Buffer))
	}
}

// TestMsgListenerSetsUpBeforeAccept: a msg Listener sets connections up as
// their requests arrive, as a TCP listener's kernel does, so dialers get
// through while nobody calls Accept; Accept then hands each out, whole;
// Close ends the ones nobody took, in order (their dialers read io.EOF).
func TestMsgListenerSetsUpBeforeAccept(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const dialers, taken = 8, 6
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()

	dialCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	clients := make([]*msg.Conn, dialers)
	errs := make([]error, dialers)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { clients[i], errs[i] = msg.Dial(dialCtx, l.Addr().String()) })
	}
	wg.Wait() // no Accept yet
	byAddr := map[string]int{}
	for i, c := range clients {
		require.NoError(t, errs[i], "dial %d, with nobody in Accept", i)
		defer c.Close()
		byAddr[c.LocalAddr().String()] = i
	}
	require.Len(t, byAddr, dialers)

	for range taken {
		srv, err := l.Accept(ctx)
		require.NoError(t, err)
		defer srv.Close()
		i, ok := byAddr[srv.RemoteAddr().String()]
		require.True(t, ok, "accepted %v, which nobody dialed from", srv.RemoteAddr())
		delete(byAddr, srv.RemoteAddr().String())
		want := fmt.Sprintf("from dialer %d", i)
		require.NoError(t, clients[i].Send(ctx, []byte(want)))
		got, err := srv.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, want, string(got))
	}
	require.Len(t, byAddr, dialers-taken)

	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close is idempotent")
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, net.ErrClosed)
	for _, i := range byAddr {
		_, err := clients[i].Recv(ctx)
		require.ErrorIs(t, err, io.EOF, "dialer %d, set up but never accepted, after the listener closed", i)
	}
}

// TestMsgListenerClosesRightAfterDial: a dialer's Dial returns when its
// side of the handshake ends, a moment before the listening side hears of
// it. A listener closed in that moment still says goodbye to the
// connection: a dialer whose Dial returned reads io.EOF, not an error.
func TestMsgListenerClosesRightAfterDial(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	for round := range 8 {
		l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
		require.NoError(t, err)
		c, err := msg.Dial(ctx, l.Addr().String())
		if err != nil {
			l.Close()
			require.NoError(t, err, "round %d", round)
		}
		require.NoError(t, l.Close())
		_, err = c.Recv(ctx)
		c.Close()
		require.ErrorIs(t, err, io.EOF, "round %d: the dialer, whose Dial returned before the listener closed", round)
	}
}

// TestMsgAcceptedOutlivesListener: the same for msg's listener, which sets
// connections up in the background.
func TestMsgAcceptedOutlivesListener(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, l := msgPair(t, ctx)
	require.NoError(t, l.Close())
	time.Sleep(300 * time.Millisecond) // an end the close caused would have come by now
	require.NoError(t, client.Send(ctx, []byte("to the server")))
	got, err := server.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "to the server", string(got))
	require.NoError(t, server.Send(ctx, []byte("to the client")))
	got, err = client.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "to the client", string(got))
}

// TestMsgSendRegion: a message sent from a region the caller lends
// arrives byte for byte, read by the peer straight from that region: the
// sender takes no rendezvous region of its own (its region cache is never
// asked), and SendRegion returns, the region the caller's again, before
// the peer's application reads the message. Regions the peer could not
// read, or that are not the connection's, are refused before anything is
// sent, and the connection works on.
func TestMsgSendRegion(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx)
	const size = 1 << 20
	region, err := bufpool.NewRegion(client.PD(), size, bufpool.RemoteRead)
	require.NoError(t, err)
	defer region.Close()
	pattern(region.Bytes(), 7)

	before := client.Stats()
	for _, n := range []int{size, 100000, client.MaxInline() + 1, 10, 0} {
		require.NoError(t, client.SendRegion(ctx, region, n), "%d bytes", n)
		want := sha256.Sum256(region.Bytes()[:n])
		region.Bytes()[0] ^= 0xff // the caller's again: what was sent stays as it was
		got, err := server.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, n, len(got))
		require.Equal(t, want, sha256.Sum256(got), "%d bytes: payload differs", n)
	}
	after := client.Stats()
	require.Equal(t, before.RegionCacheHits+before.RegionCacheMisses, after.RegionCacheHits+after.RegionCacheMisses,
		"the sender took no rendezvous region of its own")
	require.Equal(t, before.RendezvousSent+3, after.RendezvousSent, "the three above MaxInline went by rendezvous")

	writeOnly, others, closed := refusedRegions(t, ctx, client.PD())
	for name, refusal := range lendingRefusals(writeOnly, others, closed, region) {
		err := client.SendRegion(ctx, refusal.region, refusal.n)
		require.ErrorIs(t, err, refusal.want, name)
		t.Logf("%s: %v", name, err)
	}
	dataSent := func(s msg.Stats) uint64 { return s.MessagesSent - s.CreditMessagesSent } // not keepalives
	require.Equal(t, dataSent(after), dataSent(client.Stats()), "a refused SendRegion sends nothing")
	require.ErrorIs(t, client.SendRegion(ctx, closed, 10), bufpool.ErrClosed, "closed, even for a copy")
	require.NoError(t, client.Send(ctx, []byte("still here")))
	got, err := server.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "still here", string(got))
}

// TestRPCRespond: a handler answers with a response lent from a region of
// its connection's domain (CallPD): the caller gets it byte for byte, from
// one byte to 1 MiB and across MaxInline, concurrently too, and above
// MaxInline the server takes no rendezvous region of its own (no copy).
// What the handler returns after Respond is not sent, and a second
// Respond fails. Regions Respond must refuse are refused before anything
// is sent, and the handler then answers as usual. Outside a handler,
// Respond fails and CallPD is nil.
func TestRPCRespond(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const bufSize, size = 4096, 1 << 20
	const maxInline = bufSize - msg.HeaderSize
	otherPD, err := bufpool.OpenPD(ctx, rxetest.Addr(t))
	require.NoError(t, err)
	defer otherPD.Close()
	others, err := bufpool.NewRegion(otherPD, 1<<16, bufpool.RemoteRead)
	require.NoError(t, err)
	defer others.Close()

	// Made by the first call, in the domain of the server's connection.
	var setup sync.Once
	var region, writeOnly, closed *bufpool.Region
	var setupErr error
	handlerErrs := make(chan error, 64)
	h := func(ctx context.Context, method string, req []byte) ([]byte, error) {
		setup.Do(func() {
			pd := msg.CallPD(ctx)
			if region, setupErr = bufpool.NewRegion(pd, size, bufpool.RemoteRead); setupErr != nil {
				return
			}
			pattern(region.Bytes(), 7)
			if writeOnly, setupErr = bufpool.NewRegion(pd, 1<<16, bufpool.RemoteWrite); setupErr != nil {
				return
			}
			if closed, setupErr = bufpool.NewRegion(pd, 1<<16, bufpool.RemoteRead); setupErr == nil {
				setupErr = closed.Close()
			}
		})
		if setupErr != nil {
			return nil, setupErr
		}
		switch method {
		case "lend":
			n := int(binary.LittleEndian.Uint32(req))
			if err := msg.Respond(ctx, region, n); err != nil {
				return nil, err
			}
			if err := msg.Respond(ctx, region, n); !errors.Is(err, endpoint.ErrInvalid) {
				handlerErrs <- fmt.Errorf("a second Respond: %v, want one matching ErrInvalid", err)
			}
			return []byte("not sent"), nil
		case "refused":
			for name, r := range lendingRefusals(writeOnly, others, closed, region) {
				if err := msg.Respond(ctx, r.region, r.n); !errors.Is(err, r.want) {
					handlerErrs <- fmt.Errorf("Respond with a region %s: %v, want one matching %v", name, err, r.want)
				}
			}
			return []byte("answered"), nil
		}
		return nil, fmt.Errorf("no method %q", method)
	}
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), msg.WithBufferSize(bufSize))
	require.NoError(t, err)
	s := msg.NewServer(h)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, l) }()
	cl, err := msg.DialClient(ctx, l.Addr().String(), msg.WithBufferSize(bufSize))
	require.NoError(t, err)
	lend := func(n int) ([]byte, error) {
		return cl.Call(ctx, "lend", binary.LittleEndian.AppendUint32(nil, uint32(n)))
	}

	_, err = lend(1) // makes the regions
	require.NoError(t, err)
	before := s.Stats().Conns[0]
	lent := 0
	sent := func() uint64 { st := s.Stats().Conns[0]; return st.MessagesSent - st.CreditMessagesSent }
	for _, n := range []int{size, 100000, maxInline + 1, maxInline, 1} {
		sentBefore := sent()
		got, err := lend(n)
		require.NoError(t, err, "%d bytes", n)
		require.True(t, bytes.Equal(region.Bytes()[:n], got), "%d bytes: the response differs", n)
		if n > maxInline {
			lent++
		}
		require.Eventually(t, func() bool { return s.Stats().CallsInFlight == 0 }, 10*time.Second, time.Millisecond,
			"%d bytes: the handler returned", n) // and whatever it sent is counted
		require.Equal(t, sentBefore+1, sent(), "%d bytes: one answer, the handler's own return not sent", n)
	}
	after := s.Stats().Conns[0]
	require.Equal(t, before.RegionCacheHits+before.RegionCacheMisses, after.RegionCacheHits+after.RegionCacheMisses,
		"the server took no rendezvous region of its own")
	require.Equal(t, before.RendezvousSent+uint64(lent), after.RendezvousSent, "lent by rendezvous above MaxInline")

	concurrently(t, 4, func(i int) error {
		for range 5 {
			got, err := lend(256 << 10)
			if err != nil {
				return err
			}
			if !bytes.Equal(region.Bytes()[:256<<10], got) {
				return fmt.Errorf("caller %d: the response differs", i)
			}
		}
		return nil
	})

	sentBefore := s.Stats().Conns[0].MessagesSent - s.Stats().Conns[0].CreditMessagesSent
	got, err := cl.Call(ctx, "refused", nil)
	require.NoError(t, err)
	require.Equal(t, "answered", string(got), "after the refusals the handler answers as usual")
	now := s.Stats().Conns[0]
	require.Equal(t, sentBefore+1, now.MessagesSent-now.CreditMessagesSent, "a refused Respond sends nothing")

	require.ErrorIs(t, msg.Respond(ctx, others, 1), endpoint.ErrInvalid, "outside a handler")
	require.Nil(t, msg.CallPD(ctx), "outside a handler")
	require.NoError(t, cl.Close())
	require.NoError(t, s.Shutdown(ctx)) // waits for the handlers
	require.ErrorIs(t, <-served, msg.ErrShutdown)
	close(handlerErrs)
	for err := range handlerErrs {
		require.NoError(t, err)
	}
	require.NoError(t, region.Close())
	require.NoError(t, writeOnly.Close())
}
