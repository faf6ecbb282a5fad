package integration

import (
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/verbs"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// deviceAttr is what the device behind host says it holds.
func deviceAttr(t *testing.T, host string) verbs.DeviceAttr {
	t.Helper()
	ai, err := verbs.GetAddrInfo(host, "0", true, verbs.PortSpaceTCP)
	require.NoError(t, err)
	defer ai.Free()
	id, err := verbs.CreateEP(ai)
	require.NoError(t, err)
	defer id.DestroyEP()
	attr, err := id.Context().QueryDevice()
	require.NoError(t, err)
	return attr
}

// dialInBackground runs dial in a goroutine, closes what it connected,
// and sends its error.
func dialInBackground(dial func() (io.Closer, error)) <-chan error {
	dialed := make(chan error, 1)
	go func() {
		c, err := dial()
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	return dialed
}

// TestOptionsBeyondTheDeviceAreRefused: a connection option the device
// cannot hold fails with an error matching endpoint.ErrInvalid that names
// the option: Dial; Listen, cm's and msg's, on the device's address and on
// a wildcard (the testbed's one device can hold none of them); for the
// inline size, which only a QP's creation tells, Accept on either
// listener, which rejects the dialer rather than wait on; and dgram's
// Listen (on iWARP, refused for want of datagrams). Nothing is left
// behind.
func TestOptionsBeyondTheDeviceAreRefused(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	host := rxetest.Addr(t)
	dev := deviceAttr(t, host)
	require.Len(t, verbs.Devices(), 1, "the testbed's one device")
	t.Logf("device: %d requests a queue, %d entries a CQ, %d SGEs, %d requests a shared receive queue", dev.MaxQPWR, dev.MaxCQE, dev.MaxSGE, dev.MaxSRQWR)
	type limitCase struct {
		name        string
		opt         cm.Option
		says        string
		onlyACreate bool // only creating a QP tells: Listen cannot
	}
	cases := []limitCase{
		{"queue depth", cm.WithQueueDepth(dev.MaxQPWR + 1), "cm.WithQueueDepth", false},
		{"receive depth", cm.WithRecvDepth(dev.MaxQPWR + 1), "WithRecvDepth", false},
		{"SGEs", cm.WithMaxSGE(dev.MaxSGE + 1), "cm.WithMaxSGE", false},
		{"inline", cm.WithInline(1 << 20), "cm.WithInline", true},
	}
	if 2*dev.MaxQPWR > dev.MaxCQE {
		cases = append(cases, limitCase{"completion queue", cm.WithQueueDepth(dev.MaxQPWR), "completion queue", false})
	}
	good, err := cm.Listen(ctx, net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	defer good.Close()
	for _, tc := range cases {
		_, err := cm.Dial(ctx, good.Addr().String(), tc.opt)
		require.ErrorIs(t, err, endpoint.ErrInvalid, tc.name)
		require.ErrorContains(t, err, tc.says, tc.name)

		for _, at := range []string{host, ""} {
			l, err := cm.Listen(ctx, net.JoinHostPort(at, "0"), tc.opt)
			if !tc.onlyACreate {
				require.ErrorIs(t, err, endpoint.ErrInvalid, "%s: Listen on %q", tc.name, at)
				require.ErrorContains(t, err, tc.says, tc.name)
				continue
			}
			require.NoError(t, err, tc.name)
			_, lport, err := net.SplitHostPort(l.Addr().String())
			require.NoError(t, err)
			dialed := dialInBackground(func() (io.Closer, error) { return cm.Dial(ctx, net.JoinHostPort(host, lport)) })
			_, err = l.Accept(ctx)
			require.ErrorIs(t, err, endpoint.ErrInvalid, "%s: Accept on %q", tc.name, at)
			require.ErrorContains(t, err, tc.says, tc.name)
			var reject *cm.RejectError
			require.ErrorAs(t, <-dialed, &reject, "%s: the dialer is rejected", tc.name)
			require.NoError(t, l.Close())
		}
	}

	_, err = cm.Listen(ctx, net.JoinHostPort(host, "0"), cm.WithSharedReceiveQueue(dev.MaxSRQWR+1))
	require.ErrorIs(t, err, endpoint.ErrInvalid, "a shared receive queue")
	require.ErrorContains(t, err, "cm.WithSharedReceiveQueue")
	// Refused after the shared receive queue was made: it is destroyed
	// (CheckResources).
	_, err = cm.Listen(ctx, net.JoinHostPort(host, "0"), cm.WithSharedReceiveQueue(16), cm.WithSendDepth(dev.MaxQPWR+1))
	require.ErrorIs(t, err, endpoint.ErrInvalid, "a shared receive queue, then a send depth")
	require.ErrorContains(t, err, "WithSendDepth")

	for name, opt := range map[string]msg.Option{
		"msg receive depth": msg.WithRecvDepth(dev.MaxQPWR + 1),
		"msg SGEs":          msg.WithCMOptions(cm.WithMaxSGE(dev.MaxSGE + 1)),
	} {
		for _, at := range []string{host, ""} {
			_, err := msg.Listen(ctx, net.JoinHostPort(at, "0"), opt)
			require.ErrorIs(t, err, endpoint.ErrInvalid, "%s: Listen on %q", name, at)
		}
	}
	l, err := msg.Listen(ctx, ":0", msg.WithCMOptions(cm.WithInline(1<<20)))
	require.NoError(t, err)
	_, lport, err := net.SplitHostPort(l.Addr().String())
	require.NoError(t, err)
	dialed := dialInBackground(func() (io.Closer, error) { return msg.Dial(ctx, net.JoinHostPort(host, lport)) })
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, endpoint.ErrInvalid, "msg inline: Accept")
	require.Error(t, <-dialed, "msg inline: the dialer is refused")
	require.NoError(t, l.Close())
	connect(t, ctx, cm.WithMaxSGE(dev.MaxSGE)) // the device's own limit passes

	dgramCases := map[string]dgram.Option{
		"dgram.WithSendDepth": dgram.WithSendDepth(dev.MaxQPWR + 1),
		"dgram.WithRecvDepth": dgram.WithRecvDepth(dev.MaxQPWR + 1),
	}
	if dev.MaxCQE < dev.MaxQPWR {
		dgramCases["completion queue"] = dgram.WithRecvDepth(dev.MaxCQE + 1)
	}
	for says, opt := range dgramCases {
		_, err := dgram.Listen(ctx, net.JoinHostPort(host, "0"), opt)
		if rxetest.IWARP() { // no datagram queue pairs: refused first
			require.ErrorIs(t, err, dgram.ErrNoIWARP, says)
			continue
		}
		require.ErrorIs(t, err, endpoint.ErrInvalid, says)
		require.ErrorContains(t, err, says)
	}
}

// TestHTTPServeEndsOnOptionsBeyondTheDevice: net/http's Server retries an
// Accept error only if it is temporary. rdmanet's wildcard listener with
// an inline size its device cannot hold (which only Accept can tell)
// fails Accept, once a dialer comes, with an error matching
// endpoint.ErrInvalid that is not temporary, so Serve returns it rather
// than retrying for ever; the dialer is refused.
func TestHTTPServeEndsOnOptionsBeyondTheDevice(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	host := rxetest.Addr(t)
	l, err := rdmanet.Listen(ctx, ":0", rdmanet.WithMsgOptions(msg.WithCMOptions(cm.WithInline(1<<20))))
	require.NoError(t, err)
	served := make(chan error, 1)
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go func() { served <- srv.Serve(l) }()
	_, lport, err := net.SplitHostPort(l.Addr().String())
	require.NoError(t, err)
	dialed := dialInBackground(func() (io.Closer, error) { return rdmanet.Dial(ctx, net.JoinHostPort(host, lport)) })
	select {
	case err := <-served:
		require.ErrorIs(t, err, endpoint.ErrInvalid)
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		require.False(t, ne.Timeout())
	case <-ctx.Done():
		t.Fatal("Serve still running: it took the refusal for a temporary error")
	}
	require.Error(t, <-dialed, "the dialer is refused")
	require.NoError(t, srv.Close())
}
