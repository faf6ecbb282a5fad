package seam

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEnded: why a connection ended matches its package's ErrClosed, and
// keeps what it held and its text; an error that matched already is kept
// as it is.
func TestEnded(t *testing.T) {
	closed := errors.New("closed")
	require.NoError(t, Ended(nil, closed))

	already := fmt.Errorf("the peer left: %w", closed)
	require.Same(t, already, Ended(already, closed))

	type deviceError struct{ error }
	cause := fmt.Errorf("send: %w", deviceError{errors.New("remote access error")})
	err := Ended(cause, closed)
	require.ErrorIs(t, err, closed)
	require.ErrorIs(t, err, cause)
	var de deviceError
	require.ErrorAs(t, err, &de, "what the cause held is still found")
	require.Equal(t, cause.Error(), err.Error(), "the text is the cause's")
}
