package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

func TestDialRefused(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	addr := rxetest.Addr(t)
	start := time.Now()
	_, err := cm.Dial(ctx, net.JoinHostPort(addr, "7999"))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	// The error names the local address the connect came from: rdma_cm
	// picked its port, which a TCP dial's error leaves out.
	require.Regexp(t, `^cm: dial `+regexp.QuoteMeta(net.JoinHostPort(addr, "7999"))+` from `+regexp.QuoteMeta(addr)+`:\d+: `, err.Error())
	if !rxetest.IWARP() { // iWARP connects over TCP: a refusal is a reset, with no CM reject
		var rej *cm.RejectError
		require.ErrorAs(t, err, &rej)
	}
	t.Logf("refused after %v: %v", time.Since(start), err)
	require.Less(t, time.Since(start), 10*time.Second, "a refused dial fails fast, not by a timeout")
}

// TestConnectionLogNamesAddresses: with a logger set, each line a
// connection logs (its CM events here) names its local and remote
// addresses, on both sides, so that a process's many connections can be
// told apart in its log.
func TestConnectionLogNamesAddresses(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	var dialLog, listenLog lockedBuffer
	logTo := func(b *lockedBuffer) cm.Option {
		return cm.WithLogger(zerolog.New(b).Level(zerolog.DebugLevel))
	}
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), logTo(&listenLog))
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan *endpoint.Endpoint, 1)
	go func() {
		ep, err := l.Accept(ctx)
		assert.NoError(t, err)
		accepted <- ep
	}()
	d, err := cm.Dial(ctx, l.Addr().String(), logTo(&dialLog))
	require.NoError(t, err)
	a := <-accepted
	require.NotNil(t, a)
	require.NoError(t, d.CloseAndDrain(nil))
	select { // the accepted side logs the dialer's disconnect
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("the accepted endpoint never saw the dialer leave")
	}
	require.NoError(t, a.CloseAndDrain(nil))

	for _, side := range []struct {
		name string
		log  *lockedBuffer
		ep   *endpoint.Endpoint
	}{{"dialer", &dialLog, d}, {"listener", &listenLog, a}} {
		events := 0
		for line := range strings.Lines(side.log.String()) {
			var entry struct{ Message, Local, Remote string }
			require.NoError(t, json.Unmarshal([]byte(line), &entry), line)
			if entry.Message != "cm event" {
				continue
			}
			events++
			require.Equal(t, side.ep.LocalAddr().String(), entry.Local, "%s: %s", side.name, line)
			require.Equal(t, side.ep.RemoteAddr().String(), entry.Remote, "%s: %s", side.name, line)
		}
		require.Positive(t, events, "%s logged no CM event:\n%s", side.name, side.log.String())
	}
}

// TestDialsWhileSignalsArrive: dials made while the process takes a
// stream of signals all succeed, and so does a last one after the stream.
// On iWARP the kernel makes the TCP connection inside rdma_connect; a
// signal that interrupted it made the kernel restart the call, and siw
// then closed the listener under rdma_cm, so that every later dial to it
// was refused. SIGCHLD, which the runtime ignores, stands for a child
// process that exits, which is how the crash tests first met this.
func TestDialsWhileSignalsArrive(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	var served sync.WaitGroup
	served.Go(func() {
		for {
			ep, err := l.Accept(ctx)
			if err != nil {
				return
			}
			served.Go(func() {
				<-ep.Done() // the dialer closed
				ep.CloseAndDrain(nil)
			})
		}
	})
	defer served.Wait()
	defer l.Close()

	const dials = 40
	var signals atomic.Int64
	stop := make(chan struct{})
	var sending sync.WaitGroup
	sending.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if syscall.Kill(os.Getpid(), syscall.SIGCHLD) != nil {
				return
			}
			signals.Add(1)
		}
	})
	dial := func(i int) {
		ep, err := cm.Dial(ctx, l.Addr().String())
		require.NoError(t, err, "dial %d, after %d signals", i, signals.Load())
		require.NoError(t, ep.CloseAndDrain(nil))
	}
	for i := range dials {
		dial(i)
	}
	close(stop)
	sending.Wait()
	require.Positive(t, signals.Load(), "no signal came while the dials ran")
	dial(dials) // the listener is still there
	t.Logf("%d dials while %d signals came", dials+1, signals.Load())
}

// TestDialFromABusyLocalPort: on iWARP, rdma_connect fails before any
// packet leaves when the local port rdma_cm picked already has a TCP
// connection to the same address; Dial then tries other ports, and once
// every port it may pick is taken that way, says so. The test narrows the
// local port range to two ports, each holding an open TCP connection to a
// listener it then closes (from sockets that set SO_REUSEADDR, as siw's
// do, so that binding the port again succeeds and the kernel's connect is
// what refuses it). On RoCE the kernel's TCP is not in the path: the same
// dial is refused by the peer's CM, as any dial to a port nobody listens on.
func TestDialFromABusyLocalPort(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	host := rxetest.Addr(t)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	low := holdBusyPorts(t, ctx, ln, 2, firstSparePort)
	require.NoError(t, ln.Close())
	setLocalPortRange(t, low, low+1)

	var log lockedBuffer
	_, err = cm.Dial(ctx, ln.Addr().String(), cm.WithLogger(zerolog.New(&log).Level(zerolog.DebugLevel)))
	t.Logf("%v", err)
	tries := strings.Count(log.String(), dialAgainLog)
	if !rxetest.IWARP() {
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.Zero(t, tries, "nothing to dial again for")
		return
	}
	require.ErrorIs(t, err, syscall.EADDRNOTAVAIL)
	require.ErrorContains(t, err, "already has a TCP connection")
	require.Equal(t, 3, tries, "four dials in all, each from a busy port")
}

