//go:build rdmacm_faultinject

package integration

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/verbs"
	"github.com/go-rdma/rdmacm/msg"
)

// TestInjectedCompletionFailureEndsTheEndpoint: when polling the CQ,
// reading its channel's event or arming the CQ fails (no device fails them
// on purpose: the poll that finds the client's RDMA write, the read of the
// event it raised, or every arm after it, is made to fail, make
// test-faults), the endpoint ends by itself, within a bound and without
// anyone calling Close: Done closes with that failure, which matches
// ErrClosed but not net.ErrClosed; the write's completion still comes
// back; the receive it had posted comes back flushed with the same cause;
// posts are refused with it; and the peer hears at once, because the
// endpoint disconnects (without that, the posted receive would hold the
// close for the close timeout). After Close, posts say net.ErrClosed and
// Err keeps the failure; nothing leaks. A failed arm must end it: an
// unarmed CQ raises no event, and the endpoint would wait for ever.
func TestInjectedCompletionFailureEndsTheEndpoint(t *testing.T) {
	for _, fault := range []struct {
		name string
		arm  func(error)
	}{
		{"poll", func(err error) { verbs.FailNextPollFinding(verbs.WCRDMAWrite, err) }},
		{"channel", func(err error) { verbs.FailCQEvents(err, 1) }}, // the client's endpoint sleeps on it: nobody calls Next
		{"arm", func(err error) { verbs.FailCQArms(err, verbs.ForGood) }},
	} {
		t.Run(fault.name, func(t *testing.T) { testCompletionFailure(t, fault.arm) })
	}
}

func testCompletionFailure(t *testing.T, arm func(error)) {
	injected := errors.New("injected failure")
	f := writeOverFault(t, func() { arm(injected) })
	p := f.pair
	err := p.client.Err()
	require.ErrorIs(t, err, injected)
	require.ErrorIs(t, err, endpoint.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	select {
	case <-p.server.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the peer did not hear of the end: the failed endpoint did not disconnect")
	}
	require.ErrorIs(t, p.server.Err(), cm.ErrPeerDisconnected)

	write, recv := f.completions(t)
	require.NoError(t, write.Err, "the write finished before the failure")
	require.ErrorIs(t, recv.Err, injected, "the receive, flushed by the failure's close")
	require.NotErrorIs(t, recv.Err, net.ErrClosed)
	require.NoError(t, f.pool.Put(f.rb))

	err = p.client.PostWrite("after", f.wb, 64, f.region.Remote())
	require.ErrorIs(t, err, injected, "a post before Close says why the endpoint ended")

	require.NoError(t, p.client.Close())
	err = p.client.PostWrite("closed", f.wb, 64, f.region.Remote())
	require.ErrorIs(t, err, net.ErrClosed, "after Close, as net's conns do")
	require.ErrorIs(t, p.client.Err(), injected, "Err keeps why it ended")
	require.NoError(t, f.pool.Put(f.wb))
}

// TestInjectedLostDeviceEndsTheEndpointQuietly: when the device goes away
// (made so: every read of a completion event, every arm of a CQ, the
// rdma_disconnect and the move of the QP to the error state fail), the
// endpoint ends with the failure, and its close, which can neither hear
// from the channel nor get its posted receive flushed, waits out its
// bound polling the CQ, where waiting on the failed channel again would
// fail at once, over and over: a spin that logs each failed arm. The
// write's completion still comes back, the receive then comes back with
// the failure, and nothing leaks.
func TestInjectedLostDeviceEndsTheEndpointQuietly(t *testing.T) {
	gone := errors.New("injected: the device went away")
	tries := verbs.Injected()
	const closeTimeout = time.Second
	f := writeOverFault(t, func() {
		verbs.FailCQEvents(gone, verbs.ForGood)
		verbs.FailCQArms(gone, verbs.ForGood)
		verbs.FailQPMoves(gone, verbs.ForGood)
		verbs.FailNextDisconnect(gone)
	}, cm.WithCloseTimeout(closeTimeout))
	require.ErrorIs(t, f.client.Err(), gone)

	closing := time.Now()
	require.NoError(t, f.client.Close())
	require.Less(t, time.Since(closing), closeTimeout+5*time.Second, "Close is bounded by its timeout")
	// The read of the event and the move to the error state, once each.
	require.LessOrEqual(t, verbs.Injected()-tries, 3, "the failed channel was tried again and again")
	write, recv := f.completions(t)
	require.NoError(t, write.Err, "the write finished before the device went away")
	require.ErrorIs(t, recv.Err, gone, "the receive, given back at teardown")
	require.NoError(t, f.pool.Put(f.rb))
	require.NoError(t, f.pool.Put(f.wb))
}

// faultedWrite is writeOverFault's pair: the client's posted receive
// ("recv", rb) and its RDMA write ("write", wb, 64 bytes) into the
// server's region.
type faultedWrite struct {
	*pair
	region *bufpool.Region
	pool   *bufpool.Pool
	rb, wb *bufpool.Buffer
}

// writeOverFault connects a pair (with opts), has the client post a
// receive, then, once arm has armed the faults, an RDMA write, and returns
// when the client's Done closes. Faults armed for good are disarmed at
// cleanup, before the server's Close would meet them.
func writeOverFault(t *testing.T, arm func(), opts ...cm.Option) *faultedWrite {
	t.Helper()
	ctx := testContext(t)
	rxetest.CheckResources(t)
	f := &faultedWrite{pair: connect(t, ctx, opts...)}
	var err error
	f.region, err = bufpool.NewRegion(f.server.PD(), 4096, bufpool.RemoteWrite)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.region.Close()) })
	f.pool = newPool(t, f.client, 4096, 2)
	f.rb, _ = f.pool.TryGet()
	require.NoError(t, f.client.PostRecv("recv", f.rb))
	f.wb, _ = f.pool.TryGet()

	arm()
	t.Cleanup(disarmDeviceFaults)
	require.NoError(t, f.client.PostWrite("write", f.wb, 64, f.region.Remote()))
	select {
	case <-f.client.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the endpoint did not end after the fault")
	}
	return f
}

// completions takes the client's two completions, in whichever order
// they come.
func (f *faultedWrite) completions(t *testing.T) (write, recv endpoint.Completion) {
	t.Helper()
	got := map[any]endpoint.Completion{}
	for range 2 {
		c := next(t, f.client)
		got[c.Context] = c
	}
	return got["write"], got["recv"]
}

