package msg

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRequestHeadRoundTrip: a request's method, of 1 to 255 bytes, and
// the caller's bytes come back from decodeRequest as requestHead wrote
// them; payloads without a whole method are ErrMalformed, never a panic.
func TestRequestHeadRoundTrip(t *testing.T) {
	for _, method := range []string{"m", "echo", strings.Repeat("x", 254), strings.Repeat("y", 255)} {
		var buf [256]byte
		head, err := requestHead(&buf, method)
		require.NoError(t, err)
		for _, body := range [][]byte{nil, []byte("req")} {
			gotMethod, gotBody, err := decodeRequest(append(append([]byte(nil), head...), body...))
			require.NoError(t, err, "%d-byte method", len(method))
			require.Equal(t, method, string(gotMethod))
			require.Equal(t, string(body), string(gotBody))
		}
	}
	for _, method := range []string{"", strings.Repeat("z", 256)} {
		var buf [256]byte
		_, err := requestHead(&buf, method)
		require.Error(t, err, "a %d-byte method", len(method))
	}
	for _, p := range [][]byte{nil, {0}, {0, 'a'}, {4, 'e', 'c', 'h'}, {255}, append([]byte{255}, make([]byte, 254)...)} {
		_, _, err := decodeRequest(p)
		require.ErrorIs(t, err, ErrMalformed, "%v", p)
	}
}

// TestMethodNamesAllocateOncePerName: a method name seen before comes back
// as the same string with no allocation; past maxMethodNames, new names
// are still right, only not kept.
func TestMethodNamesAllocateOncePerName(t *testing.T) {
	var names methodNames
	echo := names.name([]byte("echo"))
	require.Equal(t, "echo", echo)
	allocs := testing.AllocsPerRun(100, func() {
		if names.name([]byte("echo")) != "echo" {
			t.Fatal("a kept name came back changed")
		}
	})
	require.Zero(t, allocs, "a kept name allocates")
	for i := range 2 * maxMethodNames {
		name := fmt.Sprintf("m%d", i)
		require.Equal(t, name, names.name([]byte(name)))
	}
	require.Len(t, *names.known.Load(), maxMethodNames, "names kept")
	require.Equal(t, "echo", names.name([]byte("echo")))
}
