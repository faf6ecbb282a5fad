package testbed

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Devices the testbed can create in a guest, by the name rxevm's -device
// takes: Soft-RoCE and soft-iWARP, each on the guest's netdev.
const (
	DeviceRXE = "rxe" // rdma_rxe: RoCE v2, the kernel's own module
	DeviceSIW = "siw" // siw: iWARP, built out of tree (Debian's kernel lacks it)
)

// deviceTransport is what EnvTransport says of each device.
var deviceTransport = map[string]string{DeviceRXE: "roce", DeviceSIW: "iwarp"}

// siwModules are loaded, in this order, before siw.ko: its dependencies
// (ib_core comes with rxe's). libcrc32c needs a crc32c provider, and the
// guest has no modprobe to load one on demand.
var siwModules = []string{"crc32c_generic", "libcrc32c"}

// siwKo is where the siw module built for k is cached: beside the kernel,
// so a new kernel gets its own build and a cached one works offline.
func siwKo(k Kernel) string { return filepath.Join(k.Root, "extra", "siw.ko") }

// EnsureSiw returns siw.ko for kernel k, building it the first time from
// Debian's sources of the same version: linux-headers-<version> installed
// (as root, through apt-get), then only drivers/infiniband/sw/siw of
// linux-source-<major.minor>, built out of tree. The result is cached
// beside the kernel, moved into place only when complete.
func EnsureSiw(k Kernel, logf func(string, ...any)) (string, error) {
	ko := siwKo(k)
	if _, err := os.Stat(ko); err == nil {
		return ko, nil
	}
	logf("testbed: building siw.ko for %s (once; cached in %s)", k.Version, filepath.Dir(ko))
	headers := "/usr/src/linux-headers-" + k.Version
	if err := ensureHeaders(k.Version, headers); err != nil {
		return "", err
	}
	version, err := packageVersion("linux-headers-" + k.Version)
	if err != nil {
		return "", err
	}
	series, err := kernelSeries(k.Version)
	if err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(filepath.Dir(k.Root), "siw-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	src := "linux-source-" + series
	if err := run(work, "apt-get", "download", src+"="+version); err != nil {
		return "", fmt.Errorf("downloading the kernel sources siw is built from: %w", err)
	}
	debs, _ := filepath.Glob(filepath.Join(work, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s left %d .deb files, want 1", src, len(debs))
	}
	if err := run(work, "dpkg-deb", "-x", debs[0], "deb"); err != nil {
		return "", err
	}
	dir := src + "/drivers/infiniband/sw/siw"
	tarball := filepath.Join(work, "deb", "usr", "src", src+".tar.xz")
	if err := run(work, "tar", "-xJf", tarball, dir); err != nil {
		return "", err
	}
	if err := run(work, "make", "-C", headers, "M="+filepath.Join(work, dir), "CONFIG_RDMA_SIW=m", "modules"); err != nil {
		return "", fmt.Errorf("building siw.ko: %w", err)
	}
	built := filepath.Join(work, dir, "siw.ko")
	out, err := exec.Command("modinfo", "-F", "vermagic", built).Output()
	if err != nil {
		return "", fmt.Errorf("modinfo %s: %w", built, err)
	}
	if magic := strings.Fields(string(out)); len(magic) == 0 || magic[0] != k.Version {
		return "", fmt.Errorf("siw.ko was built for %q, not %s", bytes.TrimSpace(out), k.Version)
	}
	if err := os.MkdirAll(filepath.Dir(ko), 0o755); err != nil {
		return "", err
	}
	// work is beside the kernel in the cache, on the same file system: a
	// rename puts the finished module in place at once.
	return ko, os.Rename(built, ko)
}

// ensureHeaders installs linux-headers-<version> (and with it kbuild and the
// compiler the kernel was built with) unless dir already holds them.
func ensureHeaders(version, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "Makefile")); err == nil {
		return nil
	}
	pkg := "linux-headers-" + version
	var argv []string
	switch {
	case os.Geteuid() == 0:
	case exec.Command("sudo", "-n", "true").Run() == nil:
		argv = []string{"sudo"}
	default:
		return fmt.Errorf("building siw.ko needs %s: install it as root with `apt-get install --no-install-recommends %s`", pkg, pkg)
	}
	argv = append(argv, "apt-get", "install", "-y", "-qq", "--no-install-recommends", pkg)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("installing %s: %v: %s", pkg, err, bytes.TrimSpace(out))
	}
	return nil
}

// packageVersion is the installed version of a Debian package.
func packageVersion(pkg string) (string, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", pkg).Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return "", fmt.Errorf("dpkg-query %s: not installed (%v)", pkg, err)
	}
	return string(bytes.TrimSpace(out)), nil
}

// kernelSeries is the major.minor of a kernel version ("6.1" of
// "6.1.0-56-amd64"), which names Debian's linux-source package.
func kernelSeries(version string) (string, error) {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 3 || parts[0] == "" || parts[1] == "" {
		return "", errors.New("testbed: cannot read a major.minor from kernel version " + version)
	}
	return parts[0] + "." + parts[1], nil
}
