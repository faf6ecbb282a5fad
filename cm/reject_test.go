package cm

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// A refusal says what it means: nobody listening, or what the peer said;
// on iWARP, the kernel's status by its errno's name.
func TestRejectErrorSaysWhy(t *testing.T) {
	padded := append([]byte("go away"), make([]byte, 141)...)
	for _, c := range []struct {
		err  RejectError
		want string
	}{
		{RejectError{Reason: 8, PrivateData: make([]byte, 148)}, "cm: connection refused: nobody listens on that port (IB CM reject reason 8, invalid service ID)"},
		{RejectError{Reason: 28, PrivateData: padded}, `cm: connection refused by the peer (IB CM reject reason 28, private data "go away")`},
		{RejectError{Reason: 28, PrivateData: make([]byte, 148)}, "cm: connection refused by the peer (IB CM reject reason 28)"},
		{RejectError{Reason: -104}, "cm: connection refused by the peer (iWARP status -104, connection reset by peer)"},
		{RejectError{Reason: -104, PrivateData: padded}, `cm: connection refused by the peer (iWARP status -104, connection reset by peer, private data "go away")`},
	} {
		require.Equal(t, c.want, c.err.Error())
		require.ErrorIs(t, &c.err, syscall.ECONNREFUSED)
	}
}

// A handshake the peer gave up after answering fails as a TCP connection
// the peer reset: on RoCE librdmacm reports it as CONNECT_ERROR, the
// kernel having refused the RTU (EINVAL); soft-iWARP as a reject with
// status -ECONNRESET, which is a refusal too. A plain reject is not a
// reset.
func TestGivenUpHandshakesAreResets(t *testing.T) {
	err := eventError(&verbs.Event{Type: verbs.EventConnectError, Status: -int(syscall.EINVAL)}, "connecting")
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.NotErrorIs(t, err, syscall.EINVAL, "an invalid argument is this side's mistake, not the peer's")
	require.ErrorContains(t, err, "the peer gave up the handshake")

	err = eventError(&verbs.Event{Type: verbs.EventConnectError, Status: -int(syscall.ETIMEDOUT)}, "connecting")
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	require.NotErrorIs(t, err, syscall.ECONNRESET)

	require.ErrorIs(t, &RejectError{Reason: -int(syscall.ECONNRESET)}, syscall.ECONNRESET)
	require.NotErrorIs(t, &RejectError{Reason: 28}, syscall.ECONNRESET)
	require.NotErrorIs(t, &RejectError{Reason: 8}, syscall.ECONNRESET)
}
