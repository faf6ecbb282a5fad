package msg

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
)

// Connection options msg owns, or invalid ones, are refused before anything
// is created (no device needed), rather than silently overridden.
func TestCMOptionsMsgOwnsAreRefused(t *testing.T) {
	for name, opt := range map[string]cm.Option{
		"queue depth":   cm.WithQueueDepth(8),
		"send depth":    cm.WithSendDepth(8),
		"receive depth": cm.WithRecvDepth(8),
		"RNR retry":     cm.WithRNRRetry(7),
		"a bad value":   cm.WithCloseTimeout(-time.Second),
	} {
		_, err := Dial(context.Background(), "127.0.0.1:1", WithCMOptions(opt))
		require.ErrorContains(t, err, "WithCMOptions", name)
		_, err = Listen(context.Background(), "127.0.0.1:0", WithCMOptions(opt))
		require.ErrorContains(t, err, "WithCMOptions", name)
	}
	_, err := newOptions([]Option{WithCMOptions(cm.WithPolling(endpoint.PollHybrid, time.Millisecond), cm.WithAckTimeout(time.Second))})
	require.NoError(t, err, "options msg does not own pass")
}
