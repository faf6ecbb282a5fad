package testbed

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// parseNewc reads back a newc archive: name -> (mode, data).
func parseNewc(t *testing.T, b []byte) map[string][2]string {
	t.Helper()
	out := map[string][2]string{}
	field := func(h []byte, i int) int {
		v, err := strconv.ParseUint(string(h[6+8*i:6+8*i+8]), 16, 32)
		require.NoError(t, err)
		return int(v)
	}
	pad := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		require.Equal(t, "070701", string(b[off:off+6]), "magic at %d", off)
		h := b[off : off+110]
		mode, size, namesize := field(h, 1), field(h, 6), field(h, 11)
		name := string(b[off+110 : off+110+namesize-1])
		require.Zero(t, b[off+110+namesize-1], "name is NUL-terminated")
		dataOff := pad(off + 110 + namesize)
		if name == "TRAILER!!!" {
			require.Zero(t, len(b)%4)
			return out
		}
		out[name] = [2]string{strconv.FormatInt(int64(mode), 8), string(b[dataOff : dataOff+size])}
		off = pad(dataOff + size)
	}
}

func TestCpioNewc(t *testing.T) {
	var buf bytes.Buffer
	c := &cpioWriter{w: &buf}
	c.Dir("bin")
	c.File("bin/x", 0o755, []byte("hello"))
	c.Symlink("bin/sh", "busybox")
	c.CharDev("dev/console", 5, 1)
	c.File("odd-name-length", 0o644, []byte("abc"))
	require.NoError(t, c.Close())
	got := parseNewc(t, buf.Bytes())
	require.Equal(t, [2]string{"40755", ""}, got["bin"])
	require.Equal(t, [2]string{"100755", "hello"}, got["bin/x"])
	require.Equal(t, [2]string{"120777", "busybox"}, got["bin/sh"])
	require.Equal(t, "20600", got["dev/console"][0])
	require.Equal(t, "abc", got["odd-name-length"][1])
}

func TestPrefixWriter(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{w: &out, prefix: "[g1] "}
	for _, chunk := range []string{"a\nb", "c\n", "\nd"} {
		n, err := p.Write([]byte(chunk))
		require.NoError(t, err)
		require.Equal(t, len(chunk), n)
	}
	require.Equal(t, "[g1] a\n[g1] bc\n[g1] \n[g1] d", out.String())
}

func TestShQuote(t *testing.T) {
	require.Equal(t, `'it'\''s a /path'`, shQuote("it's a /path"))
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 8}
	tb.Write([]byte("0123456789"))
	tb.Write([]byte("ab\r\n"))
	require.Equal(t, "6789ab\n", tb.String())
	require.True(t, strings.HasSuffix(tb.String(), "\n"))
}

func TestKernelSeries(t *testing.T) {
	got, err := kernelSeries("6.1.0-56-amd64")
	require.NoError(t, err)
	require.Equal(t, "6.1", got, "names Debian's linux-source-6.1")
	for _, bad := range []string{"", "6", "6.1", ".1.0"} {
		_, err := kernelSeries(bad)
		require.Error(t, err, "%q", bad)
	}
}

// TestRunRefusesUnknownDevice: a device other than rxe or siw is refused
// before anything starts.
func TestRunRefusesUnknownDevice(t *testing.T) {
	_, err := Run(t.Context(), []string{"true"}, Options{Device: "mlx5"})
	require.ErrorContains(t, err, `device "mlx5"`)
}

// TestWaitForJobsFindsAHungBoot: a guest whose agent writes its started
// file in time, or whose qemu exited, is not hung; one that does neither
// within the timeout is, and is the one returned.
func TestWaitForJobsFindsAHungBoot(t *testing.T) {
	dir := t.TempDir()
	newGuest := func(i int) *guest {
		return &guest{index: i, exited: make(chan struct{}), started: filepath.Join(dir, fmt.Sprintf("started-%d", i))}
	}
	booting, exited := newGuest(0), newGuest(1)
	close(exited.exited)
	go func() {
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(booting.started, nil, 0o644)
	}()
	require.Nil(t, waitForJobs(context.Background(), []*guest{booting, exited}, 10*time.Second))

	hung := newGuest(2)
	require.Same(t, hung, waitForJobs(context.Background(), []*guest{booting, hung}, 300*time.Millisecond))
}

// TestAcceptUntilGivesUpWhenQemuExits: the accept of a guest's output
// socket returns qemu's connection, and gives up once qemu has exited
// without connecting or ctx ended. Before, it waited for ctx alone, and
// rxevm hung for good on a qemu that refused its arguments (-m -5).
func TestAcceptUntilGivesUpWhenQemuExits(t *testing.T) {
	listen := func() net.Listener {
		l, err := net.Listen("unix", filepath.Join(t.TempDir(), "tty.sock"))
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		return l
	}
	l := listen()
	go func() {
		if c, err := net.Dial("unix", l.Addr().String()); err == nil {
			defer c.Close()
		}
	}()
	conn, err := acceptUntil(t.Context(), make(chan struct{}), l)
	require.NoError(t, err, "qemu connected")
	conn.Close()

	exited := make(chan struct{})
	time.AfterFunc(50*time.Millisecond, func() { close(exited) })
	_, err = acceptUntil(t.Context(), exited, listen())
	require.ErrorIs(t, err, net.ErrClosed, "qemu exited without connecting")

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = acceptUntil(ctx, make(chan struct{}), listen())
	require.ErrorIs(t, err, net.ErrClosed, "ctx ended")
}

