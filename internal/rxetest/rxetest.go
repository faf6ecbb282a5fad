// Package rxetest finds the RDMA device tests run on and checks that tests
// leave no verbs resources behind.
//
// Under the testbed (bin/rxevm) the device is rxe0 and its address is in
// RDMACM_TEST_ADDR. On a host with its own device the address is found from
// sysfs. Without a device, tests skip with the reason, unless
// RDMACM_REQUIRE_DEVICE=1 (set by `make test`), where they fail.
package rxetest

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Addr returns the IP address of the RDMA device to test on.
func Addr(t testing.TB) string {
	t.Helper()
	if a := os.Getenv("RDMACM_TEST_ADDR"); a != "" {
		return a
	}
	if a, dev, ok := hostDeviceAddr(); ok {
		t.Logf("testing on host device %s at %s", dev, a)
		return a
	}
	const why = "no RDMA device: run `make test`, or `go test -exec $(pwd)/bin/rxevm` to run in a Soft-RoCE guest"
	if os.Getenv("RDMACM_REQUIRE_DEVICE") != "" {
		t.Fatal(why + " (RDMACM_REQUIRE_DEVICE is set, so this is a failure)")
	}
	t.Skip(why)
	return ""
}

// SkipExamplesWithoutDevice makes the test binary skip the examples that
// match pattern outside the testbed: call it from TestMain before m.Run.
// The examples listen on RDMACM_TEST_ADDR, which the testbed sets; with
// RDMACM_REQUIRE_DEVICE set (make test) they run, and fail without it.
func SkipExamplesWithoutDevice(pattern string) {
	if os.Getenv("RDMACM_TEST_ADDR") != "" || os.Getenv("RDMACM_REQUIRE_DEVICE") != "" {
		return
	}
	flag.Parse()
	if skip := flag.Lookup("test.skip"); skip != nil && skip.Value.String() == "" {
		fmt.Fprintln(os.Stderr, "no RDMA device: skipping the examples that need one (`make test` runs them in the testbed)")
		flag.Set("test.skip", pattern)
	}
}

// Peer is for tests across a wire, run with two testbed guests (rxevm
// -guests 2): it returns this guest's address, the other guest's, whether
// this one is the server (guest 0), and the netdev rxe0 is on.
func Peer(t testing.TB) (self, peer string, server bool, netdev string) {
	t.Helper()
	peer = os.Getenv("RDMACM_TEST_PEER_ADDR")
	if peer == "" {
		const why = "no peer: wire tests run in two guests joined by a link (`bin/rxevm -guests 2`, as `make test` does)"
		if os.Getenv("RDMACM_REQUIRE_DEVICE") != "" {
			t.Fatal(why + " (RDMACM_REQUIRE_DEVICE is set, so this is a failure)")
		}
		t.Skip(why)
	}
	return Addr(t), peer, os.Getenv("RXEVM_GUEST") == "0", os.Getenv("RDMACM_TEST_NETDEV")
}

// IWARP reports whether the device under test is iWARP (siw0 in the
// testbed): no atomics, no immediate data, no RNR retry. The testbed says so
// in RDMACM_TEST_TRANSPORT; on a host device, sysfs's node_type does
// ("4: RNIC").
func IWARP() bool {
	if tr := os.Getenv("RDMACM_TEST_TRANSPORT"); tr != "" {
		return tr == "iwarp"
	}
	nodeType, _ := os.ReadFile(filepath.Join("/sys/class/infiniband", Device(), "node_type"))
	return strings.HasPrefix(string(nodeType), "4:")
}

// ChecksRemoteReadRight reports whether the device refuses an RDMA READ of
// a region not registered for remote read. soft-iWARP does not check it
// (hardware iWARP NICs do).
func ChecksRemoteReadRight() bool { return Device() != "siw0" }

// Device is the RDMA device name tests run on, for logs.
func Device() string {
	if d := os.Getenv("RDMACM_TEST_DEVICE"); d != "" {
		return d
	}
	_, dev, _ := hostDeviceAddr()
	return dev
}

// hostDeviceAddr finds an IPv4 address of the netdev under the first RDMA
// device's port 1.
func hostDeviceAddr() (addr, dev string, ok bool) {
	ndevs, _ := filepath.Glob("/sys/class/infiniband/*/ports/1/gid_attrs/ndevs/*")
	for _, p := range ndevs {
		name, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		ifi, err := net.InterfaceByName(strings.TrimSpace(string(name)))
		if err != nil {
			continue
		}
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), strings.Split(p, "/")[4], true
			}
		}
	}
	return "", "", false
}

// Resources is the count of each verbs resource type on the device, as
// `rdma res show` prints it (pd, cq, qp, cm_id, mr, ctx, srq).
type Resources map[string]int

