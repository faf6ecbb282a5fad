package endpoint

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// TestCompletionErrorsCarryTheClose: work that fails while the endpoint
// closes reports that close (closedHere): Close's local error, which
// matches net.ErrClosed, or the cause a sibling package closed it with
// (seam.CloseEndpoint), which does not. A flush before any close matches
// ErrClosed alone, and a failure before any close is no close's.
func TestCompletionErrorsCarryTheClose(t *testing.T) {
	ep := &Endpoint{}
	flushed := verbs.WC{Status: verbs.WCStatus(StatusFlushed)}
	failed := verbs.WC{Status: verbs.WCStatus(StatusLocalQPOp)}

	ep.mu.Lock()
	err := ep.completionError(OpRecv, flushed)
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
