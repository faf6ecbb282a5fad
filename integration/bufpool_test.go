package integration

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

func TestPoolGetPut(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	pool := newPool(t, p.client, 1000, 3)
	require.Equal(t, bufpool.Stats{Size: 1000, Count: 3, Free: 3, Out: 0}, pool.Stats())
	var bufs []*bufpool.Buffer
	for range 3 {
		b, ok := pool.TryGet()
		require.True(t, ok)
		require.Len(t, b.Bytes(), 1000)
		bufs = append(bufs, b)
	}
	_, ok := pool.TryGet()
	require.False(t, ok, "an empty pool gives nothing")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := pool.Get(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, 3, pool.Stats().Out)

	// Get waits for a Put.
	got := make(chan *bufpool.Buffer)
	go func() {
		b, _ := pool.Get(ctx)
		got <- b
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, pool.Put(bufs[0]))
	require.Same(t, bufs[0], <-got)

	require.NoError(t, pool.Put(bufs[1]))
	require.ErrorIs(t, pool.Put(bufs[1]), bufpool.ErrDoublePut)
	require.Equal(t, 1, pool.Stats().Free, "a refused Put changes nothing")

	other := newPool(t, p.client, 1000, 1)
	ob, _ := other.TryGet()
	require.ErrorIs(t, pool.Put(ob), bufpool.ErrForeignBuffer)
	require.NoError(t, other.Put(ob))
	require.NoError(t, pool.Put(bufs[0]))
	require.NoError(t, pool.Put(bufs[2]))
	require.Equal(t, bufpool.Stats{Size: 1000, Count: 3, Free: 3, Out: 0}, pool.Stats())
	_, err = bufs[0].Segment(900, 101)
	require.ErrorIs(t, err, bufpool.ErrRange)
}

// TestPoolCloseWithBuffersOut: Close stops Get at once, but the memory stays
// registered until the last buffer is back (it may be posted to the device).
func TestPoolCloseWithBuffersOut(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	mrBefore := rxetest.CountResources(t)["mr"]
	pool, err := bufpool.New(p.client.PD(), bufpool.Size(64), bufpool.Count(2))
	require.NoError(t, err)
	b, _ := pool.TryGet()
	b2, _ := pool.TryGet()
	waiting := make(chan error)
	go func() {
		_, err := pool.Get(ctx) // blocks: the pool is empty
		waiting <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, pool.Close())
	require.ErrorIs(t, <-waiting, bufpool.ErrClosed, "Close wakes a waiting Get")
	require.NoError(t, pool.Close(), "Close is idempotent")
	_, ok := pool.TryGet()
	require.False(t, ok)
	require.Equal(t, mrBefore+1, rxetest.CountResources(t)["mr"], "still registered while buffers are out")
	require.NoError(t, pool.Put(b))
	require.Equal(t, mrBefore+1, rxetest.CountResources(t)["mr"], "one buffer is still out")
	require.NoError(t, pool.Put(b2))
	require.Equal(t, mrBefore, rxetest.CountResources(t)["mr"], "the last Put deregisters")
	require.ErrorIs(t, pool.Put(b2), bufpool.ErrDoublePut)
}

// TestRegionAccessIsExact: a region registered for remote read refuses a
// remote write with a remote access error on that endpoint, and after
// Close its rkey opens nothing.
func TestRegionAccessIsExact(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	region, remote := exchangeRegion(t, ctx, p, 4096, bufpool.RemoteRead)
	pool := newPool(t, p.client, 4096, 1)
	b, _ := pool.TryGet()
	require.NoError(t, p.client.PostRead("read-ok", b, 4096, remote))
	require.NoError(t, next(t, p.client).Err)
	require.NoError(t, p.client.PostWrite("write-denied", b, 16, remote, endpoint.NoInline))
	requireRefused(t, p.client, next(t, p.client), endpoint.StatusRemoteAccess)
	require.NoError(t, pool.Put(b))
	_ = region
}

// TestPoolOutlivesEndpoints: the library's PD is reference counted, so a
// pool and a region may be closed after the endpoints, in any order, and
// everything is still freed.
func TestPoolOutlivesEndpoints(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	pool, err := bufpool.New(p.client.PD(), bufpool.Size(64), bufpool.Count(4))
	require.NoError(t, err)
	region, err := bufpool.NewRegion(p.server.PD(), 4096, bufpool.RemoteWrite)
	require.NoError(t, err)
	mrs := rxetest.CountResources(t)["mr"]
	closeAndDrain(t, p.client) // no error: the PD is not freed under the pool
	closeAndDrain(t, p.server)
	require.Equal(t, mrs, rxetest.CountResources(t)["mr"], "the memory stays registered")
	require.NoError(t, region.Close())
	require.NoError(t, pool.Close())
}

