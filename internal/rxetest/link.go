package rxetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Netdev is the device's network interface, for tests that take its link
// down and up; they skip outside the testbed's guest, whose interface
// nothing else uses (RDMACM_TEST_NETDEV).
func Netdev(t testing.TB) string {
	t.Helper()
	Addr(t) // skips, or fails, without a device
	netdev := os.Getenv("RDMACM_TEST_NETDEV")
	if netdev == "" {
		t.Skip("takes the device's netdev down and up: runs only in the testbed's guest (make test)")
	}
	return netdev
}

// KeepAddressesOnDown keeps netdev's IPv6 address through a down and up,
// as its IPv4 address is kept (the kernel drops IPv6 addresses on down by
// default), until the test ends: later tests dial it.
func KeepAddressesOnDown(t testing.TB, netdev string) {
	path := filepath.Join("/proc/sys/net/ipv6/conf", netdev, "keep_addr_on_down")
	was, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, []byte("1\n"), 0o644))
	t.Cleanup(func() { require.NoError(t, os.WriteFile(path, was, 0o644)) })
}

// SetLink sets netdev "down" or "up" (ip link); a netdev left down would
// fail every later test, so it is put up again at cleanup whatever
// happened.
func SetLink(t testing.TB, netdev, state string) {
	t.Helper()
	runIP(t, "link", "set", netdev, state)
	if state == "down" {
		t.Cleanup(func() { exec.Command("ip", "link", "set", netdev, "up").Run() })
	}
}

// SetMAC gives netdev the MAC address mac (ip link), and returns putBack,
// which gives it its own back. putBack runs when the test ends, if the
// test has not run it.
func SetMAC(t testing.TB, netdev, mac string) (putBack func()) {
	t.Helper()
	was, err := os.ReadFile(filepath.Join("/sys/class/net", netdev, "address"))
	require.NoError(t, err)
	runIP(t, "link", "set", "dev", netdev, "address", mac)
	return onceAtCleanup(t, func() {
		runIP(t, "link", "set", "dev", netdev, "address", strings.TrimSpace(string(was)))
	})
}

// AddAddress adds prefixed, an address with its prefix length, to netdev
// (addAddress), and deletes it when the test ends.
func AddAddress(t testing.TB, netdev, prefixed string) {
	t.Helper()
	runIP(t, addAddress(netdev, prefixed)...)
	t.Cleanup(func() { runIP(t, "addr", "del", prefixed, "dev", netdev) })
}

// RemoveAddress deletes ip, an address of netdev, from it, and returns
// putBack, which adds it back with the prefix it had (addAddress).
// putBack runs when the test ends, if the test has not run it.
func RemoveAddress(t testing.TB, netdev, ip string) (putBack func()) {
	t.Helper()
	out := runIP(t, "-o", "addr", "show", "dev", netdev)
	var prefixed string
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, ip+"/") {
			prefixed = f
		}
	}
	require.NotEmpty(t, prefixed, "%s is no address of %s: %s", ip, netdev, out)
	runIP(t, "addr", "del", prefixed, "dev", netdev)
	return onceAtCleanup(t, func() { runIP(t, addAddress(netdev, prefixed)...) })
}

// addAddress is ip's arguments that add prefixed, an address with its
// prefix length, to netdev: an IPv6 one without duplicate address
// detection, as the testbed adds its own, so that it is usable at once.
func addAddress(netdev, prefixed string) []string {
	args := []string{"addr", "add", prefixed, "dev", netdev}
	if strings.Contains(prefixed, ":") {
		args = append(args, "nodad")
	}
	return args
}

// runIP runs ip with args and returns its output; the test fails, with
// the output, if ip does.
func runIP(t testing.TB, args ...string) []byte {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	return out
}

// onceAtCleanup returns undo made to run once at most, and runs it when
// the test ends if the test has not.
func onceAtCleanup(t testing.TB, undo func()) func() {
	var once sync.Once
	f := func() { once.Do(undo) }
	t.Cleanup(f)
	return f
}
