//go:build rdmacm_faultinject

package integration

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// TestInjectedPollFailureEndsTheEndpoint: when polling the CQ fails (no
// device fails it on purpose: the poll that finds the client's RDMA write
// is made to fail, make test-faults), the endpoint ends by itself, within a
// bound and without anyone calling Close: Done closes with that failure,
// which matches ErrClosed but not net.ErrClosed; the write's completion
// still comes back; the receive it had posted comes back flushed with the
// same cause; posts are refused with it; and the peer hears at once,
// because the endpoint disconnects (without that, the posted receive would
// hold the close for the close timeout). After Close, posts say
// net.ErrClosed and Err keeps the failure; nothing leaks.
func TestInjectedPollFailureEndsTheEndpoint(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	region, err := bufpool.NewRegion(p.server.PD(), 4096, bufpool.RemoteWrite)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, region.Close()) })
	pool := newPool(t, p.client, 4096, 2)
	rb, _ := pool.TryGet()
	require.NoError(t, p.client.PostRecv("recv", rb))
	wb, _ := pool.TryGet()

	injected := errors.New("injected CQ poll failure")
	verbs.FailNextPollFinding(verbs.WCRDMAWrite, injected)
	require.NoError(t, p.client.PostWrite("write", wb, 64, region.Remote()))
	select {
	case <-p.client.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the endpoint did not end after its CQ poll failed")
	}
	err = p.client.Err()
	require.ErrorIs(t, err, injected)
	require.ErrorIs(t, err, endpoint.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	select {
	case <-p.server.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the peer did not hear of the end: the failed endpoint did not disconnect")
	}
	require.ErrorIs(t, p.server.Err(), cm.ErrPeerDisconnected)

	got := map[any]endpoint.Completion{}
	for range 2 {
		c := next(t, p.client)
		got[c.Context] = c
	}
	require.NoError(t, got["write"].Err, "the write finished before the failure")
	require.ErrorIs(t, got["recv"].Err, injected, "the receive, flushed by the failure's close")
	require.NotErrorIs(t, got["recv"].Err, net.ErrClosed)
	require.NoError(t, pool.Put(rb))

	err = p.client.PostWrite("after", wb, 64, region.Remote())
	require.ErrorIs(t, err, injected, "a post before Close says why the endpoint ended")

	require.NoError(t, p.client.Close())
	err = p.client.PostWrite("closed", wb, 64, region.Remote())
	require.ErrorIs(t, err, net.ErrClosed, "after Close, as net's conns do")
	require.ErrorIs(t, p.client.Err(), injected, "Err keeps why it ended")
	require.NoError(t, pool.Put(wb))
}
