package integration

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/seam"
)

// requireRemoteAccessError posts a write of b to remote on ep and checks
// the peer refuses it: a remote access error (on iWARP, the end of the
// connection; see requireRefused). The callers check the target is untouched.
func requireRemoteAccessError(t *testing.T, ep *endpoint.Endpoint, b *bufpool.Buffer, n int, remote bufpool.Remote) {
	t.Helper()
	require.NoError(t, ep.PostWrite("forbidden", b, n, remote, endpoint.NoInline))
	requireRefused(t, ep, next(t, ep), endpoint.StatusRemoteAccess)
}

// TestPoolsAreLocalOnly: a message pool is registered for local access
// only; a peer that learns a buffer's address and key still cannot write it.
func TestPoolsAreLocalOnly(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	spool := newPool(t, p.server, 64, 1)
	target, _ := spool.TryGet()
	copy(target.Bytes(), "untouched")
	// What a peer could learn of the buffer: its address and key (the
	// library does not publish them; the test reads them through the seam).
	seg, _, err := seam.BufferSGE(target, 0, 64)
	require.NoError(t, err)
	cpool := newPool(t, p.client, 64, 1)
	b, _ := cpool.TryGet()
	copy(b.Bytes(), "overwritten")
	requireRemoteAccessError(t, p.client, b, 11, bufpool.Remote{Addr: seg.Addr, RKey: seg.LKey, Len: 64})
	require.Equal(t, "untouched", string(target.Bytes()[:9]))
	require.NoError(t, spool.Put(target))
	require.NoError(t, cpool.Put(b))
}

// TestDeregisteredRegionIsClosed: once a region is closed its rkey opens
// nothing, even on the connection it was given to.
func TestDeregisteredRegionIsClosed(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	region, err := bufpool.NewRegion(p.server.PD(), 4096, bufpool.RemoteRead|bufpool.RemoteWrite)
	require.NoError(t, err)
	remote := region.Remote()
	pool := newPool(t, p.client, 4096, 1)
	b, _ := pool.TryGet()
	require.NoError(t, p.client.PostRead("before", b, 4096, remote))
	require.NoError(t, next(t, p.client).Err, "the region works while registered")
	require.NoError(t, region.Close())
	requireRemoteAccessError(t, p.client, b, 64, remote)
	require.NoError(t, pool.Put(b))
}

// TestEndpointReachesOnlyItsRegions: two connections to one server; a
// region given to the first is out of reach of the second, whose peer knows
// its address and key.
func TestEndpointReachesOnlyItsRegions(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	a := connect(t, ctx)
	b := connect(t, ctx)
	region, remote := exchangeRegion(t, ctx, a, 4096, bufpool.RemoteWrite|bufpool.RemoteRead)
	copy(region.Bytes(), "a's data")

	pool := newPool(t, b.client, 64, 1)
	buf, _ := pool.TryGet()
	copy(buf.Bytes(), "b was here")
	requireRemoteAccessError(t, b.client, buf, 10, remote)
	require.True(t, bytes.HasPrefix(region.Bytes(), []byte("a's data")))

	// The first connection still reaches it.
	apool := newPool(t, a.client, 64, 1)
	abuf, _ := apool.TryGet()
	require.NoError(t, a.client.PostRead("a-read", abuf, 8, remote))
	require.NoError(t, next(t, a.client).Err)
	require.Equal(t, "a's data", string(abuf.Bytes()[:8]))
	require.NoError(t, pool.Put(buf))
	require.NoError(t, apool.Put(abuf))
}
