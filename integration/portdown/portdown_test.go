// Package portdown takes the device's address away, gives its netdev
// another MAC address, and takes its link down, under connections. On the
// testbed's kernel a CM message sent while Soft-RoCE's port is down (the
// disconnect of a connection that failed or closed then) stops rxe's CM
// for good: no later connection on the device is made until it is
// re-created. So these tests have a package of their own, which `make
// test` runs in a guest of its own, and the test that takes the link down
// comes last (Go runs a package's tests in the order of its source).
package portdown

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAddressGoneNamesIt: the connection's local address deleted from
// the device's netdev under a msg connection that keeps sending, on its
// IPv4 address and on its IPv6 one. The connection fails, and its errors
// match endpoint.ErrAddressGone and name the address: on rxe the first
// request sent after it went fails at once (a local QP operation error,
// which alone says nothing of the address), and on siw the connection's
// TCP stream goes silent, and msg's keepalive ends it (msg.ErrPeerSilent,
// which alone reads as the peer's fault). Both ends were on the address,
// and both say so. A dial meanwhile fails at once: no route is left to
// the address. A listener on the address, made before it went, takes a
// new connection once it is back, which carries a message. Nothing
// leaks.
func TestAddressGoneNamesIt(t *testing.T) {
	netdev := rxetest.Netdev(t) // skips outside the testbed
	t.Run("IPv4", func(t *testing.T) { addressGoneNamesIt(t, netdev, rxetest.Addr(t)) })
	t.Run("IPv6", func(t *testing.T) {
		addr6 := os.Getenv("RDMACM_TEST_ADDR6") // the testbed's
		require.NotEmpty(t, addr6, "RDMACM_TEST_ADDR6")
		addressGoneNamesIt(t, netdev, addr6)
	})
}

// addressGoneNamesIt is TestAddressGoneNamesIt on addr, an address of
// netdev.
func addressGoneNamesIt(t *testing.T, netdev, addr string) {
	ctx, client, server := connected(t, addr)
	gone := addr + " is no longer an address of this host"
	l, err := msg.Listen(ctx, net.JoinHostPort(addr, "0"))
	require.NoError(t, err)
	defer l.Close()

	t.Run("Gone", func(t *testing.T) {
		rxetest.RemoveAddress(t, netdev, addr) // until this subtest ends
		sendErr := requireSendFails(t, ctx, client, endpoint.ErrAddressGone, gone)
		if rxetest.IWARP() {
			require.ErrorIs(t, sendErr, msg.ErrPeerSilent)
		}
		// The server's end sends too (credits, keepalives), or hears
		// nothing for as long as the keepalive allows.
		_, err := server.Recv(ctx)
		require.ErrorIs(t, err, endpoint.ErrAddressGone)
		require.ErrorContains(t, err, gone)

		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = msg.Dial(short, l.Addr().String())
		require.ErrorIs(t, err, syscall.ENETUNREACH, "a dial while the address is gone")
	})

	again, peer, err := dialAccepted(ctx, l)
	require.NoError(t, err, "a connection once the address is back, on the listener made before it went")
	requireCarries(t, ctx, again, peer)
}

// TestMACChangeIsLogged: the device's netdev given another MAC address
// under a msg connection. Soft-RoCE derives its GID table from the
// netdev's addresses and re-creates every entry: each end logs the GID
// table's change (IBV_EVENT_GID_CHANGE), and the connection's next send
// fails with a local QP operation error, though its port is active and
// its address assigned (neither ErrPortDown nor ErrAddressGone), while a
// new connection is made and carries a message. soft-iWARP reports no GID
// change (a LID change, logged at debug level), and the connection
// carries on; but its device keeps the MAC address it was made with, and
// rdma_cm finds no device for the address (ENODEV) until the netdev has
// it back. Once it has, a new connection carries a message on either
// device. Nothing leaks.
func TestMACChangeIsLogged(t *testing.T) {
	netdev := rxetest.Netdev(t)
	addr := rxetest.Addr(t)
	var changes atomic.Int32
	log := zerolog.New(io.Discard).Level(zerolog.InfoLevel).Hook(zerolog.HookFunc(
		func(_ *zerolog.Event, _ zerolog.Level, m string) {
			if strings.Contains(m, "IBV_EVENT_GID_CHANGE") {
				changes.Add(1)
			}
		}))
	ctx, client, server := connected(t, addr, msg.WithLogger(log))
	putBack := rxetest.SetMAC(t, netdev, "02:00:00:00:00:99")

	if rxetest.IWARP() {
		require.NoError(t, client.Send(ctx, []byte("after")))
		got, err := server.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, "after", string(got))
		require.Zero(t, changes.Load(), "siw has no GID table")
		_, _, err = dialOnce(ctx, addr)
		require.ErrorIs(t, err, syscall.ENODEV, "siw0 follows the netdev's MAC address: update the test")
	} else {
		require.Eventually(t, func() bool { return changes.Load() >= 2 }, 10*time.Second, 10*time.Millisecond,
			"both ends log the GID table's change")
		err := sendUntilFails(ctx, client)
		var failed *endpoint.CompletionError
		require.ErrorAs(t, err, &failed)
		require.Equal(t, endpoint.StatusLocalQPOp, failed.Status)
		require.NotErrorIs(t, err, endpoint.ErrPortDown)
		require.NotErrorIs(t, err, endpoint.ErrAddressGone)
		requireConnects(t, ctx, addr)
	}
	putBack()
	requireConnects(t, ctx, addr)
}