// TestMsgDialFromABusyLocalPort: a msg connection that cm.Dial set up on
// its second or later try, after a local port that already had a TCP
// connection to the address (iWARP), works, and the receives and pool of
// the endpoints it tried first are freed (the resource check). The local
// port range is two ports, one holding a TCP connection to the listener's
// port and one free, so that each try picks the busy one half the time;
// rounds go on, each with a listener on a new port, until a dial needed a
// second try. On RoCE every dial succeeds at once: the kernel's TCP is not
// in the path.
func TestMsgDialFromABusyLocalPort(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	host := rxetest.Addr(t)
	low := firstSparePort - 2
	retried := false
	for round := 1; round <= 24 && !retried; round++ {
		// The listener's TCP port gets a TCP connection from low first,
		// then the msg listener.
		tcpLn, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		require.NoError(t, err)
		low = holdBusyPorts(t, ctx, tcpLn, 1, low+2)
		require.NoError(t, tcpLn.Close())
		l, err := msg.Listen(ctx, tcpLn.Addr().String())
		require.NoError(t, err)
		restore := setLocalPortRange(t, low, low+1)
		var log lockedBuffer
		c, err := msg.Dial(ctx, l.Addr().String(),
			msg.WithCMOptions(cm.WithLogger(zerolog.New(&log).Level(zerolog.DebugLevel))))
		restore() // the next round's listener needs an ephemeral port
		tries := strings.Count(log.String(), dialAgainLog)
		t.Logf("round %d: %d more tries: %v", round, tries, err)
		if !rxetest.IWARP() {
			require.NoError(t, err)
			require.Zero(t, tries, "nothing to dial again for")
			retried = round == 2 // two rounds are enough to say so
		} else if err != nil {
			require.ErrorIs(t, err, syscall.EADDRNOTAVAIL, "every try picked the busy port")
			require.NoError(t, l.Close())
			continue
		} else {
			retried = tries > 0
		}
		s, err := l.Accept(ctx)
		require.NoError(t, err)
		want := fmt.Appendf(nil, "round %d", round)
		require.NoError(t, c.Send(ctx, want))
		got, err := s.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.NoError(t, s.Send(ctx, want))
		got, err = c.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())
		require.NoError(t, l.Close())
	}
	require.True(t, retried, "no dial in 24 rounds needed a second try (each picks the busy port half the time)")
}

// dialAgainLog is what cm.Dial logs when it dials again from another port.
const dialAgainLog = "again from another local port"

// firstSparePort is above the default ephemeral range (32768-60999), so
// that nothing else in the guest takes the ports the tests hold.
const firstSparePort = 61000

// holdBusyPorts finds n adjacent local ports, from the first free one at
// or above from, and holds a TCP connection to ln from each until the test
// ends, from sockets that set SO_REUSEADDR, as siw's do: binding the port
// again succeeds, and the kernel's connect to ln's address is what refuses
// it. It returns the first port once ln has accepted each connection:
// the callers close ln next, and closing a listener resets the
// connections still waiting in its queue, which frees their ports (a dial
// from one is then refused by the peer instead of by the local kernel).
func holdBusyPorts(t *testing.T, ctx context.Context, ln net.Listener, n, from int) int {
	t.Helper()
	go func() { // each connection: say it was accepted, read until the client closes, then close
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { c.Write([]byte{1}); io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	reuse := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
		return errors.Join(err, serr)
	}}
	host, _, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)
	for p := from; p+n <= 65535; p++ {
		var conns []net.Conn
		for port := p; port < p+n; port++ {
			d := reuse
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(host), Port: port}
			c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
			if err != nil {
				break
			}
			conns = append(conns, c)
			if err := awaitAccepted(ctx, c); err != nil {
				for _, c := range conns {
					c.Close()
				}
				require.NoError(t, err, "port %d: the listener never accepted", port)
			}
		}
		if len(conns) == n {
			t.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
			})
			return p
		}
		for _, c := range conns {
			c.Close()
		}
	}
	require.FailNow(t, "no free local ports", "%d adjacent from %d", n, from)
	return 0
}

// awaitAccepted waits for the byte holdBusyPorts' listener writes to each
// connection it accepted.
func awaitAccepted(ctx context.Context, c net.Conn) error {
	if deadline, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(deadline)
		defer c.SetReadDeadline(time.Time{})
	}
	var b [1]byte
	_, err := io.ReadFull(c, b[:])
	return err
}

