package integration

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

// TestSharedReceiveQueue: two accepted endpoints draw their receives from
// the listener's SRQ; each message's receive context comes back on the
// endpoint it arrived on, and Destroy returns the receives never used.
func TestSharedReceiveQueue(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithSharedReceiveQueue(8))
	require.NoError(t, err)
	srq := l.SRQ()
	require.NotNil(t, srq)
	pool, err := bufpool.New(srq.PD(), bufpool.Size(64), bufpool.Count(8))
	require.NoError(t, err)
	for i := range 8 {
		b, _ := pool.TryGet()
		require.NoError(t, srq.PostRecv(i, b))
	}
	b, _ := pool.TryGet()
	require.Nil(t, b, "all 8 buffers are posted")

	var servers, clients []*endpoint.Endpoint
	for range 2 {
		got := make(chan *endpoint.Endpoint, 1)
		go func() {
			ep, _ := l.Accept(ctx)
			got <- ep
		}()
		c, err := cm.Dial(ctx, l.Addr().String())
		require.NoError(t, err)
		clients = append(clients, c)
		s := <-got
		require.NotNil(t, s)
		servers = append(servers, s)
	}
	require.ErrorIs(t, servers[0].PostRecv("own", &bufpool.Buffer{}), endpoint.ErrInvalid)

	used := map[any]bool{}
	for ci, c := range clients {
		cp := newPool(t, c, 64, 2)
		for m := range 2 {
			sb, _ := cp.TryGet()
			binary.LittleEndian.PutUint32(sb.Bytes(), uint32(ci*10+m))
			require.NoError(t, c.PostSend(nil, sb, 4))
			require.NoError(t, next(t, c).Err)
			require.NoError(t, cp.Put(sb))
			rc := next(t, servers[ci])
			require.NoError(t, rc.Err)
			require.Equal(t, uint32(ci*10+m), binary.LittleEndian.Uint32(rc.Buffer.Bytes()))
			require.False(t, used[rc.Context], "receive %v used twice", rc.Context)
			used[rc.Context] = true
			require.NoError(t, pool.Put(rc.Buffer))
		}
	}
	require.Equal(t, 4, srq.Pending())
	_, err = srq.Destroy()
	require.Error(t, err, "Destroy refuses while endpoints use the SRQ")
	for _, ep := range append(clients, servers...) {
		closeAndDrain(t, ep)
	}
	require.NoError(t, l.Close())
	pending, err := srq.Destroy()
	require.NoError(t, err)
	require.Len(t, pending, 4)
	for _, c := range pending {
		require.ErrorIs(t, c.Err, endpoint.ErrClosed)
		require.False(t, used[c.Context])
		require.NoError(t, pool.Put(c.Buffer))
	}
	require.NoError(t, pool.Close())
}

// TestSharedReceiveQueueNeedsOneDevice: a shared receive queue lives on
// one device, so a listener on a wildcard, of one family or both, refuses
// it with an error that says so, and frees what it had bound.
func TestSharedReceiveQueueNeedsOneDevice(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		l, err := cm.Listen(ctx, addr, cm.WithSharedReceiveQueue(8))
		require.Nil(t, l)
		require.ErrorContains(t, err, "not a wildcard", addr)
	}
}