// disarmDeviceFaults disarms every device fault a test may have armed,
// for good or for a count not used up.
func disarmDeviceFaults() {
	verbs.FailCMEvents(nil, 0)
	verbs.FailAsyncEvents(nil, 0)
	verbs.FailCQEvents(nil, 0)
	verbs.FailCQArms(nil, 0)
	verbs.FailQPMoves(nil, 0)
	verbs.FailNextDisconnect(nil)
	verbs.FailIPv6Listens(nil)
	verbs.FailNextCompletion(0, verbs.WCSuccess)
	verbs.HoldCompletions(0, false)
	verbs.HoldShrunkCQ(false)
	verbs.RewriteNextAsyncEvent(0)
	verbs.FailCreate(0, 0, nil)
	verbs.FailNextPost(false, 0, nil)
	verbs.ShrinkCQ(0, 0)
}

// TestInjectedPollFailureEndsAMsgConn: a msg connection whose endpoint's
// CQ poll fails (the poll that finds the next message received) ends with
// that failure: its reader gets the message that had arrived, then the
// failure, not io.EOF and not net.ErrClosed, and so does Err; the peer,
// which did nothing wrong, ends with cm.ErrPeerDisconnected. Nothing hangs
// or leaks.
func TestInjectedPollFailureEndsAMsgConn(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server := quietMsgPair(t, ctx)

	injected := errors.New("injected CQ poll failure")
	verbs.FailNextPollFinding(verbs.WCRecv, injected)
	require.NoError(t, client.Send(ctx, []byte("last")))
	// The message the failed poll found had arrived whole, and the poll
	// after it finds it again: it is read before the end, not lost.
	got, err := server.Recv(ctx)
	require.NoError(t, err, "the message that arrived before the failure")
	require.Equal(t, "last", string(got))
	_, err = server.Recv(ctx)
	require.ErrorIs(t, err, injected, "the reader learns why")
	require.ErrorIs(t, err, msg.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	require.NotErrorIs(t, err, io.EOF, "no orderly end")
	require.ErrorIs(t, server.Err(), injected)

	checkFaultEnded(t, ctx, server, client, injected)
}

// TestInjectedRefusalMidBatchLosesNothing: a device that refuses a request
// in the middle of a batch (made to, in the tagged build) leaves the
// endpoint as the device left its queues. The error names the refused
// request; the requests before it are the device's and complete once
// each, it and those after it are the caller's again at once (their
// buffers go back to the pool, where a posted receive's is refused), and
// the endpoint goes on: what the caller
// posts next follows what was posted, in order, on both sides. After a
// refused receive, no send of its batch goes out.
func TestInjectedRefusalMidBatchLosesNothing(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	spool := newPool(t, p.server, 64, 4)
	for range 4 {
		b, _ := spool.TryGet()
		require.NoError(t, p.server.PostRecv(nil, b))
	}
	pool := newPool(t, p.client, 64, 8)
	take := func(payload string) *bufpool.Buffer {
		b, ok := pool.TryGet()
		require.True(t, ok)
		copy(b.Bytes(), payload)
		return b
	}
	send := func(payload string) endpoint.Request {
		return endpoint.Request{Op: endpoint.OpSend, Context: payload, Buffer: take(payload), Length: len(payload)}
	}
	recv := func(name string) endpoint.Request {
		return endpoint.Request{Op: endpoint.OpRecv, Context: name, Buffer: take("")}
	}
	injected := errors.New("injected refusal")

	// A send refused: the second of three, behind a receive.
	batch := []endpoint.Request{recv("r1"), send("a"), send("b"), send("c")}
	verbs.FailNextPost(false, 1, injected)
	err := p.client.PostBatch(batch)
	pe, ok := errors.AsType[*endpoint.PostError](err)
	require.Truef(t, ok, "want a *endpoint.PostError, got %v", err)
	require.Equal(t, 2, pe.Index, "the batch's second send")
	require.ErrorIs(t, err, injected)
	for _, r := range batch[2:] {
		require.NoError(t, pool.Put(r.Buffer), "%v was refused: its buffer is the caller's", r.Context)
	}
	require.Error(t, pool.Put(batch[0].Buffer), "the receive was posted: its buffer is the device's")
	require.NoError(t, p.client.PostBatch([]endpoint.Request{send("b"), send("c")}))

	// A receive refused: the second of two; the send behind them stays.
	batch = []endpoint.Request{recv("r2"), recv("r3"), send("d")}
	verbs.FailNextPost(true, 1, injected)
	err = p.client.PostBatch(batch)
	pe, ok = errors.AsType[*endpoint.PostError](err)
	require.Truef(t, ok, "want a *endpoint.PostError, got %v", err)
	require.Equal(t, 1, pe.Index, "the batch's second receive")
	require.ErrorIs(t, err, injected)
	require.NoError(t, pool.Put(batch[1].Buffer), "the refused receive's buffer is the caller's")
	require.NoError(t, pool.Put(batch[2].Buffer), "the send behind a refused receive was not posted")
	require.Error(t, pool.Put(batch[0].Buffer), "the receive before it was posted")
	require.NoError(t, p.client.PostSend("e", take("e"), 1))

	for _, want := range []string{"a", "b", "c", "e"} {
		c := next(t, p.server)
		require.NoError(t, c.Err)
		require.Equal(t, want, string(c.Buffer.Bytes()[:c.Len]), "the server receives what was posted, in order, once")
		require.NoError(t, spool.Put(c.Buffer))
	}
	for range 2 {
		b, _ := spool.TryGet()
		require.NoError(t, p.server.PostSend(nil, b, copy(b.Bytes(), "reply")))
	}

	got := map[any]int{}
	for range 6 { // the sends a, b, c, e and the receives r1, r2
		c := next(t, p.client)
		require.NoError(t, c.Err, "%v", c.Context)
		got[c.Context]++
		require.NoError(t, pool.Put(c.Buffer))
	}
	require.Equal(t, map[any]int{"a": 1, "b": 1, "c": 1, "e": 1, "r1": 1, "r2": 1}, got)
	st := p.client.Stats()
	require.EqualValues(t, 4, st.SendRequests, "refused requests are not counted as posted")
	require.EqualValues(t, 2, st.RecvRequests)
	require.EqualValues(t, 6, st.Completions)
}

// TestInjectedRefusedPostEndsAMsgConn: a msg message the device refuses
// (made to, in the tagged build) ends the connection, since a message
// queued behind it may have been reported sent: the sender gets the
// refusal, which matches msg.ErrClosed but not net.ErrClosed, and so do
// Err and every later call until Close; the peer, which did nothing
// wrong, ends with cm.ErrPeerDisconnected. Nothing hangs or leaks.
func TestInjectedRefusedPostEndsAMsgConn(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server := quietMsgPair(t, ctx)

	injected := errors.New("injected refusal")
	verbs.FailNextPost(false, 0, injected)
	err := client.Send(ctx, []byte("refused"))
	require.ErrorIs(t, err, injected, "the sender learns the device refused its message")
	require.ErrorIs(t, err, msg.ErrClosed, "the connection ended")
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	require.ErrorIs(t, client.Err(), injected)
	require.ErrorIs(t, client.Send(ctx, []byte("later")), injected)

	checkFaultEnded(t, ctx, client, server, injected)
}

// TestInjectedRefusedSetupReceive: a receive the device refuses to post in
// a listener's setup step (cm.WithSetup, where msg's listener posts its
// receives) is this side's failure, as an object the device cannot make
// is: the dialer is rejected, the receives posted before the refused one
// come back to their pool, the listener warns its logger, and Accept goes
// on to serve the next dialer. Nothing leaks.
func TestInjectedRefusedSetupReceive(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	t.Cleanup(disarmDeviceFaults)
	refused := errors.New("injected: the device refused a receive")

	t.Run("CM", func(t *testing.T) {
		var log lockedBuffer
		l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithLogger(zerolog.New(&log)))
		require.NoError(t, err)
		defer l.Close()
		const depth = 4
		pools := make(chan *bufpool.Pool, 2)
		// The setup step posts its receives in one batch; the device
		// takes those before a refused one.
		setup := cm.WithSetup(func(ep *endpoint.Endpoint) error {
			p, err := bufpool.New(ep.PD(), bufpool.Size(64), bufpool.Count(depth))
			if err != nil {
				return err
			}
			pools <- p
			batch := make([]endpoint.Request, depth)
			for i := range batch {
				b, _ := p.TryGet()
				batch[i] = endpoint.Request{Op: endpoint.OpRecv, Buffer: b}
			}
			err = ep.PostBatch(batch)
			if pe, ok := errors.AsType[*endpoint.PostError](err); ok {
				for _, r := range batch[pe.Index:] {
					p.Put(r.Buffer) // not posted: the caller's
				}
			}
			return err
		})
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		accepted := acceptInBackground(actx, l, setup)

		// cm's dialer posts nothing: the third receive of the
		// listener's setup step is refused, after two were posted.
		verbs.FailNextPost(true, 2, refused)
		_, err = cm.Dial(ctx, l.Addr().String())
		var rejected *cm.RejectError
		require.ErrorAs(t, err, &rejected, "the dialer of a connection whose receive was refused")
		loggedRefusal(t, &log, 0, refused)
		pool := <-pools
		require.Equal(t, depth, pool.Stats().Free, "the receives posted before the refused one came back")
		require.NoError(t, pool.Close())

		ep, err := cm.Dial(ctx, l.Addr().String())
		require.NoError(t, err, "the next dialer")
		a := <-accepted
		require.NoError(t, a.err)
		closeAndDrain(t, ep)
		closeAndDrain(t, a.ep)
		require.NoError(t, (<-pools).Close())
	})

	t.Run("Msg", func(t *testing.T) {
		var log lockedBuffer
		l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), msg.WithLogger(zerolog.New(&log)))
		require.NoError(t, err)
		defer l.Close()
		// A raw cm dialer, passing for a msg one, posts no receive:
		// the first one posted is the listener's, in its setup step.
		verbs.FailNextPost(true, 0, refused)
		_, err = cm.Dial(ctx, l.Addr().String(), msgHello(t))
		var rejected *cm.RejectError
		require.ErrorAs(t, err, &rejected, "the dialer of a connection whose receive was refused")
		loggedRefusal(t, &log, 0, refused)
		requireListenerServes(t, ctx, l)
	})
}