// setLocalPortRange makes low-high the guest's ephemeral ports, from which
// rdma_cm picks a dial's local port, until the test ends or restore.
func setLocalPortRange(t *testing.T, low, high int) (restore func()) {
	t.Helper()
	const knob = "/proc/sys/net/ipv4/ip_local_port_range"
	old, err := os.ReadFile(knob)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(knob, fmt.Appendf(nil, "%d %d", low, high), 0o644))
	restore = sync.OnceFunc(func() { os.WriteFile(knob, old, 0o644) })
	t.Cleanup(restore)
	return restore
}

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDialNoRouteHonoursDeadline: Dial returns by its deadline when nobody
// answers. On iWARP the kernel's rdma_connect blocks while TCP tries to
// connect; Dial returns anyway and frees the connection once the kernel
// gives up. The test shortens that wait (tcp_syn_retries 1, about 3 s,
// where the default 6 takes about two minutes) and checks everything is
// freed then.
func TestDialNoRouteHonoursDeadline(t *testing.T) {
	rxetest.CheckResources(t)
	rxetest.Addr(t)
	before := rxetest.CountResources(t)
	if rxetest.IWARP() {
		const knob = "/proc/sys/net/ipv4/tcp_syn_retries"
		old, err := os.ReadFile(knob)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(knob, []byte("1"), 0o644))
		t.Cleanup(func() { os.WriteFile(knob, old, 0o644) })
		t.Cleanup(func() {
			require.Eventually(t, func() bool {
				now := rxetest.CountResources(t)
				return now["qp"] == before["qp"] && now["cm_id"] == before["cm_id"]
			}, 30*time.Second, 100*time.Millisecond, "the abandoned connects were never freed")
		})
	}
	// 10.77.0.99 is on the device's subnet but nobody answers; 10.123.0.1
	// has no route at all. Either way Dial returns by its deadline.
	for _, addr := range []string{"10.77.0.99:7471", "10.123.0.1:7471"} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		start := time.Now()
		_, err := cm.Dial(ctx, addr)
		cancel()
		elapsed := time.Since(start)
		require.Error(t, err)
		t.Logf("%s: %v after %v", addr, err, elapsed)
		require.Less(t, elapsed, 1500*time.Millisecond, "dial must return by its 500ms deadline (plus slack)")
	}
}

func TestUnknownHostAndBadAddress(t *testing.T) {
	rxetest.CheckResources(t)
	ctx := testContext(t)
	_, err := cm.Dial(ctx, "no-such-host.invalid:7471")
	require.Error(t, err)
	t.Logf("unknown host: %v", err)
	_, err = cm.Dial(ctx, "missing-port")
	require.Error(t, err)
	_, err = cm.Listen(ctx, "no-such-host.invalid:7471")
	require.Error(t, err)
	for _, addr := range []string{"127.0.0.1:7471", "localhost:7471"} {
		_, err = cm.Dial(ctx, addr)
		require.ErrorContains(t, err, "loopback address has no RDMA device", "the error says what to do")
		t.Logf("loopback: %v", err)
	}
	for _, addr := range []string{"0.0.0.0:7471", "[::]:7471", ":7471"} {
		_, err = cm.Dial(ctx, addr)
		require.ErrorContains(t, err, "dial the address of an RDMA-capable interface", "the error says what to do")
		t.Logf("unspecified: %v", err)
	}

	// A port out of range is refused as net refuses it. rdma_getaddrinfo
	// would take it modulo 65536: a listener on 99999 came up on 34463.
	bad := net.JoinHostPort(rxetest.Addr(t), "99999")
	var addrErr *net.AddrError
	_, err = cm.Listen(ctx, bad)
	require.ErrorAs(t, err, &addrErr)
	require.ErrorContains(t, err, "address 99999: invalid port")
	_, err = cm.Dial(ctx, bad)
	require.ErrorAs(t, err, &addrErr)
	_, err = rdmanet.Listen(ctx, bad)
	require.ErrorAs(t, err, &addrErr)
	_, err = dgram.Listen(ctx, bad)
	require.ErrorAs(t, err, &addrErr)
	t.Logf("port out of range: %v", err)
}

// TestListenOnLoopbackIsRefused: rdma_cm binds a loopback address as it
// binds 0.0.0.0 on RoCE, so a listener on 127.0.0.1 or ::1 took dials to
// the device's address, from anywhere, where a program listening there
// means its own host only; on iWARP no dial reached it. Every Listen
// refuses it now, and leaves nothing behind.
func TestListenOnLoopbackIsRefused(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	for _, addr := range []string{"127.0.0.1:0", "127.0.0.2:7471", "[::1]:0", "localhost:0"} {
		_, err := cm.Listen(ctx, addr)
		require.ErrorIs(t, err, syscall.EADDRNOTAVAIL, addr)
		require.ErrorContains(t, err, "loopback address", addr)
		_, err = msg.Listen(ctx, addr)
		require.ErrorIs(t, err, syscall.EADDRNOTAVAIL, addr)
		_, err = rdmanet.Listen(ctx, addr)
		require.ErrorIs(t, err, syscall.EADDRNOTAVAIL, addr)
		t.Logf("%s: %v", addr, err)
	}
}

// TestListenOnEveryAddress: a listener on a wildcard (0.0.0.0, no host,
// [::]) takes dials to the device's address at its port, as Listen's docs
// promise, and the accepted side's local address is the one the dial came
// to. No host and [::] take dials of both families, as net's ":port"
// does, though rdma_cm's own [::] takes IPv6 dials only on soft-iWARP;
// 0.0.0.0 takes IPv4 dials only.
func TestListenOnEveryAddress(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	dev, dev6 := rxetest.Addr(t), os.Getenv("RDMACM_TEST_ADDR6")
	for _, wildcard := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		l, err := msg.Listen(ctx, wildcard)
		require.NoError(t, err, wildcard)
		defer l.Close() // on a failure: a waiting Accept returns
		ipv4Only := wildcard == "0.0.0.0:0"
		bound := l.Addr().(*net.TCPAddr)
		require.True(t, bound.IP.IsUnspecified(), "%s bound %v", wildcard, bound)
		require.Equal(t, ipv4Only, bound.IP.To4() != nil, "%s bound %v", wildcard, bound)
		port := strconv.Itoa(bound.Port)
		type target struct {
			addr    string
			refused bool
		}
		targets := []target{{net.JoinHostPort(dev, port), false}}
		if dev6 != "" {
			targets = append(targets, target{net.JoinHostPort(dev6, port), ipv4Only})
		}
		for _, to := range targets {
			if to.refused {
				_, err := msg.Dial(ctx, to.addr)
				require.ErrorIs(t, err, syscall.ECONNREFUSED, "listening on %s, dialing %s", wildcard, to.addr)
				t.Logf("listening on %s (%v): dialing %s refused: %v", wildcard, l.Addr(), to.addr, err)
				continue
			}
			c, s := dialAccepted(t, ctx, l, to.addr)
			t.Logf("listening on %s (%v): dialed %s, accepted at %v from %v", wildcard, l.Addr(), to.addr, s.LocalAddr(), s.RemoteAddr())
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
		}
		require.NoError(t, l.Close())
	}
}