// TestKernelPackageNamesOnlyDebianKernels: an ABI name or a package name
// gives the package; anything else is refused before it reaches apt-get.
func TestKernelPackageNamesOnlyDebianKernels(t *testing.T) {
	for in, want := range map[string]string{
		"":                           "",
		"6.1.0-56-amd64":             "linux-image-6.1.0-56-amd64",
		"linux-image-6.1.0-56-amd64": "linux-image-6.1.0-56-amd64",
		"6.12.9+bpo-amd64":           "linux-image-6.12.9+bpo-amd64",
	} {
		got, err := KernelPackage(in)
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
	for _, bad := range []string{"linux-image-", "amd64", "6.1.0", "6.1.0-56-AMD64", "6.1.0-56-amd64 -y", "../6.1.0-56-amd64", "-6.1.0-56-amd64"} {
		_, err := KernelPackage(bad)
		require.ErrorContains(t, err, "is not a Debian kernel", "%q", bad)
	}
}

// TestEnsureKernelBootsOnlyThePinnedKernel: with a kernel asked for, the
// cached copy of that kernel is used, not the newest cached one (which is
// what an unpinned run falls back to when apt cannot answer), and one not
// cached is fetched or fails, never replaced by another.
func TestEnsureKernelBootsOnlyThePinnedKernel(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("RXEVM_CACHE", cache)
	t.Setenv("PATH", t.TempDir()) // no apt-cache, no apt-get: nothing is fetched
	for _, v := range []string{"6.1.0-56-amd64", "6.1.0-57-amd64"} {
		root := filepath.Join(cache, "kernel", v)
		require.NoError(t, os.MkdirAll(root, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, ".complete"), nil, 0o644))
	}
	logf := func(string, ...any) {}

	k, err := EnsureKernel("", logf)
	require.NoError(t, err)
	require.Equal(t, "6.1.0-57-amd64", k.Version, "unpinned and offline: the newest cached kernel")

	k, err = EnsureKernel("linux-image-6.1.0-56-amd64", logf)
	require.NoError(t, err)
	require.Equal(t, Kernel{Version: "6.1.0-56-amd64", Root: filepath.Join(cache, "kernel", "6.1.0-56-amd64")}, k)

	_, err = EnsureKernel("6.1.0-55-amd64", logf)
	require.ErrorContains(t, err, "apt-get not found")

	_, err = EnsureKernel("6.1.0-55-amd64;true", logf)
	require.ErrorContains(t, err, "is not a Debian kernel")
}

// TestNewestCachedKernelOrdersByNumber: offline, the newest cached kernel
// is the one with the highest numbers, not the last in string order
// (which put 6.1.0-9 after 6.1.0-10, and 6.1.0-99 after 6.1.0-100).
func TestNewestCachedKernelOrdersByNumber(t *testing.T) {
	for _, c := range []struct {
		cached []string
		newest string
	}{
		{[]string{"6.1.0-9-amd64", "6.1.0-10-amd64"}, "6.1.0-10-amd64"},
		{[]string{"6.1.0-100-amd64", "6.1.0-99-amd64", "6.1.0-57-amd64"}, "6.1.0-100-amd64"},
		{[]string{"6.1.0-57-amd64", "6.12.9+bpo-amd64", "6.9.7-amd64"}, "6.12.9+bpo-amd64"},
		{[]string{"6.1.0-57-amd64"}, "6.1.0-57-amd64"},
	} {
		kdir := t.TempDir()
		for _, v := range c.cached {
			require.NoError(t, os.MkdirAll(filepath.Join(kdir, v), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(kdir, v, ".complete"), nil, 0o644))
		}
		require.NoError(t, os.MkdirAll(filepath.Join(kdir, "6.1.0-999-amd64"), 0o755)) // no .complete: half extracted
		k, ok := newestCachedKernel(kdir)
		require.True(t, ok)
		require.Equal(t, c.newest, k.Version, "%v", c.cached)
	}
	_, ok := newestCachedKernel(t.TempDir())
	require.False(t, ok)
}

// TestCompareVersions: numbers compare by value, the rest as text, and a
// name that extends another follows it.
func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"6.1.0-9-amd64", "6.1.0-10-amd64", -1},
		{"6.1.0-010-amd64", "6.1.0-10-amd64", 0},
		{"6.1.0-57-amd64", "6.1.0-57-amd64", 0},
		{"6.1.0-57-amd64", "6.1.0-57-cloud-amd64", -1},
		{"6.1", "6.1.0", -1},
		{"6.12.9+bpo-amd64", "6.1.0-57-amd64", 1},
		{"6.1.0-57-amd64", "6.1.0-57a-amd64", -1},
	} {
		require.Equal(t, c.want, compareVersions(c.a, c.b), "%s vs %s", c.a, c.b)
		require.Equal(t, -c.want, compareVersions(c.b, c.a), "%s vs %s", c.b, c.a)
	}
}