// TestInjectedBufferWaitGivesItsCreditBack: a msg send takes a credit,
// then a send buffer. One that waits for a buffer until its context ends
// (the device made to hold back send completions, make test-faults, so
// that the client's few buffers stay in flight) fails with the context's
// error, not the error of a credit wait, and gives the credit back: once
// the completions come, the client still sends, to a server that reads
// nothing, its whole receive depth less the credits kept back for the
// control loop, and then waits for a credit. The server reads every
// message once, in order, and the client the one the server sent.
func TestInjectedBufferWaitGivesItsCreditBack(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const clientDepth, serverDepth, reserve = 6, 16, 3
	quiet := msg.WithKeepalive(0, 0)
	// The client's receive depth is its number of send buffers.
	client, server, _ := unevenMsgPair(t, ctx, []msg.Option{msg.WithRecvDepth(serverDepth), quiet},
		[]msg.Option{msg.WithRecvDepth(clientDepth), quiet})

	t.Cleanup(disarmDeviceFaults)
	// sendFrom sends the messages from, from+1, ... until one fails or
	// most have gone; it returns how many have gone and the failure.
	sendFrom := func(from, most int) (int, error) {
		for ; from < most; from++ {
			ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err := client.Send(ctx, []byte(strconv.Itoa(from)))
			cancel()
			if err != nil {
				return from, err
			}
		}
		return from, nil
	}
	verbs.HoldCompletions(verbs.WCSend, true)
	sent, err := sendFrom(0, clientDepth+1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "more sends than send buffers, none back")
	require.NotContains(t, err.Error(), "credit", "the send waited for a buffer")
	verbs.HoldCompletions(verbs.WCSend, false)
	// The held completions were taken from the CQ, so none raises the
	// event that would wake the client's endpoint: a message from the
	// server does, as a device's completions would.
	require.NoError(t, server.Send(ctx, []byte("wake")))
	sent, err = sendFrom(sent, serverDepth+1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "more messages than the server's receives")
	require.ErrorContains(t, err, "no credit")
	require.Equal(t, serverDepth-reserve, sent, "messages sent before the credits ran out")
	for i := range sent {
		got, err := server.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(i), string(got))
	}
	got, err := client.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "wake", string(got))
}

// quietMsgPair is a msg connection without keepalives on which each side
// has spoken once, so that nothing else is on its way: a fault armed next
// meets the message the test sends.
func quietMsgPair(t *testing.T, ctx context.Context) (client, server *msg.Conn) {
	t.Helper()
	client, server, _ = msgPair(t, ctx, msg.WithKeepalive(0, 0))
	require.NoError(t, client.Send(ctx, []byte("hello")))
	_, err := server.Recv(ctx)
	require.NoError(t, err)
	require.NoError(t, server.Send(ctx, []byte("hello")))
	_, err = client.Recv(ctx)
	require.NoError(t, err)
	return client, server
}

// checkFaultEnded checks the end of a msg connection that failed with
// injected: its peer, which did nothing wrong, ends with
// cm.ErrPeerDisconnected; after Close, failed refuses calls with
// net.ErrClosed, as net's conns do, and Err keeps why it ended.
func checkFaultEnded(t *testing.T, ctx context.Context, failed, peer *msg.Conn, injected error) {
	t.Helper()
	_, err := peer.Recv(ctx)
	require.ErrorIs(t, err, cm.ErrPeerDisconnected, "the peer did nothing wrong")
	require.NotErrorIs(t, err, injected)
	require.NoError(t, failed.Close())
	require.ErrorIs(t, failed.Send(ctx, []byte("late")), net.ErrClosed)
	require.ErrorIs(t, failed.Err(), injected, "Err keeps why it ended")
}