// TestDialTriesEachAddressOfAName: a name with an IPv6 and an IPv4
// address (the testbed's /etc/hosts) reaches a listener on either address
// alone, as net's Dial does: whichever the resolver gives first, one of
// the two dials connects only after that address refused. With nobody
// listening, the first address's refusal is the error.
func TestDialTriesEachAddressOfAName(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	name, dev, dev6 := testbedName(t), rxetest.Addr(t), os.Getenv("RDMACM_TEST_ADDR6")
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, name)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{dev, dev6}, []string{addrs[0].String(), addrs[1].String()}, "%s's addresses", name)
	t.Logf("%s: %v", name, addrs)
	for _, host := range []string{dev, dev6} {
		l, err := msg.Listen(ctx, net.JoinHostPort(host, "0"))
		require.NoError(t, err)
		defer l.Close() // on a failure: a waiting Accept returns
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		c, s := dialAccepted(t, ctx, l, net.JoinHostPort(name, port))
		require.Equal(t, l.Addr().String(), c.RemoteAddr().String())
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())
		require.NoError(t, l.Close())

		_, err = cm.Dial(ctx, net.JoinHostPort(name, port))
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "nobody listens on %s", port)
		require.ErrorContains(t, err, "from "+net.JoinHostPort(addrs[0].String(), ""), "the first address's error")
		t.Logf("dialing %s:%s, nobody listening: %v", name, port, err)
	}
}

// TestListenOnANameTakesItsIPv4Address: as net's Listen, a listener on a
// name with an IPv6 and an IPv4 address listens on the IPv4 one, whatever
// order the resolver gives them in.
func TestListenOnANameTakesItsIPv4Address(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	name, dev := testbedName(t), rxetest.Addr(t)
	l, err := cm.Listen(ctx, name+":0")
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, dev, l.Addr().(*net.TCPAddr).IP.String())
	require.NoError(t, l.Close())
}

func TestListenPortInUse(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	_, err = cm.Listen(ctx, l.Addr().String())
	require.ErrorIs(t, err, syscall.EADDRINUSE)
}

// TestListenBothFamiliesPortInUse: a listener on both families holds its
// port for each, and one cannot start where either family's port is
// taken; what it bound before it failed is freed (CheckResources).
func TestListenBothFamiliesPortInUse(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	dev, dev6 := rxetest.Addr(t), os.Getenv("RDMACM_TEST_ADDR6")
	both, err := cm.Listen(ctx, ":0")
	require.NoError(t, err)
	defer both.Close()
	port := strconv.Itoa(both.Addr().(*net.TCPAddr).Port)
	taken := []string{net.JoinHostPort(dev, port), "0.0.0.0:" + port, "[::]:" + port, ":" + port}
	if dev6 != "" {
		taken = append(taken, net.JoinHostPort(dev6, port))
	}
	for _, addr := range taken {
		_, err = cm.Listen(ctx, addr)
		require.ErrorIs(t, err, syscall.EADDRINUSE, "listening on %s beside :%s", addr, port)
	}
	require.NoError(t, both.Close())

	// Either family's port taken stops a listener on both at that port.
	firsts := []string{net.JoinHostPort(dev, "0"), "0.0.0.0:0"}
	if dev6 != "" {
		firsts = append(firsts, net.JoinHostPort(dev6, "0"))
	}
	for _, first := range firsts {
		l, err := cm.Listen(ctx, first)
		require.NoError(t, err, first)
		addr := ":" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		_, err = cm.Listen(ctx, addr)
		require.ErrorIs(t, err, syscall.EADDRINUSE, "listening on %s beside %v", addr, l.Addr())
		require.NoError(t, l.Close())
	}
}

func TestRejectWithPrivateData(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		req, err := l.AcceptRequest(ctx)
		if err == nil {
			req.Reject([]byte("go away: " + string(req.PrivateData()[:5])))
		}
	}()
	_, err = cm.Dial(ctx, l.Addr().String(), cm.WithPrivateData([]byte("hello")))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	var rej *cm.RejectError
	require.ErrorAs(t, err, &rej)
	require.True(t, bytes.HasPrefix(rej.PrivateData, []byte("go away: hello")), "reject data %q", rej.PrivateData)
	// The reason is the IB CM's "consumer defined" (28), or on iWARP the
	// kernel's status, a negative errno.
	if rxetest.IWARP() {
		require.Negative(t, rej.Reason)
		require.ErrorContains(t, err, "iWARP status")
	} else {
		require.Equal(t, 28, rej.Reason)
	}
}

