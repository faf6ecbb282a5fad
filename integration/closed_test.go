package integration

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/internal/callall"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// TestClosedValuesNeitherPanicNorHang: once closed (or answered,
// released, shut down), every exported method of every value the library
// makes returns, at once, without a panic: a call after Close fails or
// gives what is left, as net's conns do, whatever it is given. Each
// method is called with zero arguments and a live context (callall).
// Nothing is left behind.
func TestClosedValuesNeitherPanicNorHang(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	host := rxetest.Addr(t)
	var closed []any

	// endpoint and cm: a connected pair, its listener, an answered
	// request, a listener's shared receive queue.
	l, client, server, err := dialPair(ctx, host)
	require.NoError(t, err)
	require.NoError(t, client.CloseAndDrain(nil))
	require.NoError(t, server.CloseAndDrain(nil))
	require.NoError(t, l.Close())
	closed = append(closed, client, server, l)

	l, err = cm.Listen(ctx, net.JoinHostPort(host, "0"), cm.WithSharedReceiveQueue(16))
	require.NoError(t, err)
	answered := make(chan *cm.Request, 1)
	go func() {
		req, err := l.AcceptRequest(ctx)
		if err == nil {
			req.Reject(nil)
		}
		answered <- req
	}()
	_, err = cm.Dial(ctx, l.Addr().String())
	require.Error(t, err, "rejected")
	req := <-answered
	require.NotNil(t, req)
	srq := l.SRQ()
	require.NoError(t, l.Close())
	_, err = srq.Destroy()
	require.NoError(t, err)
	closed = append(closed, req, srq, l)

	// bufpool: a PD, a pool and one of its buffers, a region.
	pd, err := bufpool.OpenPD(ctx, host)
	require.NoError(t, err)
	pool, err := bufpool.New(pd, bufpool.Size(64), bufpool.Count(2))
	require.NoError(t, err)
	buf, err := pool.Get(ctx)
	require.NoError(t, err)
	require.NoError(t, pool.Put(buf))
	region, err := bufpool.NewRegion(pd, 4096, bufpool.RemoteRead)
	require.NoError(t, err)
	require.NoError(t, region.Close())
	require.NoError(t, pool.Close())
	require.NoError(t, pd.Close())
	closed = append(closed, pd, pool, buf, region)

	// msg: a pair and its listener, a message read and released, a
	// client and its server.
	mc, ms, ml := msgPair(t, ctx)
	require.NoError(t, mc.Send(ctx, []byte("x")))
	m, err := ms.RecvMessage(ctx)
	require.NoError(t, err)
	m.Release()
	require.NoError(t, mc.Close())
	require.NoError(t, ms.Close())
	require.NoError(t, ml.Close())
	cl, srv, stop := rpcClient(t, ctx)
	stop()
	closed = append(closed, mc, ms, ml, m, cl, srv)

	// rdmanet: a pair and a listener.
	rl, err := rdmanet.Listen(ctx, net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	require.NoError(t, rl.Close())
	c1, c2, stopPair, err := rdmanetPair(t)
	require.NoError(t, err)
	stopPair()
	closed = append(closed, rl, c1, c2)

	// dgram, where the device has datagrams.
	if dc, err := dgram.Listen(ctx, net.JoinHostPort(host, "0")); rxetest.IWARP() {
		require.ErrorIs(t, err, dgram.ErrNoIWARP)
	} else {
		require.NoError(t, err)
		require.NoError(t, dc.Close())
		closed = append(closed, dc)
	}

	for _, v := range closed {
		for _, problem := range callall.Every(v, nil) {
			t.Error(problem)
		}
	}
}
