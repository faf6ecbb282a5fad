// Package portdown takes the device's link down under connections that
// keep sending. On the testbed's kernel a CM message sent while Soft-RoCE's
// port is down (the disconnect of a connection that failed or closed then)
// stops rxe's CM for good: no later connection on the device is made
// until it is re-created. So this test has a package of its own, which
// `make test` runs in a guest of its own.
package portdown

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	addr := rxetest.Addr(t)
	client, server, err := dialOnce(ctx, addr)
	require.NoError(t, err)
	defer client.Close()
	defer server.Close()
	rxetest.KeepAddressesOnDown(t, netdev)
	rxetest.SetLink(t, netdev, "down")

	var sendErr error
	for start := time.Now(); sendErr == nil && time.Since(start) < 30*time.Second; {
		sendErr = client.Send(ctx, []byte("over a link that is down"))
		time.Sleep(time.Millisecond)
	}
	require.ErrorIs(t, sendErr, endpoint.ErrPortDown, "the send's error says the port is down")
	require.ErrorContains(t, sendErr, rxetest.Device()+" port 1 is down")
	if !rxetest.IWARP() {
		var failed *endpoint.CompletionError
		require.ErrorAs(t, sendErr, &failed)
		require.Equal(t, endpoint.StatusLocalQPOp, failed.Status)
	}
	select {
	case <-client.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the failed connection did not end")
	}
	require.ErrorIs(t, client.Err(), endpoint.ErrPortDown)
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
	var got []byte
	require.Eventually(t, func() bool {
		var err error
		again, peer, err = dialOnce(ctx, addr)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "a connection once the port is up")
	defer again.Close()
	defer peer.Close()
	require.NoError(t, again.Send(ctx, []byte("back up")))
	got, err = peer.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "back up", string(got))
}

// dialOnce listens on addr, dials the listener and accepts; the listener
// is closed on return.
func dialOnce(ctx context.Context, addr string) (dialed, accepted *msg.Conn, err error) {
	l, err := msg.Listen(ctx, net.JoinHostPort(addr, "0"))
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	type acceptance struct {
		c   *msg.Conn
		err error
	}
	got := make(chan acceptance, 1)
	go func() {
		c, err := l.Accept(ctx)
		got <- acceptance{c, err}
	}()
	dialed, err = msg.Dial(ctx, l.Addr().String())
	if err != nil {
		l.Close()
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
