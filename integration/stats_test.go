package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// TestStatsCountTheTraffic: the counters of an endpoint, a msg connection,
// an RPC client and server match the traffic a test made: messages both
// ways, rendezvous bytes, credit waits with a small receive depth, calls
// and errors, and every send posted with fewer doorbells than requests
// once callers queue up.
func TestStatsCountTheTraffic(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)

	client, server, _ := msgPair(t, ctx, msg.WithRecvDepth(6), msg.WithKeepalive(0, 0))
	const small, large = 50, 3
	big := bytes.Repeat([]byte{7}, 1<<20)
	sent := make(chan error, 1)
	go func() {
		var err error
		for range small {
			err = errors.Join(err, client.Send(ctx, []byte("hello")))
		}
		for range large {
			err = errors.Join(err, client.Send(ctx, big))
		}
		sent <- err
	}()
	for range small + large {
		m, err := server.RecvMessage(ctx)
		require.NoError(t, err)
		m.Release()
	}
	// The sender counts a message once its Send returns, which may be
	// after the receiver has it.
	require.NoError(t, <-sent)
	// A control message is counted sent as the control loop takes its
	// credit, a moment before the endpoint counts its post: the counts
	// are compared once the two agree.
	var cs, ss msg.Stats
	require.Eventually(t, func() bool {
		cs, ss = client.Stats(), server.Stats()
		return cs.Endpoint.SendRequests >= cs.MessagesSent
	}, 5*time.Second, time.Millisecond, "every message counted sent is posted")
	require.GreaterOrEqual(t, cs.MessagesSent, uint64(small+large), "every message sent is counted")
	require.GreaterOrEqual(t, ss.MessagesReceived, uint64(small+large))
	require.Positive(t, ss.CreditMessagesSent, "the server grants credits back: it has nothing else to send")
	require.Equal(t, uint64(large), cs.RendezvousSent)
	require.Equal(t, uint64(large*len(big)), cs.RendezvousBytesSent)
	require.Equal(t, uint64(large), ss.RendezvousReceived)
	require.Equal(t, uint64(large*len(big)), ss.RendezvousBytesReceived)
	require.Positive(t, cs.CreditWaits, "6 receives cannot take 53 messages without a wait")
	require.Positive(t, cs.Endpoint.SendDoorbells)
	require.Positive(t, ss.Endpoint.RecvRequests)
	require.Positive(t, ss.Endpoint.Completions)
	// An event needs a CQ entry that came after the CQ was armed, and one
	// arming gives at most one event: never more events than completions.
	require.Positive(t, ss.Endpoint.CQEvents, "the server slept on its completion channel (event polling)")
	require.LessOrEqual(t, ss.Endpoint.CQEvents, ss.Endpoint.Completions)
	require.Zero(t, cs.Endpoint.Failed+ss.Endpoint.Failed, "no work request failed")
	require.Zero(t, cs.Endpoint.RNRRetryExceeded+ss.Endpoint.RNRRetryExceeded)

	cl, s, stop := rpcClient(t, ctx)
	const callers, calls = 8, 50
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				cl.Call(ctx, "echo", []byte("x"))
			}
		}()
	}
	wg.Wait()
	_, err := cl.Call(ctx, "fail", nil)
	require.Error(t, err)
	// The server counts a call once its answer has gone to the connection,
	// which can be just after the caller has it.
	var st msg.ServerStats
	require.Eventually(t, func() bool {
		st = s.Stats()
		return st.CallsInFlight == 0
	}, 10*time.Second, time.Millisecond, "every handler ends")
	require.Equal(t, uint64(callers*calls+1), st.Calls)
	require.Equal(t, uint64(1), st.Errors)
	require.Zero(t, st.CallsInFlight)
	require.Len(t, st.Conns, 1, "one connection open")
	require.GreaterOrEqual(t, st.Conns[0].MessagesReceived, uint64(callers*calls+1), "each request is a message")
	ct := cl.Stats()
	require.Equal(t, uint64(callers*calls+1), ct.Calls)
	require.Zero(t, ct.CallsInFlight)
	stop()
}

// TestRendezvousRegionsAreReused: a connection keeps its rendezvous regions
// registered from one message to the next (both sides), never hands out a
// byte of an earlier message, and frees them all when it closes (the
// resource check); with the cache off every message maps its own.
func TestRendezvousRegionsAreReused(t *testing.T) {
	for _, c := range []struct {
		name   string
		cache  int
		reused bool
	}{{"cached", 16 << 20, true}, {"off", 0, false}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testContext(t)
			rxetest.CheckResources(t)
			client, server, _ := msgPair(t, ctx, msg.WithRendezvousCache(c.cache))
			sizes := []int{1 << 20, 1 << 20, 700 << 10, 1 << 20, 5000, 5000}
			for i, n := range sizes {
				want := bytes.Repeat([]byte{byte(i + 1)}, n)
				sent := make(chan error, 1)
				go func() { sent <- client.Send(ctx, want) }()
				got, err := server.Recv(ctx)
				require.NoError(t, err)
				require.NoError(t, <-sent)
				require.True(t, bytes.Equal(want, got), "message %d (%d B) intact, nothing of an earlier one", i, n)
			}
			cs, ss := client.Stats(), server.Stats()
			// The 1 MiB and 700 KiB messages share the 1 MiB class, the
			// 5000 B ones the 64 KiB class: one miss per class, each side.
			if c.reused {
				require.Equal(t, uint64(len(sizes)-2), cs.RegionCacheHits, "sender")
				require.Equal(t, uint64(len(sizes)-2), ss.RegionCacheHits, "receiver")
			} else {
				require.Zero(t, cs.RegionCacheHits+ss.RegionCacheHits)
			}
			require.Equal(t, uint64(len(sizes)), cs.RegionCacheHits+cs.RegionCacheMisses)
		})
	}
}