// TestRequestIsAnsweredOnce: a Request's one answer owns its id (the
// connection's, or freed by Reject), so a second Accept or Reject is
// refused with ErrInvalid and leaves the first answer's connection as it
// was.
func TestRequestIsAnsweredOnce(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	type answered struct {
		ep       *endpoint.Endpoint
		again    []error
		rejected []error
	}
	got := make(chan answered, 1)
	go func() {
		var a answered
		defer func() { got <- a }()
		req, err := l.AcceptRequest(ctx)
		if err != nil {
			return
		}
		if a.ep, err = req.Accept(ctx); err != nil {
			return
		}
		_, err = req.Accept(ctx)
		a.again = []error{err, req.Reject(nil)}
		// A rejected request refuses a later answer too.
		if req, err = l.AcceptRequest(ctx); err == nil {
			rejectErr := req.Reject(nil)
			_, err = req.Accept(ctx)
			a.rejected = []error{rejectErr, err, req.Reject(nil)}
		}
	}()
	client, err := cm.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	_, err = cm.Dial(ctx, l.Addr().String())
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "the second dial was rejected")
	a := <-got
	require.NotNil(t, a.ep)
	require.Len(t, a.again, 2)
	for _, err := range a.again {
		require.ErrorIs(t, err, endpoint.ErrInvalid)
		require.ErrorContains(t, err, "accepted or rejected already")
	}
	require.Len(t, a.rejected, 3)
	require.NoError(t, a.rejected[0])
	require.ErrorIs(t, a.rejected[1], endpoint.ErrInvalid)
	require.ErrorIs(t, a.rejected[2], endpoint.ErrInvalid)
	p := &pair{client: client, server: a.ep, listener: l}
	defer closeAndDrain(t, client)
	defer closeAndDrain(t, a.ep)
	require.NoError(t, echoOnce(t, ctx, p), "the accepted connection still carries messages")
}

// TestDroppedRequestIsRejected: a Request dropped without an answer is
// rejected once the garbage collector finds it, so its dialer hears a
// refusal instead of waiting for its timeout, and its id is freed
// (CheckResources). A Request dropped after Accept leaves its connection
// as it was.
func TestDroppedRequestIsRejected(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	dialed := make(chan error, 1)
	go func() {
		ep, err := cm.Dial(ctx, l.Addr().String())
		if err == nil {
			ep.Close()
		}
		dialed <- err
	}()
	require.NoError(t, takeRequestAndDrop(ctx, l))
	var dialErr error
	require.Eventually(t, func() bool {
		runtime.GC()
		select {
		case dialErr = <-dialed:
			return true
		default:
			return false
		}
	}, 30*time.Second, 20*time.Millisecond, "the dialer of a dropped Request was never answered")
	require.ErrorIs(t, dialErr, syscall.ECONNREFUSED, "the dropped request's dialer was rejected")

	accepted := make(chan *endpoint.Endpoint, 1)
	go func() {
		req, err := l.AcceptRequest(ctx)
		if err != nil {
			accepted <- nil
			return
		}
		ep, _ := req.Accept(ctx) // and req is dropped here
		accepted <- ep
	}()
	client, err := cm.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	defer closeAndDrain(t, client)
	server := <-accepted
	require.NotNil(t, server)
	defer closeAndDrain(t, server)
	for range 3 {
		runtime.GC()
	}
	p := &pair{client: client, server: server, listener: l}
	require.NoError(t, echoOnce(t, ctx, p), "a connection outlives its Request")
}

// takeRequestAndDrop takes a connect request and answers nothing. It is a
// function of its own so that no frame of the test holds the Request.
//
//go:noinline
func takeRequestAndDrop(ctx context.Context, l *cm.Listener) error {
	_, err := l.AcceptRequest(ctx)
	return err
}

func TestPrivateDataBothWays(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan *endpoint.Endpoint, 1)
	go func() {
		req, err := l.AcceptRequest(ctx)
		if err != nil {
			accepted <- nil
			return
		}
		if !bytes.HasPrefix(req.PrivateData(), []byte("from the dialer")) {
			req.Reject(nil)
			accepted <- nil
			return
		}
		ep, _ := req.Accept(ctx, cm.WithPrivateData([]byte("from the listener")))
		accepted <- ep
	}()
	ep, err := cm.Dial(ctx, l.Addr().String(), cm.WithPrivateData([]byte("from the dialer")))
	require.NoError(t, err)
	defer closeAndDrain(t, ep)
	sep := <-accepted
	require.NotNil(t, sep)
	defer closeAndDrain(t, sep)
	require.True(t, bytes.HasPrefix(ep.PrivateData(), []byte("from the listener")), "reply %q", ep.PrivateData())
	require.True(t, bytes.HasPrefix(sep.PrivateData(), []byte("from the dialer")), "request %q", sep.PrivateData())
	require.Equal(t, ep.LocalAddr().String(), sep.RemoteAddr().String())
	require.Equal(t, ep.RemoteAddr().String(), sep.LocalAddr().String())
	require.Equal(t, l.Addr().String(), ep.RemoteAddr().String())

	_, err = cm.Dial(ctx, l.Addr().String(), cm.WithPrivateData(make([]byte, 57)))
	require.ErrorContains(t, err, "at most 56")
}

