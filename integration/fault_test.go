//go:build rdmacm_faultinject

package integration

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/verbs"
	"github.com/go-rdma/rdmacm/msg"
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

// TestInjectedPollFailureEndsAMsgConn: a msg connection whose endpoint's
// CQ poll fails (the poll that finds the next message received) ends with
// that failure: its reader gets the message that had arrived, then the
// failure, not io.EOF and not net.ErrClosed, and so does Err; the peer,
// which did nothing wrong, ends with cm.ErrPeerDisconnected. Nothing hangs
// or leaks.
func TestInjectedPollFailureEndsAMsgConn(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx, msg.WithKeepalive(0, 0))
	// Each side speaks once first, so that nothing else is on its way.
	require.NoError(t, client.Send(ctx, []byte("hello")))
	_, err := server.Recv(ctx)
	require.NoError(t, err)
	require.NoError(t, server.Send(ctx, []byte("hello")))
	_, err = client.Recv(ctx)
	require.NoError(t, err)

	injected := errors.New("injected CQ poll failure")
	verbs.FailNextPollFinding(verbs.WCRecv, injected)
	require.NoError(t, client.Send(ctx, []byte("last")))
	// The message the failed poll found had arrived whole, and the poll
	// after it finds it again: it is read before the end, not lost.
	got, err := server.Recv(ctx)
	require.NoError(t, err, "the message that arrived before the failure")
	require.Equal(t, "last", string(got))
	_, err = server.Recv(ctx)
	require.ErrorIs(t, err, injected, "the reader learns why")
	require.ErrorIs(t, err, msg.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "the application did not close it")
	require.NotErrorIs(t, err, io.EOF, "no orderly end")
	require.ErrorIs(t, server.Err(), injected)

	_, err = client.Recv(ctx)
	require.ErrorIs(t, err, cm.ErrPeerDisconnected, "the peer did nothing wrong")
	require.NotErrorIs(t, err, injected)

	require.NoError(t, server.Close())
	require.ErrorIs(t, server.Send(ctx, []byte("late")), net.ErrClosed, "after Close, as net's conns do")
	require.ErrorIs(t, server.Err(), injected, "Err keeps why it ended")
}