// TestRendezvousCacheIsAListenersBudget: the connections a Listener
// accepts keep their rendezvous regions within one bound together
// (WithRendezvousCache on the Listener), not one each. With room for two
// 1 MiB regions and three connections, the third connection's region makes
// room by closing the one kept longest, another connection's, which that
// connection then maps anew; the one given back last is reused. Once the
// messages are done, the process holds the bound's bytes more than before
// them (the clients keep none).
func TestRendezvousCacheIsAListenersBudget(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const region, conns = 1 << 20, 3
	clients, servers := msgPairsOnOneListener(t, ctx, conns, []msg.Option{msg.WithRendezvousCache(2 * region)},
		msg.WithRendezvousCache(0))
	_, before := rxetest.Registered(t, os.Getpid())

	for turn, i := range []int{0, 1, 2, 0, 2} {
		want := bytes.Repeat([]byte{byte(turn + 1)}, region)
		sent := make(chan error, 1)
		go func() { sent <- clients[i].Send(ctx, want) }()
		got, err := servers[i].Recv(ctx)
		require.NoError(t, err)
		require.NoError(t, <-sent)
		require.True(t, bytes.Equal(want, got), "message %d intact", turn)
	}
	for i, want := range []struct{ hits, misses uint64 }{
		{0, 2}, // its region made room for the third connection's
		{0, 1}, // its region made room when the first one's came back
		{1, 1}, // its region was the last given back
	} {
		st := servers[i].Stats()
		require.Equal(t, want.hits, st.RegionCacheHits, "connection %d's hits", i)
		require.Equal(t, want.misses, st.RegionCacheMisses, "connection %d's misses", i)
	}
	// A client closes its region once the server has read it, which may
	// be after its Send returned.
	var kept int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, registered := rxetest.Registered(t, os.Getpid())
		if kept = registered - before; kept == 2*region || time.Now().After(deadline) {
			break
		}
	}
	require.EqualValues(t, 2*region, kept, "bytes registered beyond the connections' own")
}

// TestRendezvousBudgetSharedUnderLoad: the connections of one Listener
// share their regions' budget safely while they move messages at once and
// some of them end. 4 clients each send 24 messages of three region
// classes (128 KiB to 1 MiB) at once to a Listener that keeps 1 MiB of
// regions, so its connections close each other's regions as they give
// theirs back, and the server closes two of its connections after 12
// messages, whose clients' later Sends fail. Every message received is
// whole, and everything is freed once all is closed (the resource
// check): run under -race.
func TestRendezvousBudgetSharedUnderLoad(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const conns, messages, closeAfter = 4, 24, 12
	sizes := []int{100 << 10, 300 << 10, 1 << 20}
	clients, servers := msgPairsOnOneListener(t, ctx, conns, []msg.Option{msg.WithRendezvousCache(1 << 20)})
	message := func(conn, i int) []byte {
		b := make([]byte, sizes[i%len(sizes)])
		pattern(b, conn*messages+i)
		return b
	}
	// A server that closes right after its closeAfter-th Recv still
	// confirms that message first: the client's Send of it returns nil.
	closes := func(conn int) bool { return conn < 2 }

	errs := make(chan error, 2*conns)
	for conn := range conns {
		go func() { // the client
			for i := range messages {
				err := clients[conn].Send(ctx, message(conn, i))
				switch {
				case err == nil:
				case closes(conn) && i >= closeAfter && errors.Is(err, msg.ErrClosed):
					errs <- nil
					return
				default:
					errs <- fmt.Errorf("client %d, message %d: %w", conn, i, err)
					return
				}
			}
			if closes(conn) {
				errs <- fmt.Errorf("client %d: every Send went through after the server closed", conn)
				return
			}
			errs <- nil
		}()
		go func() { // the server's side
			received := messages
			if closes(conn) {
				received = closeAfter
			}
			for i := range received {
				got, err := servers[conn].Recv(ctx)
				if err != nil {
					errs <- fmt.Errorf("server %d, message %d: %w", conn, i, err)
					return
				}
				if !bytes.Equal(message(conn, i), got) {
					errs <- fmt.Errorf("server %d, message %d: %d bytes, not the ones sent", conn, i, len(got))
					return
				}
			}
			if closes(conn) {
				errs <- servers[conn].Close()
				return
			}
			errs <- nil
		}()
	}
	for range 2 * conns {
		require.NoError(t, <-errs)
	}
	var hits, misses uint64
	for _, s := range servers[2:] {
		st := s.Stats()
		hits, misses = hits+st.RegionCacheHits, misses+st.RegionCacheMisses
	}
	t.Logf("the two connections that stayed: %d region cache hits, %d misses", hits, misses)
	require.EqualValues(t, 2*messages, hits+misses, "every message took a region")
}

