package msg

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/endpoint"
)

// A handler's code survives the wire, and the caller matches it with
// errors.Is; an error without one is CodeUnknown, a passed deadline
// CodeDeadlineExceeded.
func TestErrorCodesCrossTheWire(t *testing.T) {
	const quota Code = CodeUser + 1
	for _, c := range []struct {
		err  error
		want Code
	}{
		{fmt.Errorf("no key %q: %w", "k", CodeNotFound), CodeNotFound},
		{errors.New("plain"), CodeUnknown},
		{fmt.Errorf("slow: %w", context.DeadlineExceeded), CodeDeadlineExceeded},
		{fmt.Errorf("over: %w", quota), quota},
	} {
		err := decodeError("m", encodeError(c.err))
		require.ErrorIs(t, err, c.want, "%v", c.err)
		var re *RemoteError
		require.ErrorAs(t, err, &re)
		require.Equal(t, c.err.Error(), re.Msg)
		require.Equal(t, "m", re.Method)
		if c.want != CodeNotFound {
			require.NotErrorIs(t, err, CodeNotFound)
		}
	}
	require.Equal(t, "code 1001", quota.String())
	require.ErrorIs(t, decodeError("m", []byte("x")), CodeUnknown, "a short payload")
}

func TestMuxRoutesByMethod(t *testing.T) {
	var m Mux
	require.NoError(t, m.Handle("echo", func(ctx context.Context, req []byte) ([]byte, error) { return req, nil }))
	require.ErrorIs(t, m.Handle("echo", func(ctx context.Context, req []byte) ([]byte, error) { return nil, nil }), endpoint.ErrInvalid, "twice")
	require.ErrorIs(t, m.Handle("", func(ctx context.Context, req []byte) ([]byte, error) { return nil, nil }), endpoint.ErrInvalid, "no name")
	require.ErrorIs(t, m.Handle("nil", nil), endpoint.ErrInvalid, "no function")
	resp, err := m.Serve(context.Background(), "echo", []byte("x"))
	require.NoError(t, err)
	require.Equal(t, "x", string(resp))
	_, err = m.Serve(context.Background(), "missing", nil)
	require.ErrorIs(t, err, CodeUnimplemented)
}
