package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"syscall"
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
	l, srq, pool := srqListener(t, ctx, 8, 8)
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
	_, err := srq.Destroy()
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

// srqListener listens on the device with a shared receive queue of depth
// receives and makes a pool of n 64-byte buffers in its PD; the caller
// closes them.
func srqListener(t *testing.T, ctx context.Context, depth, n int) (*cm.Listener, *endpoint.SRQ, *bufpool.Pool) {
	t.Helper()
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithSharedReceiveQueue(depth))
	require.NoError(t, err)
	srq := l.SRQ()
	require.NotNil(t, srq)
	pool, err := bufpool.New(srq.PD(), bufpool.Size(64), bufpool.Count(n))
	require.NoError(t, err)
	return l, srq, pool
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

// TestSharedReceiveQueueOnASharedPD: a listener given a protection domain
// (cm.WithPD) makes its SRQ in it: buffers of a pool made there before
// any connection are posted to the SRQ, and an accepted endpoint's
// message lands in one; once the application has closed the PD, the
// listener accepts no more connections on it (Accept fails with
// ErrInvalid, the dialer is refused), the SRQ still takes its buffers
// until Destroy, and the PD makes no SRQ.
func TestSharedReceiveQueueOnASharedPD(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	addr := net.JoinHostPort(rxetest.Addr(t), "0")
	pd, err := bufpool.OpenPD(ctx, rxetest.Addr(t))
	require.NoError(t, err)
	pool, err := bufpool.New(pd, bufpool.Size(64), bufpool.Count(2))
	require.NoError(t, err)
	l, err := cm.Listen(ctx, addr, cm.WithSharedReceiveQueue(4), cm.WithPD(pd))
	require.NoError(t, err)
	srq := l.SRQ()
	b, _ := pool.TryGet()
	require.NoError(t, srq.PostRecv("shared", b), "a buffer of the listener's PD")

	got := make(chan *endpoint.Endpoint, 1)
	go func() {
		ep, err := l.Accept(ctx)
		if err != nil {
			t.Errorf("accept: %v", err)
		}
		got <- ep
	}()
	client, err := cm.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	server := <-got
	require.NotNil(t, server)
	cp := newPool(t, client, 64, 1)
	sb, _ := cp.TryGet()
	copy(sb.Bytes(), "hello")
	require.NoError(t, client.PostSend(nil, sb, 5))
	require.NoError(t, next(t, client).Err)
	require.NoError(t, cp.Put(sb))
	rc := next(t, server)
	require.NoError(t, rc.Err)
	require.Equal(t, "shared", rc.Context)
	require.Equal(t, "hello", string(rc.Buffer.Bytes()[:rc.Len]))
	require.NoError(t, pool.Put(rc.Buffer))

	// Closed by the application, the PD makes no more connections, but
	// what uses it keeps it.
	require.NoError(t, pd.Close())
	b, _ = pool.TryGet()
	require.NoError(t, srq.PostRecv("after", b))
	refused := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctx)
		refused <- err
	}()
	_, err = cm.Dial(ctx, l.Addr().String())
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "a dial after the PD's Close")
	require.ErrorIs(t, <-refused, endpoint.ErrInvalid)
	closeAndDrain(t, client)
	closeAndDrain(t, server)
	require.NoError(t, l.Close())
	pending, err := srq.Destroy()
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, "after", pending[0].Context)
	require.NoError(t, pool.Put(pending[0].Buffer))
	require.NoError(t, pool.Close())

	_, err = cm.Listen(ctx, addr, cm.WithSharedReceiveQueue(4), cm.WithPD(pd))
	require.ErrorIs(t, err, endpoint.ErrInvalid, "a closed PD")
}

// TestSharedReceiveQueueRefusesBadPosts: SRQ.PostRecv refuses a nil
// buffer and one registered in another protection domain with
// ErrInvalid, a receive beyond its depth with ErrQueueFull, and any after
// Destroy with ErrClosed; nothing refused is posted (Pending), and
// Destroy gives back each posted receive once.
func TestSharedReceiveQueueRefusesBadPosts(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, srq, pool := srqListener(t, ctx, 2, 3)
	other, err := bufpool.OpenPD(ctx, rxetest.Addr(t))
	require.NoError(t, err)
	otherPool, err := bufpool.New(other, bufpool.Size(64), bufpool.Count(1))
	require.NoError(t, err)

	require.ErrorIs(t, srq.PostRecv("nil", nil), endpoint.ErrInvalid)
	ob, _ := otherPool.TryGet()
	err = srq.PostRecv("other", ob)
	require.ErrorIs(t, err, endpoint.ErrInvalid)
	require.ErrorContains(t, err, "another protection domain")
	for i := range 2 {
		b, _ := pool.TryGet()
		require.NoError(t, srq.PostRecv(i, b))
	}
	extra, _ := pool.TryGet()
	require.ErrorIs(t, srq.PostRecv("extra", extra), endpoint.ErrQueueFull)
	require.Equal(t, 2, srq.Pending())

	require.NoError(t, l.Close())
	pending, err := srq.Destroy()
	require.NoError(t, err)
	require.Len(t, pending, 2)
	for i, c := range pending {
		require.Equal(t, i, c.Context)
		require.ErrorIs(t, c.Err, endpoint.ErrClosed)
		require.NoError(t, pool.Put(c.Buffer))
	}
	require.ErrorIs(t, srq.PostRecv("late", extra), endpoint.ErrClosed)
	again, err := srq.Destroy()
	require.NoError(t, err, "Destroy again")
	require.Empty(t, again)

	require.NoError(t, pool.Put(extra))
	require.NoError(t, otherPool.Put(ob))
	require.NoError(t, errors.Join(pool.Close(), otherPool.Close(), other.Close()))
}
