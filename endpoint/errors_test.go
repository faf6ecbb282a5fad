package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// TestCompletionErrorsCarryTheClose: work that fails while the endpoint
// closes reports that close (closedHere): Close's local error, which
// matches net.ErrClosed, or the cause a sibling package closed it with
// (seam.CloseEndpoint), which does not. A flush before any close matches
// ErrClosed alone and, since nothing explains it, is due to end the
// connection; a failure before any close is no close's.
func TestCompletionErrorsCarryTheClose(t *testing.T) {
	ep := &Endpoint{}
	flushed := verbs.WC{Status: verbs.WCStatus(StatusFlushed)}
	failed := verbs.WC{Status: verbs.WCStatus(StatusLocalQPOp)}

	ep.mu.Lock()
	err := ep.completionError(OpRecv, flushed)
	require.NotNil(t, ep.failing, "a flush nothing explains ends the connection after its grace")
	require.True(t, ep.failing.Stop())
	require.Nil(t, ep.failure, "posts are still taken meanwhile")
	ep.failing = nil
	ep.mu.Unlock()
	require.ErrorIs(t, err, ErrClosed, "a flush: the connection is over")
	require.NotErrorIs(t, err, net.ErrClosed, "no close of this side's began")

	ep.mu.Lock()
	ep.closing = true
	err = ep.completionError(OpSend, failed)
	require.Nil(t, ep.failing, "a failure during a close does not end the connection on its own")
	ep.mu.Unlock()
	require.ErrorIs(t, err, net.ErrClosed, "during Close: the local close error")
	require.ErrorIs(t, err, ErrClosed)

	cause := fmt.Errorf("msg: the peer closed the connection: %w", ErrClosed)
	ep.closedBy.Store(&cause)
	ep.mu.Lock()
	err = ep.completionError(OpRecv, flushed)
	ep.mu.Unlock()
	require.ErrorIs(t, err, cause, "during a close with a cause: that cause")
	require.ErrorIs(t, err, ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "a close with a cause is not the application's Close")
	require.Equal(t, cause, ep.closedHere())

	var ce *CompletionError
	require.True(t, errors.As(err, &ce))
	require.Equal(t, StatusFlushed, ce.Status, "the device's status is kept")
}

// TestCallsAfterCloseAreNetErrClosed: once the application called Close,
// a post and a Next fail with the local close error even when the endpoint
// had ended by itself first (its CQ poll failed: failHere's cause), as
// net's conns answer every call after Close; before Close they report
// that cause, and Err keeps it after.
func TestCallsAfterCloseAreNetErrClosed(t *testing.T) {
	ep := &Endpoint{done: make(chan struct{})}
	cause := fmt.Errorf("%w: polling the CQ failed: %w", ErrClosed, errors.New("injected"))
	ep.closedBy.Store(&cause)
	ep.closing = true
	ep.setDone(ep.closedHere())

	refusals := func() []error {
		ep.mu.Lock()
		post := ep.postLocked([]Request{{Op: OpSend}})
		ep.mu.Unlock()
		_, next := ep.delivered(Completion{}, false)
		return []error{post, next}
	}
	for _, err := range refusals() {
		require.ErrorIs(t, err, cause, "before Close: why the endpoint ended")
		require.NotErrorIs(t, err, net.ErrClosed, "the application has not closed it")
	}

	ep.calledClose.Store(true) // what Close does first
	for _, err := range refusals() {
		require.ErrorIs(t, err, net.ErrClosed, "after Close")
		require.ErrorIs(t, err, ErrClosed)
	}
	require.ErrorIs(t, ep.Err(), cause, "Err keeps why it ended")
	require.NotErrorIs(t, ep.Err(), net.ErrClosed)
}

