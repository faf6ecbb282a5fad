package cm

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
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
