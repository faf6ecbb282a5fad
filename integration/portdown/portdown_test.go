// Package portdown takes the device's address away, and its link down,
// under connections that keep sending. On the testbed's kernel a CM
// message sent while Soft-RoCE's port is down (the disconnect of a
// connection that failed or closed then) stops rxe's CM for good: no
// later connection on the device is made until it is re-created. So these
// tests have a package of their own, which `make test` runs in a guest of
// its own, and the test that takes the link down comes last (Go runs a
// package's tests in the order of its source).
package portdown

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

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
	defer again.Close()
	defer peer.Close()
	require.NoError(t, again.Send(ctx, []byte("back")))
	got, err := peer.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "back", string(got))
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
	defer again.Close()
	defer peer.Close()
	require.NoError(t, again.Send(ctx, []byte("back up")))
	got, err := peer.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "back up", string(got))
}

// connected is a msg connection on the device's address addr, closed
// when the test ends, and the context that bounds the test.
func connected(t *testing.T, addr string) (ctx context.Context, client, server *msg.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	rxetest.CheckResources(t) // its check runs after the closes below
	client, server, err := dialOnce(ctx, addr)
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
	var err error
	for start := time.Now(); err == nil && time.Since(start) < 30*time.Second; {
		err = client.Send(ctx, []byte("with a local fault"))
		time.Sleep(time.Millisecond)
	}
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

// dialOnce listens on addr, then dials the listener and accepts
// (dialAccepted); the listener is closed on return.
func dialOnce(ctx context.Context, addr string) (dialed, accepted *msg.Conn, err error) {
	l, err := msg.Listen(ctx, net.JoinHostPort(addr, "0"))
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	return dialAccepted(ctx, l)
}

// dialAccepted dials l and accepts the connection: both its ends, or an
// error and neither.
func dialAccepted(ctx context.Context, l *msg.Listener) (dialed, accepted *msg.Conn, err error) {
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
	dialed, err = msg.Dial(ctx, l.Addr().String())
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