// CountResources reads `rdma res show` for the test device.
func CountResources(t testing.TB) Resources {
	t.Helper()
	out, err := exec.Command("rdma", "res", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("rdma res show: %v: %s", err, out)
	}
	dev := Device()
	for _, line := range strings.Split(string(bytes.TrimSpace(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.TrimSuffix(f[1], ":") != dev {
			continue
		}
		r := Resources{}
		for i := 2; i+1 < len(f); i += 2 {
			n, err := strconv.Atoi(f[i+1])
			if err == nil {
				r[f[i]] = n
			}
		}
		return r
	}
	t.Fatalf("rdma res show has no line for %s:\n%s", dev, out)
	return nil
}

// String lists the counts in a fixed order.
func (r Resources) String() string {
	var b strings.Builder
	for _, k := range []string{"pd", "cq", "qp", "cm_id", "mr", "ctx", "srq"} {
		fmt.Fprintf(&b, "%s %d ", k, r[k])
	}
	return strings.TrimSpace(b.String())
}

// OwnedBy says that the owner the kernel's resource tables (`rdma res
// show`) name, tid, is a thread of process pid. The kernel names a
// resource's owner by the thread that made it, which in a Go program need
// not be the first.
func OwnedBy(pid, tid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", pid, tid))
	return err == nil
}

// Registered is what the test device's table of memory regions (`rdma
// res show mr`) holds for process pid, every thread of it (OwnedBy): how
// many regions, and their bytes.
func Registered(t testing.TB, pid int) (regions int, bytes int64) {
	t.Helper()
	out, err := exec.Command("rdma", "-j", "res", "show", "mr").Output()
	if err != nil {
		t.Fatalf("rdma res show mr: %v", err)
	}
	var mrs []struct {
		Dev string `json:"ifname"`
		Len int64  `json:"mrlen"`
		PID int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &mrs); err != nil {
		t.Fatalf("rdma res show mr: %v: %s", err, out)
	}
	for _, mr := range mrs {
		if mr.Dev == Device() && OwnedBy(pid, mr.PID) {
			regions++
			bytes += mr.Len
		}
	}
	return regions, bytes
}

// CheckResources records the device's resource counts now and, when the
// test ends, fails it if they did not come back to them.
func CheckResources(t testing.TB) {
	t.Helper()
	guardSiwKeys(t, Addr(t)) // Addr skips, or fails, without a device
	before := CountResources(t)
	t.Cleanup(func() {
		after := CountResources(t)
		if sameCounts(before, after) {
			return
		}
		// What is left, and whether it goes soon after (freed late, by
		// something the test did not wait for) or stays (never freed):
		// the two are different bugs.
		regions := describeRegions()
		fate := fmt.Sprintf("still there %v later", leakRecheck)
		for start := time.Now(); time.Since(start) < leakRecheck; time.Sleep(50 * time.Millisecond) {
			if now := CountResources(t); sameCounts(before, now) {
				fate = fmt.Sprintf("freed %v later", time.Since(start).Round(time.Millisecond))
				break
			}
		}
		t.Errorf("verbs resources leaked: before %v, after %v (%s); the device's memory regions then:\n%s",
			before, after, fate, regions)
	})
}

// leakRecheck is how long a failed resource check watches the counts, to
// tell a late free from a leak.
const leakRecheck = 2 * time.Second

// sameCounts compares two counts, but for librdmacm's device contexts,
// which it opens on first use and keeps for the life of the process: not
// a per-test resource.
func sameCounts(before, after Resources) bool {
	for k, v := range before {
		if k != "ctx" && after[k] != v {
			return false
		}
	}
	return true
}

// describeRegions lists the test device's memory regions as `rdma res
// show mr` prints them (length, owner, protection domain), for a failed
// resource check's message.
func describeRegions() string {
	out, err := exec.Command("rdma", "res", "show", "mr", "dev", Device()).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("rdma res show mr: %v: %s", err, out)
	}
	return string(out)
}

// guardSiwKeys makes the process's soft-iWARP key guard (a CQ that lives as
// long as the process: verbs.Context.GuardSiwKeys) before the first count,
// so that the test that happens to create the process's first queue is not
// charged with it. It does nothing on other devices, and its work only
// once per process: every test tests on the same address.
func guardSiwKeys(t testing.TB, addr string) {
	t.Helper()
	guardOnce.Do(func() { guardErr = makeSiwGuard(addr) })
	if guardErr != nil {
		t.Fatal(guardErr)
	}
}

var (
	guardOnce sync.Once
	guardErr  error
)

func makeSiwGuard(addr string) error {
	ai, err := verbs.GetAddrInfo(addr, "0", true, verbs.PortSpaceTCP)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", addr, err)
	}
	defer ai.Free()
	id, err := verbs.CreateEP(ai)
	if err != nil {
		return fmt.Errorf("binding an id to %s: %w", addr, err)
	}
	defer id.DestroyEP()
	if err := id.Context().GuardSiwKeys(); err != nil {
		return fmt.Errorf("soft-iWARP's key guard: %w", err)
	}
	return nil
}