// msgPairsOnOneListener dials n clients with dialOpts, one after the
// other, to one Listener with listenOpts, and returns them and the
// connections the Listener accepted, the i-th server the i-th client's
// peer. All close at cleanup.
func msgPairsOnOneListener(t *testing.T, ctx context.Context, n int, listenOpts []msg.Option, dialOpts ...msg.Option) (clients, servers []*msg.Conn) {
	t.Helper()
	l, accepted := listenMsg(t, ctx, n, listenOpts...)
	for i := range n {
		c, err := msg.Dial(ctx, l.Addr().String(), dialOpts...)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		s, ok := <-accepted
		require.True(t, ok, "accept %d", i)
		t.Cleanup(func() { s.Close() })
		clients, servers = append(clients, c), append(servers, s)
	}
	return clients, servers
}

// TestKeepaliveRoundTripIsMeasured: an idle connection's keepalives time
// their round trip, on both sides, and a plausible one: more than nothing,
// less than the keepalive timeout that would have ended the connection.
func TestKeepaliveRoundTripIsMeasured(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)

	const interval, timeout = 20 * time.Millisecond, 2 * time.Second
	client, server, _ := msgPair(t, ctx, msg.WithKeepalive(interval, timeout))
	require.Eventually(t, func() bool {
		return client.Stats().KeepaliveRTT > 0 && server.Stats().KeepaliveRTT > 0
	}, 5*time.Second, interval, "an idle connection sends keepalives, and each side times them")
	for _, s := range []msg.Stats{client.Stats(), server.Stats()} {
		require.Less(t, s.KeepaliveRTT, timeout)
		require.Positive(t, s.CreditMessagesSent, "keepalives are credit messages")
	}
	require.NoError(t, client.Err(), "the connection lives on")
}

// TestOneSidedRegionsAreReused: a msg connection's one-sided operations
// stage their bytes in regions of the same cache, so that a call does not
// register memory of its own each time; every write lands and every read
// returns the peer's bytes, whatever an earlier call left in the region.
func TestOneSidedRegionsAreReused(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx)
	region, err := bufpool.NewRegion(server.PD(), 4096, bufpool.RemoteRead|bufpool.RemoteWrite)
	require.NoError(t, err)
	defer region.Close()
	const rounds = 3
	for i := range rounds {
		want := bytes.Repeat([]byte{byte(i + 1)}, 100+i*50) // shorter first: nothing of it may come back later
		at, err := region.Remote().Slice(0, len(want))
		require.NoError(t, err)
		require.NoError(t, client.WriteRemote(ctx, at, want))
		require.Equal(t, want, region.Bytes()[:len(want)], "write %d landed", i)
		copy(region.Bytes(), bytes.Repeat([]byte{byte(0x80 + i)}, len(want)))
		got := make([]byte, len(want))
		require.NoError(t, client.ReadRemote(ctx, at, got))
		require.Equal(t, region.Bytes()[:len(want)], got, "read %d returned the peer's bytes", i)
	}
	st := client.Stats()
	require.EqualValues(t, 2, st.RegionCacheMisses, "one region for the writes, one for the reads' sinks")
	require.EqualValues(t, 2*rounds-2, st.RegionCacheHits)
}

// TestKeepaliveKeepsToThePeersTimeout: each side sends keepalives often
// enough for the peer's timeout, whatever its own interval says: a client
// whose own keepalives are off, or far apart, stays connected, idle, to
// a server that ends a connection silent for 1 s, and the server still
// gets its messages after three times that.
func TestKeepaliveKeepsToThePeersTimeout(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const timeout = time.Second
	for name, own := range map[string]msg.Option{
		"off":            msg.WithKeepalive(0, 0),
		"far apart":      msg.WithKeepalive(time.Minute, 0),
		"longer timeout": msg.WithKeepalive(10*time.Second, time.Minute),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each waits out the same idle time
			client, server, _ := unevenMsgPair(t, ctx,
				[]msg.Option{msg.WithKeepalive(timeout/4, timeout)}, []msg.Option{own})
			time.Sleep(3 * timeout)
			require.NoError(t, server.Err(), "the idle client kept to the server's timeout")
			require.NoError(t, client.Send(ctx, []byte("still here")))
			got, err := server.Recv(ctx)
			require.NoError(t, err)
			require.Equal(t, "still here", string(got))
		})
	}
}
