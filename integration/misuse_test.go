package integration

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// TestMisusedPostsAreRefused: every request that cannot be what the caller
// meant is refused with ErrInvalid before anything is posted (nothing
// completes), instead of a panic or a field silently ignored; the endpoint
// works on.
func TestMisusedPostsAreRefused(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	other := connect(t, ctx)
	pool := newPool(t, p.client, 64, 2)
	foreign := newPool(t, other.client, 64, 1)
	b, _ := pool.TryGet()
	back, _ := pool.TryGet()
	require.NoError(t, pool.Put(back)) // held, but back in its pool
	fb, _ := foreign.TryGet()
	region, err := bufpool.NewRegion(p.server.PD(), 64, bufpool.RemoteWrite|bufpool.RemoteAtomic)
	require.NoError(t, err)
	remote := region.Remote()
	closed, err := bufpool.NewRegion(p.client.PD(), 64, 0)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	for name, post := range map[string]func() error{
		"PostRecv with a nil buffer": func() error { return p.client.PostRecv("x", nil) },
		"PostSend with a nil buffer": func() error { return p.client.PostSend("x", nil, 0) },
		"a buffer put back":          func() error { return p.client.PostSend("x", back, 8) },
		"a closed region's buffer":   func() error { return p.client.PostSend("x", closed.Buffer(), 8) },
		"another connection's PD":    func() error { return p.client.PostSend("x", fb, 8) },
		"length past the buffer":     func() error { return p.client.PostWrite("x", b, 65, remote) },
		"a negative length":          func() error { return p.client.PostSend("x", b, -1) },
		"Imm without HasImm": func() error {
			return p.client.PostBatch([]endpoint.Request{{Op: endpoint.OpSend, Buffer: b, Length: 8, Imm: 7}})
		},
		"Add on a compare-and-swap": func() error {
			return p.client.PostBatch([]endpoint.Request{{Op: endpoint.OpCompareAndSwap, Buffer: b, Length: 8, Remote: remote, Add: 1}})
		},
		"Compare on a fetch-and-add": func() error {
			return p.client.PostBatch([]endpoint.Request{{Op: endpoint.OpFetchAndAdd, Buffer: b, Length: 8, Remote: remote, Compare: 1}})
		},
		"Remote on a send": func() error {
			return p.client.PostBatch([]endpoint.Request{{Op: endpoint.OpSend, Buffer: b, Length: 8, Remote: remote}})
		},
		"immediate data on a read": func() error {
			return p.client.PostBatch([]endpoint.Request{{Op: endpoint.OpRead, Buffer: b, Length: 8, Remote: remote, HasImm: true}})
		},
		"Inline and NoInline": func() error { return p.client.PostSend("x", b, 8, endpoint.Inline|endpoint.NoInline) },
		"Silent on a read":    func() error { return p.client.PostRead("x", b, 8, remote, endpoint.Silent) },
		"Solicited on a write without immediate data": func() error {
			return p.client.PostWrite("x", b, 8, remote, endpoint.Solicited)
		},
		"unknown flags": func() error { return p.client.PostSend("x", b, 8, endpoint.Flags(0x80)) },
		"a receive op that is a completion's": func() error {
			return p.client.PostBatch([]endpoint.Request{{Op: endpoint.OpRecvWriteImm, Buffer: b}})
		},
		"a Buffer and Segments": func() error {
			s, _ := b.Segment(0, 8)
			return p.client.PostBatch([]endpoint.Request{{Op: endpoint.OpSend, Buffer: b, Length: 8, Segments: []bufpool.Segment{s}}})
		},
		"the zero Segment": func() error { return p.client.PostSendv("x", []bufpool.Segment{{}}) },
	} {
		err := post()
		require.ErrorIs(t, err, endpoint.ErrInvalid, name)
		t.Logf("%s: %v", name, err)
	}
	select {
	case c := <-p.client.Completions():
		t.Fatalf("a refused post delivered %+v", c)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, pool.Put(b))
	require.NoError(t, foreign.Put(fb))
	require.NoError(t, region.Close())
	require.NoError(t, echoOnce(t, ctx, p), "the endpoint works on")
}