// TestOpenPDBeforeConnecting: a protection domain opened for the device's
// address before any connection holds pools and regions that connections
// made later with cm.WithPD use; Close of it and of them, in any order,
// frees everything. A wildcard has no device; a closed PD is refused.
func TestOpenPDBeforeConnecting(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	pd, err := bufpool.OpenPD(ctx, rxetest.Addr(t))
	require.NoError(t, err)
	pool, err := bufpool.New(pd, bufpool.Size(64), bufpool.Count(4))
	require.NoError(t, err)
	region, err := bufpool.NewRegion(pd, 4096, bufpool.RemoteWrite)
	require.NoError(t, err)
	copy(region.Bytes(), "before")

	p := connect(t, ctx, cm.WithPD(pd))
	require.NoError(t, pd.Close(), "the connections keep it alive")
	require.NoError(t, pd.Close(), "idempotent")
	b, _ := pool.TryGet()
	copy(b.Bytes(), "written")
	// The server's region is in the same PD: the client writes into it.
	require.NoError(t, p.client.PostWrite("w", b, 7, region.Remote(), endpoint.NoInline))
	require.NoError(t, next(t, p.client).Err)
	require.Equal(t, "written", string(region.Bytes()[:7]))
	require.NoError(t, pool.Put(b))

	_, err = bufpool.New(pd, bufpool.Size(64), bufpool.Count(1))
	require.ErrorIs(t, err, bufpool.ErrClosed, "a closed PD makes no more pools")
	_, err = cm.Dial(ctx, p.listener.Addr().String(), cm.WithPD(pd))
	require.ErrorIs(t, err, endpoint.ErrInvalid, "nor connections")
	require.Error(t, p.client.PD().Close(), "an endpoint's PD is the endpoint's")
	require.NoError(t, pool.Close())
	require.NoError(t, region.Close())

	for _, host := range []string{"0.0.0.0", "127.0.0.1", "localhost"} {
		_, err = bufpool.OpenPD(ctx, host)
		require.ErrorContains(t, err, "the address of one RDMA device's interface is needed", host)
		t.Logf("%s: %v", host, err)
	}
	if name := os.Getenv("RDMACM_TEST_HOST"); name != "" {
		byName, err := bufpool.OpenPD(ctx, name)
		require.NoError(t, err, "a name of the device's addresses")
		require.NoError(t, byName.Close())
	}
}

// TestRegistrationPastTheLockLimitSaysHow: a registration refused for
// want of lockable memory says how to raise the limit, matches ENOMEM,
// and leaves the PD as it was. soft-iWARP counts registrations against
// RLIMIT_MEMLOCK even for root: with the limit lowered to 1 MiB, a pool
// and a region of 8 MiB are refused, and fit once it is raised again.
// rxe leaves root's registrations uncounted (CAP_IPC_LOCK): there both
// are registered under the same limit.
func TestRegistrationPastTheLockLimitSaysHow(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	pd, err := bufpool.OpenPD(ctx, rxetest.Addr(t))
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Close()) }()
	var limit unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &limit))
	lowered := limit
	lowered.Cur = 1 << 20
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lowered))
	restored := false
	restore := func() {
		if !restored {
			restored = true
			require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &limit))
		}
	}
	defer restore()

	const size = 8 << 20
	pool, poolErr := bufpool.New(pd, bufpool.Size(size), bufpool.Count(1))
	region, regionErr := bufpool.NewRegion(pd, size, bufpool.RemoteRead)
	if !rxetest.IWARP() {
		require.NoError(t, poolErr)
		require.NoError(t, regionErr)
		require.NoError(t, pool.Close())
		require.NoError(t, region.Close())
		return
	}
	for _, err := range []error{poolErr, regionErr} {
		require.ErrorIs(t, err, syscall.ENOMEM)
		require.ErrorContains(t, err, "raise the locked-memory limit: `ulimit -l unlimited`")
		t.Log(err)
	}
	restore()
	pool, err = bufpool.New(pd, bufpool.Size(size), bufpool.Count(1))
	require.NoError(t, err, "the PD registers again once the limit allows")
	require.NoError(t, pool.Close())
}