// TestInjectedDisconnectFailureStillCloses: when rdma_disconnect fails in
// Close (made to, in the tagged build), the endpoint moves its QP to the
// error state itself, so that the device flushes the posted receive at
// once rather than after the close timeout (a minute here); Close then
// tears everything down and succeeds, the receive comes back flushed, and
// the peer still hears, from the id's destruction, with
// cm.ErrPeerDisconnected. Nothing leaks.
func TestInjectedDisconnectFailureStillCloses(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, cm.WithCloseTimeout(time.Minute))
	pool := newPool(t, p.client, 64, 1)
	rb, _ := pool.TryGet()
	require.NoError(t, p.client.PostRecv("recv", rb))

	verbs.FailNextDisconnect(errors.New("injected rdma_disconnect failure"))
	closed := make(chan error, 1)
	go func() { closed <- p.client.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err, "the teardown itself went well")
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a flush that a QP left in RTS never gives")
	}
	c := next(t, p.client)
	require.Equal(t, "recv", c.Context)
	require.ErrorIs(t, c.Err, net.ErrClosed)
	require.NoError(t, pool.Put(c.Buffer))
	select {
	case <-p.server.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the peer did not hear of the close")
	}
	require.ErrorIs(t, p.server.Err(), cm.ErrPeerDisconnected)
}

// TestInjectedUnexplainedFlushEndsTheEndpoint: when the peer's bad request
// fails this side's QP (an RDMA write into a region it may only read: the
// responder moves its QP to the error state) and the peer never says that
// the connection is over (its rdma_disconnect is made to fail, as a
// program that keeps its failed connection open would leave it), this
// side's posted receive comes back flushed, and its Done still closes by
// itself, with an error matching ErrClosed but not net.ErrClosed: on rxe
// the flush, which nothing explained. Without that, Done stayed open until
// the application closed the endpoint.
func TestInjectedUnexplainedFlushEndsTheEndpoint(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	_, remote := exchangeRegion(t, ctx, p, 4096, bufpool.RemoteRead)
	spool := newPool(t, p.server, 64, 1)
	rb, _ := spool.TryGet()
	require.NoError(t, p.server.PostRecv("waiting", rb))
	cpool := newPool(t, p.client, 64, 1)
	wb, _ := cpool.TryGet()

	verbs.FailNextDisconnect(errors.New("injected: the peer keeps its connection"))
	t.Cleanup(func() { verbs.FailNextDisconnect(nil) }) // on siw the TERMINATE ends both sides first
	require.NoError(t, p.client.PostWrite("forbidden", wb, 8, remote, endpoint.NoInline))
	select {
	case <-p.server.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the flushed side's Done stayed open: its peer never said the connection was over")
	}
	err := p.server.Err()
	require.ErrorIs(t, err, endpoint.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	c := next(t, p.server)
	require.Equal(t, "waiting", c.Context)
	var ce *endpoint.CompletionError
	require.ErrorAs(t, c.Err, &ce, "the receive, flushed by the peer's failure")
	require.NoError(t, spool.Put(c.Buffer))
	if !rxetest.IWARP() {
		require.Equal(t, endpoint.StatusFlushed, ce.Status)
		require.ErrorAs(t, err, &ce, "Done's reason is the flush")
		require.Equal(t, endpoint.StatusFlushed, ce.Status)
	}
	c = next(t, p.client)
	require.Equal(t, "forbidden", c.Context)
	require.NoError(t, cpool.Put(c.Buffer))
}

// TestInjectedChannelFailureFailsADatagramRead: when reading the
// completion channel's event fails (made to fail once, make test-faults),
// a ReadFrom waiting on the channel returns that failure at once, not at
// its deadline (the event it could not take would not wake it again), and
// the datagram that raised the event is not lost: the next ReadFrom
// returns it. A read that finds the datagram before it waits meets no
// event; the test then sends another.
func TestInjectedChannelFailureFailsADatagramRead(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	srv, cli, to := resolvedDgramPair(t, ctx)
	if srv == nil {
		return
	}

	injected := errors.New("injected completion channel failure")
	verbs.FailCQEvents(injected, 1)
	t.Cleanup(disarmDeviceFaults)
	const deadline = 15 * time.Second
	buf := make([]byte, 64)
	for i := byte(0); ; i++ {
		require.Less(t, i, byte(5), "no read ever waited on the channel")
		require.NoError(t, srv.SetReadDeadline(time.Now().Add(deadline)))
		read := make(chan error, 1)
		go func() {
			_, _, err := srv.ReadFrom(buf)
			read <- err
		}()
		time.Sleep(200 * time.Millisecond) // for the read to wait
		_, err := cli.WriteTo([]byte{i}, to)
		require.NoError(t, err)
		if err = <-read; err == nil { // it found the datagram before it waited
			require.Equal(t, i, buf[0])
			continue
		}
		require.ErrorIs(t, err, injected)
		require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the failed read left the reader waiting")
		n, _, err := srv.ReadFrom(buf)
		require.NoError(t, err)
		require.Equal(t, []byte{i}, buf[:n], "the datagram whose event failed")
		return
	}
}

// TestInjectedArmFailureFailsADatagramRead: a ReadFrom that finds no
// datagram arms the receive CQ before it waits. With the arm failing (made
// to fail once, make test-faults), that ReadFrom returns the failure at
// once, not at its deadline (an unarmed CQ raises no event to wake it),
// and the Conn reads on: the next datagram arrives.
func TestInjectedArmFailureFailsADatagramRead(t *testing.T) {
	srv, cli, to := faultedDgramPair(t, 4)
	if srv == nil {
		return
	}
	injected := errors.New("injected CQ arm failure")
	fired := verbs.Injected()
	verbs.FailCQArms(injected, 1)
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(15*time.Second)))
	_, _, err := srv.ReadFrom(make([]byte, 64))
	require.ErrorIs(t, err, injected)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the read waited on a CQ it could not arm")
	require.Equal(t, fired+1, verbs.Injected())
	sendDatagram(t, cli, to, srv, "after the failed arm")
}