func TestIPv6(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	addr6 := os.Getenv("RDMACM_TEST_ADDR6")
	if addr6 == "" {
		rxetest.Addr(t)
		t.Skip("no IPv6 address for the RDMA device (the testbed sets RDMACM_TEST_ADDR6)")
	}
	l, err := cm.Listen(ctx, net.JoinHostPort(addr6, "0"))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		if ep, err := l.Accept(ctx); err == nil {
			<-ep.Done()
			ep.CloseAndDrain(nil)
		}
	}()
	ep, err := cm.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	t.Logf("connected over IPv6 to %v", l.Addr())
	closeAndDrain(t, ep)
}

// TestPeerDisconnect: when the client closes, the server's Done fires and
// its posted receives come back with ErrClosed, exactly once each. The
// server's errors do not match net.ErrClosed, which only the client's own
// posts get after its Close.
func TestPeerDisconnect(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	pool := newPool(t, p.server, 64, 8)
	for i := range 8 {
		b, _ := pool.TryGet()
		require.NoError(t, p.server.PostRecv(i, b))
	}
	require.NoError(t, p.client.Close())
	err := p.client.PostSend(nil, nil, 0) // after Close, any request is refused so
	require.ErrorIs(t, err, endpoint.ErrClosed)
	require.ErrorIs(t, err, net.ErrClosed, "this side closed")
	require.ErrorIs(t, p.client.Err(), net.ErrClosed)
	select {
	case <-p.server.Done():
	case <-ctx.Done():
		t.Fatal("server never noticed the disconnect")
	}
	require.ErrorIs(t, p.server.Err(), cm.ErrPeerDisconnected)
	require.NotErrorIs(t, p.server.Err(), net.ErrClosed, "the peer closed, not this side")
	seen := map[any]int{}
	for range 8 {
		c := next(t, p.server)
		require.ErrorIs(t, c.Err, endpoint.ErrClosed)
		require.NotErrorIs(t, c.Err, net.ErrClosed)
		seen[c.Context]++
		require.NoError(t, pool.Put(c.Buffer))
	}
	require.Len(t, seen, 8)
}

// TestManyEndpointsOneListener: 16 clients at once, each echoing messages
// through the same listener's accepted endpoints.
func TestManyEndpointsOneListener(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	const msgs, clients = 20, 16
	var servers sync.WaitGroup
	serverErrs := make(chan error, clients)
	servers.Add(clients)
	for range clients {
		go func() {
			defer servers.Done()
			serverErrs <- acceptEcho(ctx, l, 64, 4)
		}()
	}
	var wg sync.WaitGroup
	clientErrs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clientErrs <- echoClient(ctx, l.Addr().String(), c, msgs)
		}()
	}
	wg.Wait()
	servers.Wait()
	close(clientErrs)
	close(serverErrs)
	// The servers' errors first: a handshake that failed there is why its
	// dialer was refused.
	for err := range serverErrs {
		require.True(t, err == nil || errors.Is(err, endpoint.ErrClosed), "server: %v", err)
	}
	for err := range clientErrs {
		require.NoError(t, err)
	}
}

// Soft-iWARP's user library refuses a queue whose mapping starts at the
// offset it takes for "no key", page 144 of a process's queue mappings
// (docs/TESTING.md). With one-page queues the pages fill one by one, and
// before verbs' guard (Context.GuardSiwKeys) every queue after them
// failed: with both sides in one process, from about the 24th connection
// on. 100 connections with 1-deep queues are set up and held at once
// here, on every device.
func TestManyOnePageQueuesInOneProcess(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithQueueDepth(1))
	require.NoError(t, err)
	defer l.Close()
	const n = 100
	type result struct {
		ep  *endpoint.Endpoint
		err error
	}
	accepted := make(chan result, n)
	go func() {
		for range n {
			ep, err := l.Accept(ctx)
			accepted <- result{ep, err}
			if err != nil {
				return
			}
		}
	}()
	var eps []*endpoint.Endpoint
	defer func() {
		for _, ep := range eps {
			ep.Close()
		}
	}()
	for i := range n {
		ep, err := cm.Dial(ctx, l.Addr().String(), cm.WithQueueDepth(1))
		require.NoError(t, err, "dial %d", i)
		eps = append(eps, ep)
		a := <-accepted
		require.NoError(t, a.err, "accept %d", i)
		eps = append(eps, a.ep)
	}
}

// Options no request could be accepted with make Listener.Accept fail at
// once, instead of rejecting every dialer while it waits on.
func TestAcceptWithBadOptionsFailsAtOnce(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	_, err = l.Accept(ctx, cm.WithReadDepth(0))
	require.ErrorIs(t, err, endpoint.ErrInvalid)
	_, err = l.Accept(ctx, cm.WithPrivateData(make([]byte, 4096)))
	require.ErrorContains(t, err, "private data")
}

// TestConnectionsShareOneEventChannel: a process's listener and
// connections read their CM events from one channel (and the dup the
// netpoller watches), not one each, and the channel closes with the last
// of them.
func TestConnectionsShareOneEventChannel(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	before := rdmaCMFiles(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	const pairs = 8
	var eps []*endpoint.Endpoint
	for range pairs {
		accepted := make(chan *endpoint.Endpoint, 1)
		go func() {
			ep, err := l.Accept(ctx)
			assert.NoError(t, err)
			accepted <- ep
		}()
		client, err := cm.Dial(ctx, l.Addr().String())
		require.NoError(t, err)
		server := <-accepted
		require.NotNil(t, server)
		eps = append(eps, client, server)
	}
	require.Equal(t, before+2, rdmaCMFiles(t), "%d connections and a listener hold one channel and its dup", 2*pairs)
	for _, ep := range eps {
		require.NoError(t, ep.Close())
	}
	require.Equal(t, before+2, rdmaCMFiles(t), "the listener still holds the channel")
	require.NoError(t, l.Close())
	require.Equal(t, before, rdmaCMFiles(t), "the last one closed the channel")
}

// rdmaCMFiles counts the process's open files on the rdma_cm device: its
// CM event channels and their dups.
func rdmaCMFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && target == "/dev/infiniband/rdma_cm" {
			n++
		}
	}
	return n
}

