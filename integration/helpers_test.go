package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// pair is a connected client and server endpoint on the test device.
type pair struct {
	client, server *endpoint.Endpoint
	listener       *cm.Listener
}

// connect listens on the device's address (an ephemeral port), dials it and
// accepts. Everything is closed, and the completions drained, at cleanup.
func connect(t *testing.T, ctx context.Context, opts ...cm.Option) *pair {
	t.Helper()
	l, client, server, err := dialPair(ctx, rxetest.Addr(t), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	t.Cleanup(func() { closeAndDrain(t, client) })
	t.Cleanup(func() { closeAndDrain(t, server) })
	return &pair{client: client, server: server, listener: l}
}

// dialPair listens on addr (an ephemeral port), dials it and accepts. The
// caller closes all three.
func dialPair(ctx context.Context, addr string, opts ...cm.Option) (*cm.Listener, *endpoint.Endpoint, *endpoint.Endpoint, error) {
	l, err := cm.Listen(ctx, net.JoinHostPort(addr, "0"), listenOptions(opts)...)
	if err != nil {
		return nil, nil, nil, err
	}
	type accepted struct {
		ep  *endpoint.Endpoint
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		ep, err := l.Accept(ctx)
		got <- accepted{ep, err}
	}()
	client, err := cm.Dial(ctx, l.Addr().String(), dialOptions(opts)...)
	if err != nil {
		l.Close()
		if a := <-got; a.ep != nil {
			a.ep.CloseAndDrain(nil)
		}
		return nil, nil, nil, err
	}
	a := <-got
	if a.err != nil {
		client.CloseAndDrain(nil)
		l.Close()
		return nil, nil, nil, a.err
	}
	return l, client, a.ep, nil
}

// dialOptions and listenOptions pass connection options to Dial and Listen.
func dialOptions(opts []cm.Option) []cm.DialOption     { return convert[cm.DialOption](opts) }
func listenOptions(opts []cm.Option) []cm.ListenOption { return convert[cm.ListenOption](opts) }

func convert[T any](opts []cm.Option) []T {
	out := make([]T, len(opts))
	for i, o := range opts {
		out[i] = any(o).(T)
	}
	return out
}

// closeAndDrain closes ep and reads its completions until the channel closes.
func closeAndDrain(t *testing.T, ep *endpoint.Endpoint) {
	t.Helper()
	require.NoError(t, ep.CloseAndDrain(nil))
}

// receivesOnSetup is a cm.WithSetup that makes a pool of count buffers of
// size on the new endpoint's protection domain, stores it in *pool, and
// posts post of them as receives before the connection is made, so that a
// peer sending at once finds them (on iWARP a message that finds no receive
// ends the connection). If Dial or Accept then fails, cm puts the posted
// buffers back; the caller closes *pool.
func receivesOnSetup(pool **bufpool.Pool, size, count, post int) cm.HandshakeOption {
	return cm.WithSetup(func(ep *endpoint.Endpoint) error {
		if *pool != nil { // an endpoint Dial tried before this one, closed
			(*pool).Close()
		}
		p, err := bufpool.New(ep.PD(), bufpool.Size(size), bufpool.Count(count))
		if err != nil {
			return err
		}
		*pool = p
		for range post {
			b, _ := p.TryGet()
			if err := ep.PostRecv(nil, b); err != nil {
				p.Put(b)
				return err
			}
		}
		return nil
	})
}

// newPool makes a message pool on ep's protection domain, closed at cleanup.
func newPool(t *testing.T, ep *endpoint.Endpoint, size, count int) *bufpool.Pool {
	t.Helper()
	p, err := bufpool.New(ep.PD(), bufpool.Size(size), bufpool.Count(count))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// next waits for ep's next completion.
func next(t *testing.T, ep *endpoint.Endpoint) endpoint.Completion {
	t.Helper()
	select {
	case c, ok := <-ep.Completions():
		require.True(t, ok, "completions closed")
		return c
	case <-time.After(20 * time.Second):
		t.Fatal("no completion within 20s")
	}
	return endpoint.Completion{}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func withQueueDepth(n int) cm.Option { return cm.WithQueueDepth(n) }

// benchPair connects a pair for a benchmark, closing it when it ends.
func benchPair(b *testing.B) *pair {
	b.Helper()
	ctx := context.Background()
	addr := rxetest.Addr(b)
	l, err := cm.Listen(ctx, net.JoinHostPort(addr, "0"))
	require.NoError(b, err)
	b.Cleanup(func() { l.Close() })
	got := make(chan *endpoint.Endpoint, 1)
	go func() {
		ep, _ := l.Accept(ctx)
		got <- ep
	}()
	client, err := cm.Dial(ctx, l.Addr().String())
	require.NoError(b, err)
	server := <-got
	require.NotNil(b, server)
	b.Cleanup(func() {
		for _, ep := range []*endpoint.Endpoint{client, server} {
			ep.CloseAndDrain(nil)
		}
	})
	return &pair{client: client, server: server, listener: l}
}

// tcpResets reads the kernel's count of TCP connections it reset because
// one side closed with data unread or received data after its close
// (TcpExt TCPAbortOnClose and TCPAbortOnData in /proc/net/netstat). On
// iWARP each is a connection whose last bytes may have been lost.
func tcpResets(t *testing.T) map[string]int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/net/netstat")
	require.NoError(t, err)
	var names []string
	counts := map[string]int64{}
	for line := range strings.Lines(string(raw)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "TcpExt:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		for i, v := range fields {
			if i < len(names) && (names[i] == "TCPAbortOnClose" || names[i] == "TCPAbortOnData") {
				counts[names[i]], err = strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
			}
		}
	}
	require.Len(t, counts, 2, "TcpExt counters in /proc/net/netstat")
	return counts
}

// tcpResetsSettled is tcpResets once every TCP socket in the guest that
// its owner has not closed yet is closed, within ctx: the counters move
// when a socket is closed, and siw releases a connection's socket in a
// kernel worker after the connection's Close returned, so an earlier
// test's release, or this test's last one, may otherwise land on the
// wrong side of the read.
func tcpResetsSettled(t *testing.T, ctx context.Context) map[string]int64 {
	t.Helper()
	for {
		open := tcpSocketsOpen(t)
		if len(open) == 0 {
			return tcpResets(t)
		}
		select {
		case <-ctx.Done():
			require.FailNow(t, "TCP sockets still open", "%s", strings.Join(open, "\n"))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// tcpSocketsOpen lists the guest's TCP sockets (/proc/net/tcp and tcp6)
// that their owner has not closed: connecting, connected, or closed by
// the peer only (states SYN_SENT, SYN_RECV, ESTABLISHED, CLOSE_WAIT).
// Listening sockets and those closing or closed are left out.
func tcpSocketsOpen(t *testing.T) []string {
	t.Helper()
	const established, synSent, synRecv, closeWait = "01", "02", "03", "08"
	var open []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(table)
		require.NoError(t, err)
		for line := range strings.Lines(string(raw)) {
			fields := strings.Fields(line)
			if len(fields) < 4 {
				continue
			}
			switch fields[3] { // st; the header line's is "rem_address"
			case established, synSent, synRecv, closeWait:
				open = append(open, strings.Join(fields[1:4], " "))
			}
		}
	}
	return open
}

// testbedName returns the name the testbed's /etc/hosts gives the
// device's IPv6 and IPv4 addresses (RDMACM_TEST_HOST). Off the testbed,
// with no such name, the test that needs it skips.
func testbedName(t *testing.T) string {
	t.Helper()
	name := os.Getenv("RDMACM_TEST_HOST")
	if name == "" || os.Getenv("RDMACM_TEST_ADDR6") == "" {
		rxetest.Addr(t)
		t.Skip("no name for the device's two addresses (the testbed sets RDMACM_TEST_HOST)")
	}
	return name
}

// dialAccepted dials addr, where l listens, and returns both ends once a
// message has gone from the dialer to the accepted side, which must sit
// at the address the dialer reached.
func dialAccepted(t *testing.T, ctx context.Context, l *msg.Listener, addr string) (c, s *msg.Conn) {
	t.Helper()
	accepted := make(chan *msg.Conn, 1)
	go func() {
		c, _ := l.Accept(ctx)
		accepted <- c
	}()
	c, err := msg.Dial(ctx, addr)
	require.NoError(t, err, "dialing %s, listening on %v", addr, l.Addr())
	s = <-accepted
	require.NotNil(t, s, "dialing %s, listening on %v", addr, l.Addr())
	require.NoError(t, c.Send(ctx, []byte("hello")))
	got, err := s.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	require.Equal(t, c.RemoteAddr().String(), s.LocalAddr().String(), "the accepted side's address is the dialed one")
	return c, s
}

// msgHello is the private data with which a raw cm endpoint passes for a
// msg peer of 6 receives of 4096 bytes.
func msgHello(t *testing.T) cm.HandshakeOption {
	t.Helper()
	hello, err := msg.ConnectData(6, 4096)
	require.NoError(t, err)
	return cm.WithPrivateData(hello)
}

// deviceState is what a constructor that failed must leave as it found:
// the device's objects (rdma res) and the process's open files, among
// them the completion and CM event channels rdma res does not count.
type deviceState struct {
	res   rxetest.Resources
	files int
}

func currentDeviceState(t *testing.T) deviceState {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return deviceState{res: rxetest.CountResources(t), files: len(fds)}
}

// loggedRefusal waits for log, past its first from bytes, to warn of the
// refusal, and returns it as the error that reports it.
func loggedRefusal(t *testing.T, log *lockedBuffer, from int, refusal error) error {
	t.Helper()
	since := func() string { return log.String()[from:] }
	require.Eventually(t, func() bool { return strings.Contains(since(), refusal.Error()) },
		10*time.Second, 10*time.Millisecond, "the listener's log: %s", since())
	require.Contains(t, since(), `"level":"warn"`)
	return fmt.Errorf("the listener logged it: %w", refusal)
}

// acceptance is what a cm accept gave.
type acceptance struct {
	ep  *endpoint.Endpoint
	err error
}

// acceptInBackground calls l.Accept with opts in a goroutine of its own;
// what it gave comes on the channel.
func acceptInBackground(ctx context.Context, l *cm.Listener, opts ...cm.AcceptOption) <-chan acceptance {
	done := make(chan acceptance, 1)
	go func() {
		ep, err := l.Accept(ctx, opts...)
		done <- acceptance{ep, err}
	}()
	return done
}
