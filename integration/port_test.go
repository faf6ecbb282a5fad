package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// TestPortDownAndUpIsLogged: the device's netdev taken down and up again
// (ip link) under an idle connection. The device reports its port's state
// (IBV_EVENT_PORT_ERR, then IBV_EVENT_PORT_ACTIVE), which the library
// reads from the device's asynchronous events: each end of the connection
// logs the port going down at warn level and coming back at info level.
// On rxe the connection is not ended by it, and carries a message each
// way afterwards; siw disconnects it, and a new one does. Nothing leaks.
func TestPortDownAndUpIsLogged(t *testing.T) {
	netdev := rxetest.Netdev(t)
	ctx := testContext(t)
	rxetest.CheckResources(t)
	var log lockedBuffer
	p := connect(t, ctx, cm.WithLogger(zerolog.New(&log)))
	rxetest.KeepAddressesOnDown(t, netdev)

	rxetest.SetLink(t, netdev, "down")
	logged := func(what string) func() bool {
		return func() bool { return strings.Count(log.String(), what) == 2 }
	}
	require.Eventually(t, logged("went down (IBV_EVENT_PORT_ERR)"), 10*time.Second, 10*time.Millisecond,
		"both ends log the port going down: %s", &log)
	require.Contains(t, log.String(), `"level":"warn"`)
	rxetest.SetLink(t, netdev, "up")
	require.Eventually(t, logged("up again (IBV_EVENT_PORT_ACTIVE)"), 10*time.Second, 10*time.Millisecond,
		"both ends log the port coming back: %s", &log)
	if rxetest.IWARP() {
		// siw disconnects every connection on its netdev when the
		// netdev goes down, and each end learns of it from the CM. A
		// new connection works once the port is back.
		for _, ep := range []*endpoint.Endpoint{p.client, p.server} {
			select {
			case <-ep.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("siw disconnected, but an end did not hear")
			}
			require.ErrorIs(t, ep.Err(), endpoint.ErrClosed)
		}
		p = connect(t, ctx)
	}
	require.NoError(t, p.client.Err())
	require.NoError(t, p.server.Err())
	require.NoError(t, echoOnce(t, ctx, p))
	require.NoError(t, echoOnce(t, ctx, &pair{client: p.server, server: p.client}))
}

// TestDatagramSendWhileLocalFaultNamesIt: the device's netdev taken down,
// or the Conn's address deleted from it, under a datagram Conn that keeps
// writing. Soft-RoCE fails the sends, which breaks the queue pair; the
// first write that finds it fails with an error matching
// endpoint.ErrPortDown and naming the port, or endpoint.ErrAddressGone
// and naming the address (it still matches endpoint.ErrClosed), and so
// does every write after it, the port up or the address back again or
// not. On iWARP dgram refuses the Conn (listenDgram).
func TestDatagramSendWhileLocalFaultNamesIt(t *testing.T) {
	netdev := rxetest.Netdev(t)
	addr := rxetest.Addr(t)
	for _, fault := range []struct {
		name string
		want error
		says string
		// takeAway makes the fault, and returns what ends it.
		takeAway func(t *testing.T) (giveBack func())
	}{
		{"PortDown", endpoint.ErrPortDown, rxetest.Device() + " port 1 is down", func(t *testing.T) func() {
			rxetest.KeepAddressesOnDown(t, netdev)
			rxetest.SetLink(t, netdev, "down")
			return func() { rxetest.SetLink(t, netdev, "up") }
		}},
		{"AddressGone", endpoint.ErrAddressGone, addr + " is no longer an address of this host", func(t *testing.T) func() {
			return rxetest.RemoveAddress(t, netdev, addr)
		}},
	} {
		t.Run(fault.name, func(t *testing.T) {
			ctx := testContext(t)
			rxetest.CheckResources(t)
			_, cli, to := resolvedDgramPair(t, ctx)
			if cli == nil {
				return
			}
			giveBack := fault.takeAway(t)
			var err error
			for start := time.Now(); err == nil && time.Since(start) < 30*time.Second; {
				_, err = cli.WriteTo([]byte("with a local fault"), to)
				time.Sleep(time.Millisecond)
			}
			require.ErrorIs(t, err, fault.want)
			require.ErrorIs(t, err, endpoint.ErrClosed)
			require.ErrorContains(t, err, fault.says)
			giveBack()
			_, err = cli.WriteTo([]byte("after"), to)
			require.ErrorIs(t, err, fault.want, "the queue pair stays broken, and says why")
		})
	}
}