// TestInjectedSendFailureEndsDatagramWrites: once a write has seen the
// device fail an earlier send (made to fail once, make test-faults: the
// first send's completion), that write and every one after it fail with
// an error matching endpoint.ErrClosed, not net.ErrClosed (only Close
// closes the Conn), and send nothing more; reads go on. With one send
// slot, the second write is the one that must reclaim the first's and so
// sees its failure.
func TestInjectedSendFailureEndsDatagramWrites(t *testing.T) {
	srv, cli, to := faultedDgramPair(t, 1)
	if srv == nil {
		return
	}
	verbs.FailNextCompletion(verbs.WCSend, verbs.WCLocQPOpErr)
	from := sendDatagram(t, cli, to, srv, "posted; its completion fails")
	for _, p := range []string{"the write that sees the failure", "a write after it"} {
		_, err := cli.WriteTo([]byte(p), to)
		require.ErrorIs(t, err, endpoint.ErrClosed, p)
		require.NotErrorIs(t, err, net.ErrClosed, p)
	}
	require.EqualValues(t, 1, cli.Stats().DatagramsSent, "a write after the failure sent a datagram")
	requireReceivedExactly(t, srv)
	sendDatagram(t, srv, from, cli, "reads go on")
}

// TestInjectedHeldSendsBlockDatagramWrites: a writer that finds every
// send slot in flight waits for one (the device made to hold back the
// send completions, make test-faults), until its write deadline, which
// fails it with os.ErrDeadlineExceeded and sends nothing; once the
// completions come, a write with the deadline moved on sends again; and
// Close wakes a writer that waits, with net.ErrClosed.
func TestInjectedHeldSendsBlockDatagramWrites(t *testing.T) {
	srv, cli, to := faultedDgramPair(t, 2)
	if srv == nil {
		return
	}
	verbs.HoldCompletions(verbs.WCSend, true)
	write := func(p string) error {
		_, err := cli.WriteTo([]byte(p), to)
		return err
	}
	require.NoError(t, write("1"))
	require.NoError(t, write("2"))
	require.NoError(t, cli.SetWriteDeadline(time.Now().Add(300*time.Millisecond)))
	start := time.Now()
	err := write("3")
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "the write did not wait for a slot")
	require.EqualValues(t, 2, cli.Stats().DatagramsSent)

	verbs.HoldCompletions(verbs.WCSend, false)
	require.NoError(t, cli.SetWriteDeadline(time.Time{}))
	require.NoError(t, write("3"))
	verbs.HoldCompletions(verbs.WCSend, true)
	require.NoError(t, write("4"))
	wrote := make(chan error, 1)
	go func() { wrote <- write("5") }()
	select {
	case err := <-wrote:
		t.Fatalf("a write went on with every slot in flight: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, cli.Close())
	require.ErrorIs(t, <-wrote, net.ErrClosed)

	requireReceivedExactly(t, srv, "1", "2", "3", "4")
}

// faultedDgramPair is resolvedDgramPair for a device-fault test: the
// client has sendDepth send slots, resources are checked, and the faults
// are disarmed when the test ends. On iWARP it returns nils, as
// resolvedDgramPair does.
func faultedDgramPair(t *testing.T, sendDepth int) (srv, cli *dgram.Conn, to *dgram.Addr) {
	t.Helper()
	ctx := testContext(t)
	rxetest.CheckResources(t)
	srv, cli, to = resolvedDgramPair(t, ctx, dgram.WithSendDepth(sendDepth))
	t.Cleanup(disarmDeviceFaults)
	return srv, cli, to
}

// requireReceivedExactly reads the datagrams want from c, in order, and
// then finds no other for 300 ms.
func requireReceivedExactly(t *testing.T, c *dgram.Conn, want ...string) {
	t.Helper()
	requireReceived(t, c, want...)
	buf := make([]byte, 64)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, _, err := c.ReadFrom(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a datagram arrived after %q", want)
}

// requireReceived reads the datagrams want from c, in order.
func requireReceived(t *testing.T, c *dgram.Conn, want ...string) {
	t.Helper()
	buf := make([]byte, 64)
	for _, w := range want {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		n, _, err := c.ReadFrom(buf)
		require.NoError(t, err)
		require.Equal(t, w, string(buf[:n]))
	}
}

// TestInjectedRefusedDatagramLosesNothing: when the device refuses the
// second datagram of a WriteBatch of three (injected, make test-faults),
// WriteBatch returns 1 and the device's error; the refused datagrams'
// send slots go back at once, so the next batch of three goes in one
// post; Stats counts only what was posted; and the receiver gets every
// datagram written once, in order.
func TestInjectedRefusedDatagramLosesNothing(t *testing.T) {
	srv, cli, to := faultedDgramPair(t, 3)
	if srv == nil {
		return
	}
	batch := func(ps ...string) []dgram.Message {
		ms := make([]dgram.Message, len(ps))
		for i, p := range ps {
			ms[i] = dgram.Message{Buf: []byte(p), Addr: to}
		}
		return ms
	}
	verbs.FailNextPost(false, 1, syscall.ENOMEM)
	n, err := cli.WriteBatch(batch("a", "b", "c"))
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.Equal(t, 1, n, "datagrams sent before the refused one")
	st := cli.Stats()
	require.EqualValues(t, 1, st.DatagramsSent)
	require.EqualValues(t, 1, st.Posts)

	n, err = cli.WriteBatch(batch("b", "c"))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	// Once the receiver has them, the sends so far have completed (on
	// rxe, within their post), and all three slots are free: a slot the
	// refusal kept would split the next batch in two posts.
	requireReceived(t, srv, "a", "b", "c")
	n, err = cli.WriteBatch(batch("d", "e", "f"))
	require.NoError(t, err)
	require.Equal(t, 3, n)
	st = cli.Stats()
	require.EqualValues(t, 6, st.DatagramsSent)
	require.EqualValues(t, 3, st.Posts, "the batch of three after the refusal took more than one post")

	requireReceivedExactly(t, srv, "d", "e", "f")
}

// TestInjectedCMEventFailureFailsResolve: when reading a datagram Conn's
// CM events fails (made to fail once, make test-faults: the read of the
// event that ends the first step of a Resolve), that Resolve and every
// later one fail with the read's failure, not with net.ErrClosed (the
// application closed nothing), and the Conn still exchanges datagrams
// with a peer it had resolved before. The logger given with
// dgram.WithLogger gets the failure, as an error.
func TestInjectedCMEventFailureFailsResolve(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	var log lockedBuffer
	srv, cli, to := resolvedDgramPair(t, ctx, dgram.WithLogger(zerolog.New(&log)))
	if srv == nil {
		return
	}
	other := listenDgram(t, ctx)

	injected := errors.New("injected CM event channel failure")
	verbs.FailCMEvents(injected, 1)
	t.Cleanup(disarmDeviceFaults)
	for range 2 {
		_, err := cli.Resolve(ctx, other.LocalAddr().String())
		require.ErrorIs(t, err, injected)
		require.NotErrorIs(t, err, net.ErrClosed, "the application closed nothing")
	}
	require.Contains(t, log.String(), `{"level":"error","error":"injected CM event channel failure","message":"dgram: reading CM events; the Conn no longer resolves or answers peers"}`)

	sendDatagram(t, cli, to, srv, "still")
}

// TestInjectedCMEventFailureEndsTheSharedChannel: a process's connected
// ids share one CM event channel. When reading it fails (made to fail
// once, make test-faults: the read of the event a new dial raises),
// nothing on it can hear of its connection's end any more, so every
// connection on it ends with the failure (Done and Err carry it, not
// net.ErrClosed), a cm and a msg listener's Accept fail with it, and so
// does the dial; a later Listen and Dial open a channel of their own and
// connect.
func TestInjectedCMEventFailureEndsTheSharedChannel(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	accepted := make(chan error, 1)
	go func() {
		ep, err := p.listener.Accept(ctx)
		if ep != nil {
			ep.Close()
		}
		accepted <- err
	}()
	ml, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	t.Cleanup(func() { ml.Close() })
	msgAccepted := make(chan error, 1)
	go func() {
		c, err := ml.Accept(ctx)
		if c != nil {
			c.Close()
		}
		msgAccepted <- err
	}()

	injected := errors.New("injected CM event channel failure")
	verbs.FailCMEvents(injected, 1)
	t.Cleanup(disarmDeviceFaults)
	ep, err := cm.Dial(ctx, p.listener.Addr().String())
	if ep != nil {
		ep.Close()
	}
	require.ErrorIs(t, err, injected, "the dial whose event could not be read")

	for _, side := range []*endpoint.Endpoint{p.client, p.server} {
		select {
		case <-side.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a connection on the failed channel did not end")
		}
		require.ErrorIs(t, side.Err(), injected)
		require.ErrorIs(t, side.Err(), endpoint.ErrClosed)
		require.NotErrorIs(t, side.Err(), net.ErrClosed, "the application closed nothing")
	}
	for _, accepted := range []chan error{accepted, msgAccepted} {
		select {
		case err := <-accepted:
			require.ErrorIs(t, err, injected)
		case <-time.After(10 * time.Second):
			t.Fatal("Accept did not fail with the listener's channel")
		}
	}

	again := connect(t, ctx)
	require.NoError(t, again.client.Err())
	require.NoError(t, again.server.Err())
}

// TestInjectedDgramListenFailureUndoesItAll: a dgram Listen that fails
// at its last step (rdma_listen, made to fail for IPv6 addresses) returns
// the error and frees everything it made before, the PD and QP among them
// (CheckResources). On iWARP, which has no datagrams, Listen refuses
// before it makes anything.
func TestInjectedDgramListenFailureUndoesItAll(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	dev6 := os.Getenv("RDMACM_TEST_ADDR6")
	require.NotEmpty(t, dev6, "the testbed's IPv6 address")
	verbs.FailIPv6Listens(syscall.EAFNOSUPPORT)
	t.Cleanup(disarmDeviceFaults)
	_, err := dgram.Listen(ctx, net.JoinHostPort(dev6, "0"))
	if rxetest.IWARP() {
		require.ErrorIs(t, err, dgram.ErrNoIWARP)
		return
	}
	require.ErrorIs(t, err, syscall.EAFNOSUPPORT)
	c, err := dgram.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0")) // IPv4 still listens
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// TestInjectedNoIPv6ListensOnIPv4Alone: where the kernel has no IPv6,
// soft-iWARP's rdma_listen on an IPv6 address fails with EAFNOSUPPORT
// (made to fail so on every device, make test-faults). A listener on
// both families (no host, [::]) then listens on IPv4 alone, as net's
// does, and says so in Addr; one on a given IPv6 address fails with the
// error. Nothing of the dropped half is left (CheckResources).
func TestInjectedNoIPv6ListensOnIPv4Alone(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	verbs.FailIPv6Listens(syscall.EAFNOSUPPORT)
	t.Cleanup(disarmDeviceFaults)
	for _, addr := range []string{":0", "[::]:0"} {
		l, err := msg.Listen(ctx, addr)
		require.NoError(t, err, addr)
		bound := l.Addr().(*net.TCPAddr)
		require.True(t, bound.IP.Equal(net.IPv4zero), "%s bound %v, want 0.0.0.0", addr, bound)
		c, s := dialAccepted(t, ctx, l, net.JoinHostPort(rxetest.Addr(t), strconv.Itoa(bound.Port)))
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())
		require.NoError(t, l.Close())
	}
	if dev6 := os.Getenv("RDMACM_TEST_ADDR6"); dev6 != "" {
		_, err := msg.Listen(ctx, net.JoinHostPort(dev6, "0"))
		require.ErrorIs(t, err, syscall.EAFNOSUPPORT)
	}
}

// TestInjectedCQOverrunEndsTheEndpoint: the client's CQ is made too small
// (verbs.ShrinkCQ; the library sizes a CQ so that it cannot overrun),
// and the server's batch of sends completes more receives than it holds
// while the client polls it no more (verbs.HoldShrunkCQ: a poller that
// kept up with the batch would drain the CQ before it overran). The
// device reports the overrun as an asynchronous event (IBV_EVENT_CQ_ERR),
// and completions were lost: the client's endpoint ends at once with
// endpoint.ErrDeviceFailure, which names the event.
// (siw also fails the QP on an overrun and disconnects it, and the CM may
// tell the client of that before the event comes.) Every receive the
// client posted still comes back exactly once (those whose completions
// were lost with ErrClosed), the server hears of the end, and nothing
// leaks.
func TestInjectedCQOverrunEndsTheEndpoint(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const n = 64
	verbs.ShrinkCQ(0, 2) // the client's: its endpoint is made before the server's
	t.Cleanup(disarmDeviceFaults)
	p := connect(t, ctx, withQueueDepth(n))
	rpool, spool := newPool(t, p.client, 64, n), newPool(t, p.server, 64, n)
	for i := range n {
		b, err := rpool.Get(ctx)
		require.NoError(t, err)
		require.NoError(t, p.client.PostRecv(i, b))
	}
	sends := make([]endpoint.Request, n)
	for i := range sends {
		b, err := spool.Get(ctx)
		require.NoError(t, err)
		sends[i] = endpoint.Request{Op: endpoint.OpSend, Context: i, Buffer: b, Length: 64}
	}
	verbs.HoldShrunkCQ(true)
	require.NoError(t, p.server.PostBatch(sends))

	for _, ep := range []*endpoint.Endpoint{p.client, p.server} {
		select {
		case <-ep.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("the connection did not end: client %v, server %v", p.client.Err(), p.server.Err())
		}
	}
	verbs.HoldShrunkCQ(false) // the close's drain takes those held
	err := p.client.Err()
	require.ErrorIs(t, err, endpoint.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	if !rxetest.IWARP() || !errors.Is(err, cm.ErrPeerDisconnected) {
		require.ErrorIs(t, err, endpoint.ErrDeviceFailure)
		require.ErrorContains(t, err, "CQ error")
	}
	t.Logf("client: %v; server: %v", err, p.server.Err())

	got, lost := make([]int, n), 0
	require.NoError(t, p.client.CloseAndDrain(func(c endpoint.Completion) {
		got[c.Context.(int)]++
		if c.Err != nil {
			require.ErrorIs(t, c.Err, endpoint.ErrClosed)
			lost++
		}
		require.NoError(t, rpool.Put(c.Buffer))
	}))
	for i, times := range got {
		require.Equal(t, 1, times, "receive %d came back %d times", i, times)
	}
	require.Positive(t, lost, "the overrun lost completions, so some receives end with the close")
	require.NoError(t, p.server.CloseAndDrain(func(c endpoint.Completion) { require.NoError(t, spool.Put(c.Buffer)) }))
}

// TestInjectedDatagramCQOverrunFailsTheConn: the receiving Conn's receive
// CQ is made too small (verbs.ShrinkCQ: the second CQ dgram.Listen makes,
// after the send CQ), and a batch of 64 datagrams completes more receives
// than it holds before a read polls it. The device reports the overrun
// (IBV_EVENT_CQ_ERR), and the receives whose completions were lost never
// come back to be posted again: once the datagrams it took are read, the
// Conn's reads fail with an error matching endpoint.ErrDeviceFailure that
// names the event, where the Conn would have gone deaf as its receives ran
// out; so do its writes. Close frees everything. On iWARP dgram refuses
// the Conn with its typed error.
func TestInjectedDatagramCQOverrunFailsTheConn(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	verbs.ShrinkCQ(1, 2)
	t.Cleanup(disarmDeviceFaults)
	srv, cli, to := resolvedDgramPair(t, ctx)
	if srv == nil {
		return
	}
	const n = 64
	ms := make([]dgram.Message, n)
	for i := range ms {
		ms[i] = dgram.Message{Buf: []byte(strconv.Itoa(i)), Addr: to}
	}
	sent, err := cli.WriteBatch(ms)
	require.NoError(t, err)
	require.Equal(t, n, sent)

	buf, read := make([]byte, 64), 0
	for {
		require.NoError(t, srv.SetReadDeadline(time.Now().Add(10*time.Second)))
		if _, _, err = srv.ReadFrom(buf); err != nil {
			break
		}
		read++
	}
	t.Logf("read %d of %d datagrams, then: %v", read, n, err)
	require.ErrorIs(t, err, endpoint.ErrDeviceFailure)
	require.ErrorContains(t, err, "CQ error")
	require.Less(t, read, n)
	_, err = srv.WriteTo([]byte("x"), cli.LocalAddr())
	require.ErrorIs(t, err, endpoint.ErrDeviceFailure)
}

// TestInjectedCQOverrunEndsAMsgConn: a msg connection whose CQ overruns
// (verbs.ShrinkCQ: the dialer's, made 2 deep) while 16 of the peer's
// goroutines send to it ends with the device's report of it: its reader
// gets an error matching endpoint.ErrDeviceFailure and msg.ErrClosed, not
// net.ErrClosed nor io.EOF, and so does Err. The dialer polls its CQ no
// more (verbs.HoldShrunkCQ) from the first send, so that the overrun is
// certain: a poller that kept up would drain the CQ first. The senders'
// calls end with errors, none waits for ever, and nothing leaks. (siw
// also disconnects on an overrun, and the CM's word may reach the reader
// first.)
func TestInjectedCQOverrunEndsAMsgConn(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	verbs.ShrinkCQ(0, 2)
	t.Cleanup(disarmDeviceFaults)
	client, server, _ := msgPair(t, ctx, msg.WithKeepalive(0, 0))

	verbs.HoldShrunkCQ(true)
	const senders, each = 16, 200
	sent := make(chan error, senders)
	for range senders {
		go func() {
			for range each {
				if err := server.Send(ctx, []byte("to an overrun CQ")); err != nil {
					sent <- err
					return
				}
			}
			sent <- nil
		}()
	}
	var err error
	read := 0
	for ; err == nil; read++ {
		_, err = client.Recv(ctx)
	}
	verbs.HoldShrunkCQ(false) // the close's drain takes those held
	t.Logf("read %d of %d messages, then: %v", read-1, senders*each, err)
	require.ErrorIs(t, err, msg.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	require.NotErrorIs(t, err, io.EOF, "no orderly end")
	if !rxetest.IWARP() || !errors.Is(err, cm.ErrPeerDisconnected) {
		require.ErrorIs(t, err, endpoint.ErrDeviceFailure)
		require.ErrorContains(t, err, "CQ error")
		require.ErrorIs(t, client.Err(), endpoint.ErrDeviceFailure)
	}
	failed := 0
	for range senders {
		if err := <-sent; err != nil {
			require.ErrorIs(t, err, msg.ErrClosed)
			failed++
		}
	}
	require.Positive(t, failed, "the senders outlived the connection")
}

// TestInjectedQPFailureAloneEndsTheEndpoint: the device reports that the
// server's QP failed (IBV_EVENT_QP_FATAL; injected: a port's event,
// rewritten by verbs.RewriteNextAsyncEvent) while nothing is posted and
// the CM says nothing. The server's endpoint ends by itself once the
// grace it gives the CM's word is over, with an error matching
// endpoint.ErrDeviceFailure and endpoint.ErrClosed, not net.ErrClosed,
// that names the event; it disconnects, so the client ends too, with
// cm.ErrPeerDisconnected.
// Without the event the connection would look up for ever: nothing is
// posted that could complete with an error. Nothing leaks.
func TestInjectedQPFailureAloneEndsTheEndpoint(t *testing.T) {
	netdev := rxetest.Netdev(t)
	ctx := testContext(t)
	rxetest.CheckResources(t)
	t.Cleanup(disarmDeviceFaults)
	p := connect(t, ctx) // the server's QP is made last, once the client's request came
	verbs.RewriteNextAsyncEvent(verbs.AsyncQPFatal)
	// A port's event that leaves the connection as it was: on rxe a new
	// address's GID entry, on siw (which has no GID table, and whose
	// device would not follow a new MAC address) a LID change. Each is
	// undone before the closes: cleanups run last first.
	if rxetest.IWARP() {
		rxetest.SetMAC(t, netdev, "02:00:00:00:00:98")
	} else {
		rxetest.AddAddress(t, netdev, "fd00:98::1/128")
	}

	for _, ep := range []*endpoint.Endpoint{p.server, p.client} {
		select {
		case <-ep.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("the connection did not end: server %v, client %v", p.server.Err(), p.client.Err())
		}
	}
	err := p.server.Err()
	require.ErrorIs(t, err, endpoint.ErrDeviceFailure)
	require.ErrorIs(t, err, endpoint.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	require.ErrorContains(t, err, verbs.AsyncQPFatal.String())
	require.ErrorIs(t, p.client.Err(), cm.ErrPeerDisconnected)
	t.Logf("server: %v; client: %v", err, p.client.Err())
}

// TestInjectedAsyncEventReadFailureIsLogged: reading the device's
// asynchronous events fails (verbs.FailAsyncEvents) at the event its
// netdev going down raises. Each end of a connection on the device logs,
// at error level and with the failure, that the device's failures now go
// unnoticed; on rxe the connection carries on and echoes afterwards. A
// connection made afterwards has the device's events read again, by a new
// reader: each of its ends logs the port's going down and coming back
// once more, while the first connection's ends hear nothing. Nothing
// leaks.
func TestInjectedAsyncEventReadFailureIsLogged(t *testing.T) {
	netdev := rxetest.Netdev(t)
	ctx := testContext(t)
	rxetest.CheckResources(t)
	t.Cleanup(disarmDeviceFaults)
	var log, after lockedBuffer
	p := connect(t, ctx, cm.WithLogger(zerolog.New(&log)))
	rxetest.KeepAddressesOnDown(t, netdev)
	verbs.FailAsyncEvents(errors.New("injected async event failure"), 1)
	rxetest.SetLink(t, netdev, "down")
	logged := func(b *lockedBuffer, what string) func() bool {
		return func() bool { return strings.Count(b.String(), what) == 2 }
	}
	require.Eventually(t, logged(&log, "can no longer be read"), 10*time.Second, 10*time.Millisecond,
		"both ends log the loss: %s", &log)
	require.Equal(t, 2, strings.Count(log.String(), `"level":"error"`), "%s", &log)
	require.Contains(t, log.String(), "injected async event failure")
	rxetest.SetLink(t, netdev, "up")
	if !rxetest.IWARP() { // siw disconnects on a netdev going down (TestPortDownAndUpIsLogged)
		require.NoError(t, echoOnce(t, ctx, p))
	}

	connect(t, ctx, cm.WithLogger(zerolog.New(&after)))
	rxetest.SetLink(t, netdev, "down")
	rxetest.SetLink(t, netdev, "up")
	// The events the dead reader left unread come first, and may add to
	// the count.
	loggedByBoth := func(what string) func() bool {
		return func() bool { return strings.Count(after.String(), what) >= 2 }
	}
	require.Eventually(t, loggedByBoth("went down (IBV_EVENT_PORT_ERR)"), 10*time.Second, 10*time.Millisecond,
		"a new connection's events are read again: %s", &after)
	require.Eventually(t, loggedByBoth("up again (IBV_EVENT_PORT_ACTIVE)"), 10*time.Second, 10*time.Millisecond,
		"a new connection's events are read again: %s", &after)
	require.NotContains(t, log.String(), "went down", "the first connection's reader is gone")
}

// TestInjectedLateGoodbyeStillEndsSendsInOrder: the peer disconnects right
// after its goodbye, and its endpoint may hear of the disconnect, and
// refuse posts, before the goodbye's completion is handled (the device
// made to hold receive completions back, make test-faults). A Send the
// ended endpoint refuses then waits for the messages that arrived before
// the end, and fails with msg.ErrPeerClosed, as after an orderly close,
// not with the disconnect; the reader reads io.EOF.
func TestInjectedLateGoodbyeStillEndsSendsInOrder(t *testing.T) {
	ctx := testContext(t)
	client, server := quietMsgPair(t, ctx)
	t.Cleanup(disarmDeviceFaults)
	verbs.HoldCompletions(verbs.WCRecv, true)
	require.NoError(t, client.Close())
	// The server's endpoint hears the disconnect about as the client's
	// Close returns. A send posted before it heard (it flushes behind the
	// held goodbye) returns nil: the test sends again. The completions
	// come back while the send that the endpoint refused waits for them,
	// well before that endpoint's close would give them up.
	time.Sleep(200 * time.Millisecond)
	sent := make(chan error, 1)
	for waiting := false; !waiting; {
		go func() { sent <- server.Send(ctx, []byte("after the goodbye")) }()
		time.Sleep(10 * time.Millisecond)
		select {
		case err := <-sent:
			require.NoError(t, err, "a send refused before the goodbye was handled")
		default:
			waiting = true
		}
	}
	verbs.HoldCompletions(verbs.WCRecv, false)
	require.ErrorIs(t, <-sent, msg.ErrPeerClosed)
	require.ErrorIs(t, server.Err(), msg.ErrPeerClosed)
	_, err := server.Recv(ctx)
	require.ErrorIs(t, err, io.EOF)
}

// TestInjectedNoControlMessageAfterTheGoodbye: once the peer's goodbye
// came, a side sends it no control message (credits, asks, keepalives):
// the peer sends nothing more, and on iWARP a message that reaches it
// after its device stopped reading resets the connection. The goodbye's
// send completion is held (make test-faults), so that the closing side
// waits in Close, still connected, while the reader releases messages it
// held, which would otherwise owe it a credit message.
func TestInjectedNoControlMessageAfterTheGoodbye(t *testing.T) {
	ctx := testContext(t)
	const depth = 8 // credits are owed once half the receives are released
	client, server, _ := msgPair(t, ctx, msg.WithRecvDepth(depth), msg.WithKeepalive(0, 0))
	t.Cleanup(disarmDeviceFaults)
	held := make([]*msg.Message, 0, depth/2)
	for i := range depth / 2 {
		require.NoError(t, client.Send(ctx, []byte{byte(i)}))
		m, err := server.RecvMessage(ctx)
		require.NoError(t, err)
		held = append(held, m)
	}
	received := server.Stats().MessagesReceived
	verbs.HoldCompletions(verbs.WCSend, true)
	closed := make(chan error, 1)
	go func() { closed <- client.Close() }()
	require.Eventually(t, func() bool { return server.Stats().MessagesReceived > received },
		10*time.Second, 5*time.Millisecond, "the goodbye never came")
	sent := server.Stats().MessagesSent
	for _, m := range held {
		m.Release()
	}
	time.Sleep(300 * time.Millisecond) // a credit message would go at once
	require.Equal(t, sent, server.Stats().MessagesSent, "messages sent to a peer that said goodbye")

	verbs.HoldCompletions(verbs.WCSend, false)
	// The held completions were taken from the CQ, so none raises the
	// event that would wake the closing side: a message does.
	_ = server.Send(ctx, []byte("wake"))
	require.NoError(t, <-closed)
	_, err := server.Recv(ctx)
	require.ErrorIs(t, err, io.EOF)
}