// TestFailedRequestEndsTheEndpoint: a work request that fails on the
// device moves the QP to the error state; the endpoint says so (Done, Err
// with the *CompletionError), disconnects, so that the peer hears, and
// refuses later posts with that error, from
// the failed completion on, instead of accepting them: the device would
// never complete them (FuzzPostRequest once posted a receive in that
// window, and waited for it in vain).
func TestFailedRequestEndsTheEndpoint(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	_, remote := exchangeRegion(t, ctx, p, 4096, bufpool.RemoteRead)
	pool := newPool(t, p.client, 64, 1)
	b, _ := pool.TryGet()
	require.NoError(t, p.client.PostWrite("forbidden", b, 8, remote, endpoint.NoInline))
	c := next(t, p.client)
	if rxetest.IWARP() { // the write completes; the peer's refusal ends the connection
		requireRefused(t, p.client, c)
		err := p.client.PostWrite("after", b, 8, remote)
		require.ErrorIs(t, err, endpoint.ErrClosed, "posts after the end are refused with it")
		require.ErrorIs(t, err, p.client.Err())
		require.NoError(t, pool.Put(b))
		return
	}
	var ce *endpoint.CompletionError
	require.ErrorAs(t, c.Err, &ce)
	// At once, before Done closes: a receive posted now would never
	// complete (the device flushed only what it held when it failed).
	err := p.client.PostRecv("too late", b)
	require.ErrorAs(t, err, &ce, "a post right after the failure is refused with it")
	require.Equal(t, endpoint.StatusRemoteAccess, ce.Status)
	require.ErrorIs(t, err, endpoint.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed)
	select {
	case <-p.client.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done still open after a failed work request")
	}
	require.ErrorAs(t, p.client.Err(), &ce)
	require.Equal(t, endpoint.StatusRemoteAccess, ce.Status)
	// The peer hears now, not when this side's application closes: the
	// endpoint disconnects when the failure ends it.
	select {
	case <-p.server.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the peer did not hear that the connection ended")
	}
	require.ErrorIs(t, p.server.Err(), cm.ErrPeerDisconnected)
	err = p.client.PostWrite("after", b, 8, remote)
	require.ErrorAs(t, err, &ce, "posts after the end are refused with the failure")
	require.NoError(t, pool.Put(b))
}

// TestSendWithoutReceiveFailsInBoundedTime: with cm's defaults, a send the
// peer never posts a receive for fails with StatusRNRRetryExc once the
// retries are spent (at least 6 x 20.48 ms), and the endpoint ends with that error,
// instead of the send waiting for ever (retry count 7).
func TestSendWithoutReceiveFailsInBoundedTime(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	if rxetest.IWARP() {
		requireUnreceivedSendEndsConnection(t, p)
		return
	}
	pool := newPool(t, p.client, 64, 1)
	b, _ := pool.TryGet()
	start := time.Now()
	require.NoError(t, p.client.PostSend("unreceived", b, 8))
	c := next(t, p.client)
	took := time.Since(start)
	var ce *endpoint.CompletionError
	require.ErrorAs(t, c.Err, &ce, "the send completed without a receive")
	require.Equal(t, endpoint.StatusRNRRetryExc, ce.Status)
	require.Equal(t, "unreceived", c.Context)
	select {
	case <-p.client.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done still open after the RNR retries ran out")
	}
	require.ErrorAs(t, p.client.Err(), &ce)
	require.NoError(t, pool.Put(c.Buffer))
	t.Logf("the send failed %v after it was posted", took)
}

// requireUnreceivedSendEndsConnection: iWARP has no RNR retry. A send that
// finds no receive posted makes the receiver terminate the connection
// (siw logs "got TERMINATE"), while the sender's completion may still say
// success (a send completes once TCP has it): both endpoints end, in
// bounded time. This is why msg's credits are a requirement on iWARP.
func requireUnreceivedSendEndsConnection(t *testing.T, p *pair) {
	t.Helper()
	pool := newPool(t, p.client, 64, 1)
	b, _ := pool.TryGet()
	require.NoError(t, p.client.PostSend("unreceived", b, 8))
	c := next(t, p.client)
	require.Equal(t, "unreceived", c.Context)
	require.NoError(t, pool.Put(c.Buffer))
	for name, ep := range map[string]*endpoint.Endpoint{"sender": p.client, "receiver": p.server} {
		select {
		case <-ep.Done():
			t.Logf("%s: %v (the send's own completion: %v)", name, ep.Err(), c.Err)
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s outlived a send that found no receive", name)
		}
	}
}