// TestBacklogBoundsWaitingRequests: with WithBacklog(2) and nobody
// accepting, two connect requests wait and every later one is refused
// (ECONNREFUSED) at once; the two waiting then connect when accepted.
// "At once" is well before the dialer's CM sends a request again (about
// 6.5 s on rxe0): with the kernel's backlog set to the listener's, a burst
// of requests overflowed it in half the runs, the kernel dropped those
// past it, and they were refused only when sent again.
func TestBacklogBoundsWaitingRequests(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	const backlog, dials = 2, 5
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithBacklog(backlog))
	require.NoError(t, err)
	defer l.Close()
	type dialed struct {
		ep  *endpoint.Endpoint
		err error
	}
	results := make(chan dialed, dials)
	for range dials {
		go func() {
			ep, err := cm.Dial(ctx, l.Addr().String())
			results <- dialed{ep, err}
		}()
	}
	refusedBy := time.After(5 * time.Second)
	for range dials - backlog {
		select {
		case r := <-results:
			require.ErrorIs(t, r.err, syscall.ECONNREFUSED, "a request past the backlog")
		case <-refusedBy:
			t.Fatal("requests past the backlog were not refused")
		}
	}
	for range backlog {
		ep, err := l.Accept(ctx)
		require.NoError(t, err, "a request in the backlog")
		defer closeAndDrain(t, ep)
	}
	for range backlog {
		r := <-results
		require.NoError(t, r.err, "a dial whose request waited in the backlog")
		defer closeAndDrain(t, r.ep)
	}
}

// TestListenerCloseRefusesWaitingDials: requests that reached a listener
// but were never accepted are rejected when it closes (their dials fail
// with ECONNREFUSED), and their ids are freed.
func TestListenerCloseRefusesWaitingDials(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	files := rdmaCMFiles(t)
	before := rxetest.CountResources(t)["cm_id"]
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	const dials = 4
	errs := make(chan error, dials)
	for range dials {
		go func() {
			_, err := cm.Dial(ctx, l.Addr().String())
			errs <- err
		}()
	}
	// Each request shows as two ids, the dialer's and the one the
	// listener's side got with it.
	require.Eventually(t, func() bool { return rxetest.CountResources(t)["cm_id"] >= before+1+2*dials },
		10*time.Second, 20*time.Millisecond, "the requests never reached the listener")
	require.NoError(t, l.Close())
	for range dials {
		require.ErrorIs(t, <-errs, syscall.ECONNREFUSED)
	}
	require.Equal(t, files, rdmaCMFiles(t), "the process's event channel closed with the last id")
}

// TestAcceptedOutlivesListener: closing a listener ends no connection it
// accepted, as with TCP: both ends still exchange messages afterwards.
func TestAcceptedOutlivesListener(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	require.NoError(t, p.listener.Close())
	time.Sleep(300 * time.Millisecond) // an end the close caused would have come by now
	require.NoError(t, echoOnce(t, ctx, p))
	select {
	case <-p.server.Done():
		t.Fatalf("the accepted endpoint ended: %v", p.server.Err())
	case <-p.client.Done():
		t.Fatalf("the dialed endpoint ended: %v", p.client.Err())
	default:
	}
}

// TestDialsCancelledMidHandshake: dials whose context ends at every point
// of the handshake (resolving the address and the route, waiting for the
// listener's reply, msg's greeting): 60 deadlines spread over one and a
// half times what the fastest of three unhurried dials took. Each Dial
// returns the context's error or a connection; the listening side gets
// the abandoned ones ended, never a hang; and every verbs and CM resource
// comes back.
func TestDialsCancelledMidHandshake(t *testing.T) {
	const dials = 60
	type dialer func(ctx context.Context, addr string) (io.Closer, error)
	// run dials addr, then closes the listener (stop) and waits for the
	// listening side (served).
	run := func(t *testing.T, before map[string]int, addr string, dial dialer, stop func(), served <-chan struct{}) {
		var full time.Duration // the fastest of 3 dials with time to finish
		for i := range 3 {
			start := time.Now()
			c, err := dial(testContext(t), addr)
			require.NoError(t, err, "a dial with time to finish")
			if took := time.Since(start); i == 0 || took < full {
				full = took
			}
			require.NoError(t, c.Close())
		}
		step := full * 3 / 2 / dials
		established := 0
		for i := range dials {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*step)
			c, err := dial(ctx, addr)
			cancel()
			if err != nil {
				require.ErrorIs(t, err, context.DeadlineExceeded, "dial %d (deadline %v)", i, time.Duration(i)*step)
				continue
			}
			established++
			require.NoError(t, c.Close())
		}
		t.Logf("the fastest dial took %v; %d of %d dials with deadlines up to %v connected", full, established, dials, step*dials)
		stop()
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			t.Fatal("the listening side still holds a connection 30 s after the last dial")
		}
		waitFreed(t, before)
	}
	t.Run("cm", func(t *testing.T) {
		ctx := testContext(t)
		rxetest.CheckResources(t)
		before := rxetest.CountResources(t)
		l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
		require.NoError(t, err)
		served := serveUntilClosed(func() (<-chan struct{}, func(), error) {
			ep, err := l.Accept(ctx)
			if err != nil {
				return nil, nil, err
			}
			return ep.Done(), func() { ep.Close() }, nil
		})
		run(t, before, l.Addr().String(), func(ctx context.Context, addr string) (io.Closer, error) {
			return cm.Dial(ctx, addr)
		}, func() { l.Close() }, served)
	})
	t.Run("msg", func(t *testing.T) {
		ctx := testContext(t)
		rxetest.CheckResources(t)
		before := rxetest.CountResources(t)
		l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
		require.NoError(t, err)
		served := serveUntilClosed(func() (<-chan struct{}, func(), error) {
			c, err := l.Accept(ctx)
			if err != nil {
				return nil, nil, err
			}
			done := make(chan struct{})
			go func() { // the dialer's goodbye, or its end, ends the Recv
				defer close(done)
				for {
					if _, err := c.Recv(ctx); err != nil {
						return
					}
				}
			}()
			return done, func() { c.Close() }, nil
		})
		run(t, before, l.Addr().String(), func(ctx context.Context, addr string) (io.Closer, error) {
			return msg.Dial(ctx, addr)
		}, func() { l.Close() }, served)
	})
}

