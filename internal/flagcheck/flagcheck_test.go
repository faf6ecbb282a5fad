package flagcheck

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAtLeast(t *testing.T) {
	fs := flag.NewFlagSet("cmd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("count", 1, "")
	fs.Int("size", 64, "")
	fs.String("mode", "demo", "")
	fs.Func("func", "a Value that is no Getter", func(string) error { return nil })
	require.NoError(t, fs.Parse([]string{"-count", "0"}))

	require.NoError(t, AtLeast(fs, 0, "count", "size"))
	require.NoError(t, AtLeast(fs, 64, "size"))
	require.NoError(t, AtLeast(fs, 1), "no names, nothing to check")
	require.EqualError(t, AtLeast(fs, 1, "size", "count"), "-count 0: want at least 1")
	require.EqualError(t, AtLeast(fs, 65, "size", "count"), "-size 64: want at least 65", "the first below its least")
	require.EqualError(t, AtLeast(fs, 1, "mode"), "-mode is not an int flag")
	require.EqualError(t, AtLeast(fs, 1, "func"), "-func is not an int flag")
	require.EqualError(t, AtLeast(fs, 1, "depth"), "no flag -depth to check")
}