// requireConnects makes a new connection on addr, which must carry a
// message.
func requireConnects(t *testing.T, ctx context.Context, addr string) {
	t.Helper()
	dialed, accepted, err := dialOnce(ctx, addr)
	require.NoError(t, err, "a new connection")
	requireCarries(t, ctx, dialed, accepted)
}

// requireCarries sends a message from a connection's dialed end, which
// its accepted end must receive, and closes both.
func requireCarries(t *testing.T, ctx context.Context, dialed, accepted *msg.Conn) {
	t.Helper()
	defer dialed.Close()
	defer accepted.Close()
	require.NoError(t, dialed.Send(ctx, []byte("a new connection")))
	got, err := accepted.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "a new connection", string(got))
}

// TestPortDownNamesThePort: the device's netdev taken down under a msg
// connection that keeps sending. The connection fails within seconds, and
// its errors match endpoint.ErrPortDown and name the port: on rxe the
// first request sent while the port is down fails at once (a local QP
// operation error, which alone says nothing of the link), and on siw the
// CM disconnects both ends (which alone reads as the peer leaving). Once
// the port is up again, siw makes a new connection; rxe's CM no longer
// answers (see the package comment), and a dial ends at its context's
// deadline. Nothing leaks.
func TestPortDownNamesThePort(t *testing.T) {
	netdev := rxetest.Netdev(t)
	addr := rxetest.Addr(t)
	ctx, client, server := connected(t, addr)
	rxetest.KeepAddressesOnDown(t, netdev)
	rxetest.SetLink(t, netdev, "down")

	requireSendFails(t, ctx, client, endpoint.ErrPortDown, rxetest.Device()+" port 1 is down")
	require.ErrorIs(t, client.Send(ctx, []byte("again")), endpoint.ErrPortDown)
	if rxetest.IWARP() {
		// The CM told the server's end too, while its port was down.
		_, err := server.Recv(ctx)
		require.ErrorIs(t, err, endpoint.ErrPortDown)
	}

	rxetest.SetLink(t, netdev, "up")
	if !rxetest.IWARP() {
		short, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, _, err := dialOnce(short, addr)
		require.ErrorIs(t, err, context.DeadlineExceeded, "rxe's CM answers again: the package comment is out of date")
		return
	}
	var again, peer *msg.Conn
	require.Eventually(t, func() bool {
		var err error
		again, peer, err = dialOnce(ctx, addr)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "a connection once the port is up")
	requireCarries(t, ctx, again, peer)
}

// connected is a msg connection on the device's address addr, with opts
// on both ends, closed when the test ends, and the context that bounds
// the test.
func connected(t *testing.T, addr string, opts ...msg.Option) (ctx context.Context, client, server *msg.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	rxetest.CheckResources(t) // its check runs after the closes below
	client, server, err := dialOnce(ctx, addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return ctx, client, server
}

// requireSendFails sends on client until a send fails, which must be
// within 30 s, with an error that matches want and says says. On RoCE
// the failure must be the device's, a local QP operation error. The
// connection must then end, with Err matching want. It returns the send's
// error.
func requireSendFails(t *testing.T, ctx context.Context, client *msg.Conn, want error, says string) error {
	t.Helper()
	err := sendUntilFails(ctx, client)
	require.ErrorIs(t, err, want, "the send's error says why")
	require.ErrorContains(t, err, says)
	if !rxetest.IWARP() {
		var failed *endpoint.CompletionError
		require.ErrorAs(t, err, &failed)
		require.Equal(t, endpoint.StatusLocalQPOp, failed.Status)
	}
	select {
	case <-client.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the failed connection did not end")
	}
	require.ErrorIs(t, client.Err(), want)
	return err
}

// sendUntilFails sends on client until a send fails, for 30 s at most,
// and returns the send's error (nil if none failed).
func sendUntilFails(ctx context.Context, client *msg.Conn) error {
	var err error
	for start := time.Now(); err == nil && time.Since(start) < 30*time.Second; {
		err = client.Send(ctx, []byte("with a local fault"))
		time.Sleep(time.Millisecond)
	}
	return err
}

// dialOnce listens on addr, then dials the listener and accepts
// (dialAccepted), with opts on both ends; the listener is closed on
// return.
func dialOnce(ctx context.Context, addr string, opts ...msg.Option) (dialed, accepted *msg.Conn, err error) {
	l, err := msg.Listen(ctx, net.JoinHostPort(addr, "0"), opts...)
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	return dialAccepted(ctx, l, opts...)
}

// dialAccepted dials l, with opts, and accepts the connection: both its
// ends, or an error and neither.
func dialAccepted(ctx context.Context, l *msg.Listener, opts ...msg.Option) (dialed, accepted *msg.Conn, err error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	type acceptance struct {
		c   *msg.Conn
		err error
	}
	got := make(chan acceptance, 1)
	go func() {
		c, err := l.Accept(actx)
		got <- acceptance{c, err}
	}()
	dialed, err = msg.Dial(ctx, l.Addr().String(), opts...)
	if err != nil {
		cancel()
		if a := <-got; a.c != nil {
			a.c.Close()
		}
		return nil, nil, err
	}
	a := <-got
	if a.err != nil {
		dialed.Close()
		return nil, nil, a.err
	}
	return dialed, a.c, nil
}