// TestCloseWithoutReadingCompletions: an endpoint whose Completions nobody
// reads, holding more completions than its channel, still frees its
// goroutines (goleak checks the binary) and puts every buffer back after
// Close and the close timeout.
func TestCloseWithoutReadingCompletions(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const depth = 4
	l, client, server, err := dialPair(ctx, rxetest.Addr(t), cm.WithQueueDepth(depth), cm.WithCloseTimeout(200*time.Millisecond))
	require.NoError(t, err)
	defer l.Close()
	defer closeAndDrain(t, client)
	defer server.Close() // idempotent: the test closes it without reading
	rpool, err := bufpool.New(server.PD(), bufpool.Size(64), bufpool.Count(4*depth))
	require.NoError(t, err)
	defer rpool.Close()
	spool := newPool(t, client, 64, depth)
	// The server posts and is sent 3*depth messages without reading one
	// completion: its channel holds 2*depth, the rest queue behind it.
	for range 3 {
		for range depth {
			rb, ok := rpool.TryGet()
			require.True(t, ok)
			// The previous round's receives completed at the device; their
			// slots come back when the server's goroutine has polled them.
			require.Eventually(t, func() bool {
				err := server.PostRecv("unread", rb)
				require.True(t, err == nil || errors.Is(err, endpoint.ErrQueueFull), "%v", err)
				return err == nil
			}, 5*time.Second, time.Millisecond)
		}
		for range depth {
			sb, _ := spool.TryGet()
			require.NoError(t, client.PostSend("sent", sb, 8))
			c := next(t, client)
			require.NoError(t, c.Err)
			require.NoError(t, spool.Put(c.Buffer))
		}
	}
	require.Equal(t, 3*depth, rpool.Stats().Out)
	require.NoError(t, server.Close())
	deadline := time.Now().Add(5 * time.Second)
	for rpool.Stats().Out != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	require.Zero(t, rpool.Stats().Out, "buffers of completions nobody read came back")
	_, open := <-server.Completions()
	require.False(t, open, "the channel is closed")
	require.NoError(t, rpool.Close())
}

// TestPutOfPostedBufferIsRefused: a buffer a work request still uses is
// the device's; its pool refuses it back (ErrPosted) and changes nothing
// until the completion comes back.
func TestPutOfPostedBufferIsRefused(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	pool := newPool(t, p.server, 64, 2)
	b, _ := pool.TryGet()
	require.NoError(t, p.server.PostRecv("waiting", b))
	require.ErrorIs(t, pool.Put(b), bufpool.ErrPosted)
	require.Equal(t, 1, pool.Stats().Out, "a refused Put changes nothing")
	cpool := newPool(t, p.client, 64, 1)
	sb, _ := cpool.TryGet()
	require.NoError(t, p.client.PostSend("send", sb, 8))
	require.NoError(t, next(t, p.client).Err)
	require.NoError(t, cpool.Put(sb))
	c := next(t, p.server)
	require.NoError(t, c.Err)
	require.NoError(t, pool.Put(c.Buffer), "after its completion the buffer goes back")
}

// TestSendWithoutCreditSaysWhy: a receiver that keeps messages from
// RecvMessage without releasing them holds the sender's credits; the
// sender's Send fails when its ctx ends, with an error that says why and
// still matches the ctx's.
func TestSendWithoutCreditSaysWhy(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx, msg.WithRecvDepth(6))
	var held []*msg.Message
	defer func() {
		for _, m := range held {
			m.Release()
		}
	}()
	for i := range 3 { // three credits of the six stay back for the protocol's messages
		require.NoError(t, client.Send(ctx, []byte{byte(i)}))
		m, err := server.RecvMessage(ctx)
		require.NoError(t, err)
		held = append(held, m) // and never released
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err := client.Send(short, []byte("stuck"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "without Release")
	t.Logf("%v", err)
}
