// Package wire tests connections across a real link: two testbed guests
// joined by qemu's UDP socket netdev, each with rxe0 on its eth0, run this
// test binary at once (`bin/rxevm -guests 2`). Guest 0 serves, guest 1
// dials and puts netem faults on its own NIC.
package wire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A cut link is noticed by the msg keepalive (rxe's transport timeout
// never fires; see msg.WithKeepalive): silence for keepaliveTimeout ends
// the connection. cutBound leaves room for TCG. The timeout is msg's
// default, 10 s: rxe recovers a lost packet only when a later one shows
// the gap, so under 5% loss and -race a few losses in a row keep the peer
// quiet for seconds, and shorter timeouts ended healthy connections (the
// commit history has the runs).
const (
	ackTimeout       = 67 * time.Millisecond // for the devices that honour it
	keepalive        = 250 * time.Millisecond
	keepaliveTimeout = 10 * time.Second
	cutBound         = 15 * time.Second
	// closeBound is msg's bound on the goodbye's device steps (five
	// seconds) with room for the endpoint's close under TCG.
	closeBound = 8 * time.Second
)

func opts() []msg.Option {
	return []msg.Option{msg.WithCMOptions(cm.WithAckTimeout(ackTimeout)), msg.WithKeepalive(keepalive, keepaliveTimeout)}
}

// netem puts a netem qdisc on this guest's NIC until the test ends.
func netem(t *testing.T, dev string, args ...string) {
	t.Helper()
	tc(t, dev, append([]string{"qdisc", "replace", "dev", dev, "root", "netem"}, args...))
}

// tc runs each tc command (its arguments after "tc") and removes dev's root
// qdisc, with any filter on it, when the test ends.
func tc(t *testing.T, dev string, cmds ...[]string) {
	t.Helper()
	t.Cleanup(func() { exec.Command("tc", "qdisc", "del", "dev", dev, "root").Run() })
	for _, args := range cmds {
		out, err := exec.Command("tc", args...).CombinedOutput()
		require.NoError(t, err, "tc %s: %s", strings.Join(args, " "), out)
	}
}

// pair connects guest 1 to guest 0 on port; each side gets its end.
func pair(t *testing.T, ctx context.Context, port int) *msg.Conn {
	self, peer, server, _ := rxetest.Peer(t)
	if server {
		l, err := msg.Listen(ctx, net.JoinHostPort(self, fmt.Sprint(port)), opts()...)
		require.NoError(t, err)
		defer l.Close()
		c, err := l.Accept(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	var c *msg.Conn
	dialServer(t, ctx, func() (err error) {
		c, err = msg.Dial(ctx, net.JoinHostPort(peer, fmt.Sprint(port)), opts()...)
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// dialServer calls dial until it succeeds: the server's guest may boot
// later, or still be in the last test, and refuses meanwhile. Any other
// error, or ctx's end, fails the test.
func dialServer(t *testing.T, ctx context.Context, dial func() error) {
	t.Helper()
	for {
		err := dial()
		if err == nil {
			return
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			require.NoError(t, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func payload(seq, n int) []byte {
	b := make([]byte, n)
	binary.LittleEndian.PutUint64(b, uint64(seq))
	for i := 8; i < n-4; i++ {
		b[i] = byte(seq*13 + i)
	}
	binary.LittleEndian.PutUint32(b[n-4:], crc32.ChecksumIEEE(b[:n-4]))
	return b
}

func check(b []byte, seq int) error {
	if crc32.ChecksumIEEE(b[:len(b)-4]) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return fmt.Errorf("message %d corrupted", seq)
	}
	if got := int(binary.LittleEndian.Uint64(b)); got != seq {
		return fmt.Errorf("expected message %d, got %d", seq, got)
	}
	return nil
}

// transfer: the client sends 256 messages of 4000 B and one of 1 MiB (by
// rendezvous: an RDMA READ across the link); the server checks each one's
// sequence number and checksum and answers when all arrived.
func transfer(t *testing.T, port int, fault ...string) {
	name := strings.Join(fault, " ")
	if name == "" {
		name = "no fault"
	}
	transferWith(t, port, name, func(dev string) {
		if len(fault) > 0 {
			netem(t, dev, fault...)
		}
	})
}

// transferWith is transfer with a fault that setup puts on the dialer's
// guest's NIC (dev) before it dials; name describes it.
func transferWith(t *testing.T, port int, name string, setup func(dev string)) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, _, server, dev := rxetest.Peer(t)
	rxetest.CheckResources(t)
	if !server {
		setup(dev)
	}
	c := pair(t, ctx, port)
	sizes := make([]int, 257)
	for i := range 256 {
		sizes[i] = 4000
	}
	sizes[256] = 1 << 20
	if server {
		for seq, n := range sizes {
			got, err := c.Recv(ctx)
			require.NoError(t, err, "message %d", seq)
			require.Len(t, got, n)
			require.NoError(t, check(got, seq))
		}
		require.NoError(t, c.Send(ctx, []byte("all intact")))
		_, err := c.Recv(ctx) // the client's goodbye, or its close
		_ = err
		return
	}
	start := time.Now()
	total := 0
	for seq, n := range sizes {
		require.NoError(t, c.Send(ctx, payload(seq, n)), "message %d", seq)
		total += n
	}
	got, err := c.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "all intact", string(got))
	d := time.Since(start)
	t.Logf("%q: %d messages, %.1f MB in %v: %.2f MB/s, all intact", name,
		len(sizes), float64(total)/1e6, d.Round(time.Millisecond), float64(total)/d.Seconds()/1e6)
	require.NoError(t, c.Send(ctx, []byte("bye")))
}

func TestWireClean(t *testing.T)   { transfer(t, 7601) }
func TestWireLoss1(t *testing.T)   { transfer(t, 7602, "loss", "1%") }
func TestWireLoss5(t *testing.T)   { transfer(t, 7603, "loss", "5%") }
func TestWireDelay10(t *testing.T) { transfer(t, 7604, "delay", "10ms") }

// TestWireLostRTU: the dialer's guest drops every CM RTU it sends, so the
// kernel CM of the accepting side never sees the handshake end. The
// accepting side learns the connection is up from the first message it
// receives (rdma_notify); without that its Accept never returned.
func TestWireLostRTU(t *testing.T) {
	transferWith(t, 7606, "every RTU dropped", func(dev string) { dropRTU(t, dev) })
	if _, _, server, dev := rxetest.Peer(t); !server {
		requireRTUDropped(t, dev)
	}
}

// TestWireClosedBeforeRTU: the dialer's RTU is lost and the dialer closes
// at once, so the accepting side hears the disconnect before it heard that
// the handshake ended. Accept still returns the connection, already ended
// by the peer, as a TCP listener returns a connection its peer closed; it
// used to drop it and wait for another dialer, which in a loop of one dial
// and one Accept never came.
func TestWireClosedBeforeRTU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	self, peer, server, dev := rxetest.Peer(t)
	rxetest.CheckResources(t)
	const port = "7607"
	if server {
		l, err := cm.Listen(ctx, net.JoinHostPort(self, port))
		require.NoError(t, err)
		defer l.Close()
		ep, err := l.Accept(ctx)
		require.NoError(t, err, "Accept waited for another dialer")
		defer ep.Close()
		select {
		case <-ep.Done():
		case <-ctx.Done():
			t.Fatal("the connection the dialer closed did not end")
		}
		require.ErrorIs(t, ep.Err(), cm.ErrPeerDisconnected)
		return
	}
	dropRTU(t, dev)
	var ep *endpoint.Endpoint
	dialServer(t, ctx, func() (err error) {
		ep, err = cm.Dial(ctx, net.JoinHostPort(peer, port))
		return err
	})
	require.NoError(t, ep.Close())
	requireRTUDropped(t, dev)
}

// requireRTUDropped fails unless dropRTU's filter on dev dropped an RTU:
// a test that meant to lose one tested nothing otherwise.
func requireRTUDropped(t *testing.T, dev string) {
	t.Helper()
	out, err := exec.Command("tc", "-s", "filter", "show", "dev", dev, "parent", "1:").CombinedOutput()
	require.NoError(t, err, "tc: %s", out)
	m := regexp.MustCompile(`dropped (\d+)`).FindStringSubmatch(string(out))
	require.NotNil(t, m, "no drop count in tc's output: %s", out)
	require.NotEqual(t, "0", m[1], "the filter dropped no RTU: %s", out)
}

// dropRTU drops the CM's RTU messages this guest sends on dev until the
// test ends. They are RoCEv2 packets (UDP port 4791) carrying a MAD of the
// CM class (7) with attribute 0x0014; u32 offsets count from the IPv4
// header: 20 IP + 8 UDP + 12 BTH + 8 DETH, then the MAD's class at +1 and
// its attribute ID at +16.
func dropRTU(t *testing.T, dev string) {
	t.Helper()
	tc(t, dev,
		[]string{"qdisc", "replace", "dev", dev, "root", "handle", "1:", "prio"},
		[]string{"filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
			"match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791", "0xffff",
			"match", "u8", "0x07", "0xff", "at", "49", "match", "u16", "0x0014", "0xffff", "at", "64",
			"action", "drop"})
}

// cutPair is pair on port, resources checked, once each side has heard
// the other (a message exchanged both ways); the dialer then cuts its side
// of the link (netem loss 100%) until the test ends. server says which
// side this is.
func cutPair(t *testing.T, ctx context.Context, port int) (c *msg.Conn, server bool) {
	t.Helper()
	_, _, server, dev := rxetest.Peer(t)
	rxetest.CheckResources(t)
	c = pair(t, ctx, port)
	require.NoError(t, c.Send(ctx, []byte("hello")))
	_, err := c.Recv(ctx)
	require.NoError(t, err)
	if !server {
		netem(t, dev, "loss", "100%")
	}
	return c, server
}

// TestWireCut: the link is cut (netem loss 100%) and stays cut longer than
// the transport timeout. Both sides, which keep sending, end the connection
// with an error within cutBound.
func TestWireCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, server := cutPair(t, ctx, 7605)
	cut := time.Now()
	go func() { // keep reading, so the peer's credits come back until the cut
		for {
			if _, err := c.Recv(ctx); err != nil {
				return
			}
		}
	}()
	for c.Err() == nil && time.Since(cut) < cutBound {
		if err := c.Send(ctx, []byte("are you there")); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-c.Done():
	case <-time.After(cutBound - time.Since(cut)):
	}
	require.Error(t, c.Err(), "the connection must end when the link is cut")
	require.ErrorIs(t, c.Err(), msg.ErrClosed)
	t.Logf("server=%v: ended %v after the cut: %v", server, time.Since(cut).Round(time.Millisecond), c.Err())
	require.Less(t, time.Since(cut), cutBound)
}

// TestWireCloseAfterCut: Close on a connection whose peer no longer
// answers (the dialer's side of the link cut, netem loss 100%, so no
// acknowledgement of either side's goodbye comes back) returns within
// closeBound on both sides, having waited at most msg's five seconds for
// the goodbye to leave; nothing is left behind.
func TestWireCloseAfterCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, server := cutPair(t, ctx, 7606)
	if server {
		time.Sleep(500 * time.Millisecond) // the dialer cuts the link meanwhile
	}
	start := time.Now()
	err := c.Close()
	took := time.Since(start)
	t.Logf("server=%v: Close returned %v after %v", server, err, took.Round(time.Millisecond))
	require.Less(t, took, closeBound)
}

// TestWireResolveTimeout: an address on the link's subnet that no guest
// has leaves ARP unanswered, and cm.WithResolveTimeout bounds how long
// Dial waits for it: the kernel's address resolution fails at that
// timeout (ETIMEDOUT), with no ctx deadline to end it sooner. The default
// is 2 s, past the bound. (The single-guest tests cannot show this: their
// dummy0 has no ARP, so every neighbour resolves at once.) Both guests
// dial it.
func TestWireResolveTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rxetest.Peer(t)
	rxetest.CheckResources(t)
	const nobody, timeout = "10.77.1.99:7608", 300 * time.Millisecond
	start := time.Now()
	_, err := cm.Dial(ctx, nobody, cm.WithResolveTimeout(timeout))
	took := time.Since(start)
	t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	require.ErrorContains(t, err, "resolving the address")
	require.Greater(t, took, timeout*2/3, "Dial gave up before ARP could time out")
	require.Less(t, took, 1500*time.Millisecond, "Dial waited past its resolve timeout")
}