// TestEndpointNotMadeIsRefused: a nil or zero Endpoint is one that ended
// before it began. Its calls fail with ErrInvalid, Done and Completions
// are closed, and its accessors give zero values: nothing panics or waits
// for ever. A nil or zero SRQ's calls fail the same way.
func TestEndpointNotMadeIsRefused(t *testing.T) {
	b := &bufpool.Buffer{}
	for name, ep := range map[string]*Endpoint{"nil": nil, "zero": {}} {
		_, err := ep.Next(context.Background())
		require.ErrorIs(t, err, ErrInvalid, name)
		for op, err := range map[string]error{
			"PostSend":           ep.PostSend(nil, b, 0),
			"PostSendImm":        ep.PostSendImm(nil, b, 0, 1),
			"PostSendv":          ep.PostSendv(nil, nil),
			"PostRecv":           ep.PostRecv(nil, b),
			"PostRecvv":          ep.PostRecvv(nil, nil),
			"PostWrite":          ep.PostWrite(nil, b, 0, bufpool.Remote{}),
			"PostWriteImm":       ep.PostWriteImm(nil, b, 0, bufpool.Remote{}, 1),
			"PostWritev":         ep.PostWritev(nil, nil, bufpool.Remote{}),
			"PostRead":           ep.PostRead(nil, b, 0, bufpool.Remote{}),
			"PostReadv":          ep.PostReadv(nil, nil, bufpool.Remote{}),
			"PostCompareAndSwap": ep.PostCompareAndSwap(nil, b, bufpool.Remote{}, 0, 0),
			"PostFetchAndAdd":    ep.PostFetchAndAdd(nil, b, bufpool.Remote{}, 0),
			"PostBatch":          ep.PostBatch(nil),
			"Err":                ep.Err(),
			"Close":              ep.Close(),
			"CloseAndDrain":      ep.CloseAndDrain(nil),
		} {
			require.ErrorIs(t, err, ErrInvalid, name+" "+op)
		}
		require.ErrorIs(t, ep.Err(), ErrClosed, name+": it ended before it began")
		require.Nil(t, ep.PD(), name)
		require.Nil(t, ep.LocalAddr(), name)
		require.Nil(t, ep.RemoteAddr(), name)
		require.Nil(t, ep.PrivateData(), name)
		require.Zero(t, ep.MaxInline(), name)
		require.Zero(t, ep.Stats(), name)
		_, open := <-ep.Done()
		require.False(t, open, name+": Done is closed")
		_, open = <-ep.Completions()
		require.False(t, open, name+": Completions is closed")
	}
	for name, s := range map[string]*SRQ{"nil": nil, "zero": {}} {
		_, err := s.Destroy()
		require.ErrorIs(t, err, ErrInvalid, name)
		require.ErrorIs(t, s.PostRecv(nil, b), ErrInvalid, name)
		require.Nil(t, s.PD(), name)
		require.Zero(t, s.Pending(), name)
	}
}

// TestFailuresWhileThePortIsDownSaySo: a work request that failed while
// the port was not active matches ErrPortDown and names the device, the
// port and, unless it is plainly down, its state; it keeps its status,
// and is no close.
func TestFailuresWhileThePortIsDownSaySo(t *testing.T) {
	down := &portDownError{dev: "rxe0", port: 1, state: verbs.PortDown}
	failed := error(&CompletionError{Op: OpSend, Status: StatusLocalQPOp, local: down})
	require.ErrorIs(t, failed, ErrPortDown)
	require.NotErrorIs(t, failed, ErrClosed)
	require.EqualError(t, failed, "endpoint: send failed: local QP operation error (status 2, vendor error 0x0), while rxe0 port 1 is down")
	var ce *CompletionError
	require.ErrorAs(t, failed, &ce)
	require.Equal(t, StatusLocalQPOp, ce.Status)

	initializing := &portDownError{dev: "siw0", port: 1, state: verbs.PortState(2)} // IBV_PORT_INIT
	require.ErrorIs(t, initializing, ErrPortDown)
	require.EqualError(t, initializing, "siw0 port 1 is not active (init)")
}

// TestFailuresWithTheAddressGoneSaySo: a connection bound to an address
// no interface has (from the ranges kept for documentation, which no host
// is given) has a local fault that matches ErrAddressGone and names the
// address; one bound to an address this host has (loopback's), to a
// wildcard, or to nothing known has none. A work request that failed so
// keeps its status.
func TestFailuresWithTheAddressGoneSaySo(t *testing.T) {
	gone := addressGone(&net.TCPAddr{IP: net.ParseIP("192.0.2.77"), Port: 7471})
	require.ErrorIs(t, gone, ErrAddressGone)
	require.NotErrorIs(t, gone, ErrPortDown)
	require.EqualError(t, gone, "192.0.2.77 is no longer an address of this host")
	require.EqualError(t, addressGone(&net.TCPAddr{IP: net.ParseIP("2001:db8::77")}),
		"2001:db8::77 is no longer an address of this host")
	for _, here := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)},
		&net.TCPAddr{IP: net.IPv6unspecified},
		&net.TCPAddr{IP: net.IPv4zero},
		&net.TCPAddr{},
		&net.UDPAddr{IP: net.ParseIP("192.0.2.77")},
		nil,
	} {
		require.NoError(t, addressGone(here), "%v", here)
	}

	failed := error(&CompletionError{Op: OpWrite, Status: StatusLocalQPOp, local: gone})
	require.ErrorIs(t, failed, ErrAddressGone)
	require.NotErrorIs(t, failed, ErrClosed)
	require.EqualError(t, failed, "endpoint: RDMA write failed: local QP operation error (status 2, vendor error 0x0), while 192.0.2.77 is no longer an address of this host")
}