// TestAcceptsCancelledMidHandshake: Accepts whose context ends at every
// point of a handshake, with deadlines swept from 0 to one and a half
// times the fastest full dial while 60 dials come in one after another.
// A dial never waits out its own 10 s deadline: it gets a connection (the
// accepting side may end it at once) or an error matching
// syscall.ECONNREFUSED or ECONNRESET, as a TCP dial would. Every connection
// either side got ends, and every QP, CQ, PD and id is freed.
func TestAcceptsCancelledMidHandshake(t *testing.T) {
	const dials = 60
	ctx := testContext(t)
	rxetest.CheckResources(t)
	before := rxetest.CountResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	addr := l.Addr().String()
	var full time.Duration // the fastest of 3 handshakes with time to finish
	for i := range 3 {
		accepted := make(chan error, 1)
		go func() {
			ep, err := l.Accept(ctx)
			if err == nil {
				<-ep.Done()
				err = ep.Close()
			}
			accepted <- err
		}()
		start := time.Now()
		ep, err := cm.Dial(ctx, addr)
		require.NoError(t, err)
		if took := time.Since(start); i == 0 || took < full {
			full = took
		}
		require.NoError(t, ep.Close())
		require.NoError(t, <-accepted)
	}
	step := full * 3 / 2 / dials
	var accepted atomic.Int64
	attempt := 0
	// Accepts with deadlines swept over a handshake, until the listener
	// closes.
	served := serveUntilClosed(func() (<-chan struct{}, func(), error) {
		actx, cancel := context.WithTimeout(ctx, time.Duration(attempt%dials)*step)
		defer cancel()
		attempt++
		ep, err := l.Accept(actx)
		if err != nil {
			return nil, nil, err
		}
		accepted.Add(1)
		return ep.Done(), func() { ep.Close() }, nil
	})
	connected := 0
	refusals := map[string]int{}
	for i := range dials {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ep, err := cm.Dial(dctx, addr)
		cancel()
		if err != nil {
			require.NotErrorIs(t, err, context.DeadlineExceeded, "dial %d waited out its deadline", i)
			require.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED),
				"dial %d: a handshake the accepting side gave up is reset or refused, as TCP's: %v", i, err)
			refusals[err.Error()]++
			continue
		}
		connected++
		require.NoError(t, ep.Close())
	}
	require.NoError(t, l.Close())
	select {
	case <-served:
	case <-time.After(30 * time.Second):
		t.Fatal("the accepting side still holds a connection 30 s after the last dial")
	}
	t.Logf("the fastest dial took %v; %d of %d dials connected, %d Accepts returned one; refusals: %v",
		full, connected, dials, accepted.Load(), refusals)
	waitFreed(t, before)
}

// serveUntilClosed calls accept until it says the listener closed, and
// ends each connection it returns once the dialer ends it (done), by
// closeConn; other errors (handshakes given up) it passes over. The
// channel closes once the listener has closed and every connection ended.
func serveUntilClosed(accept func() (done <-chan struct{}, closeConn func(), err error)) <-chan struct{} {
	served := make(chan struct{})
	go func() {
		defer close(served)
		var conns sync.WaitGroup
		defer conns.Wait()
		for {
			done, closeConn, err := accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				<-done
				closeConn()
			}()
		}
	}()
	return served
}

// waitFreed waits until the process holds no more QPs and ids than before
// (abandoned handshakes end in the background), and fails showing what
// rdma res lists if it still does after 30 s. rxetest.CheckResources
// checks the rest.
func waitFreed(t *testing.T, before map[string]int) {
	t.Helper()
	ok := assert.Eventually(t, func() bool {
		now := rxetest.CountResources(t)
		return now["qp"] == before["qp"] && now["cm_id"] == before["cm_id"]
	}, 30*time.Second, 50*time.Millisecond, "the abandoned handshakes were never freed")
	if !ok {
		for _, what := range []string{"qp", "cq", "pd", "cm_id"} {
			out, _ := exec.Command("rdma", "-d", "res", "show", what).CombinedOutput()
			t.Logf("rdma res show %s:\n%s", what, out)
		}
	}
}
