package testbed

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Kernel is an extracted Debian kernel package: the image qemu boots and the
// module tree the initramfs is built from.
type Kernel struct {
	Version string // e.g. "6.1.0-56-amd64"
	Root    string // where the .deb was extracted (holds boot/ and lib/modules/)
}

// Image is the path of the bootable kernel image.
func (k Kernel) Image() string { return filepath.Join(k.Root, "boot", "vmlinuz-"+k.Version) }

// CacheDir is where kernels are kept between runs: $RXEVM_CACHE, or
// <user cache dir>/rdmacm-testbed. It is outside the work tree on purpose, so a
// fresh clone reuses the ~70 MB download and git never sees it.
func CacheDir() (string, error) {
	if d := os.Getenv("RXEVM_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory (set RXEVM_CACHE): %w", err)
	}
	return filepath.Join(d, "rdmacm-testbed"), nil
}

// EnsureKernel returns the kernel to boot, downloading and extracting it into
// the cache the first time. With want empty it is the kernel Debian's
// linux-image-amd64 currently depends on: the ABI number moves with point
// releases, so the name is resolved every time, and when apt cannot answer
// (offline) the newest cached kernel is used. With want set (see
// KernelPackage) it is that kernel and no other: a comparison across kernels
// must not silently boot a substitute.
func EnsureKernel(want string, logf func(string, ...any)) (Kernel, error) {
	cache, err := CacheDir()
	if err != nil {
		return Kernel{}, err
	}
	kdir := filepath.Join(cache, "kernel")
	pkg, err := KernelPackage(want)
	if err != nil {
		return Kernel{}, fmt.Errorf("testbed: kernel: %w", err)
	}
	if pkg == "" {
		var resolveErr error
		if pkg, resolveErr = resolveKernelPackage(); resolveErr != nil {
			if k, ok := newestCachedKernel(kdir); ok {
				logf("testbed: %v; using cached kernel %s", resolveErr, k.Version)
				return k, nil
			}
			return Kernel{}, resolveErr
		}
	}
	version := strings.TrimPrefix(pkg, "linux-image-")
	k := Kernel{Version: version, Root: filepath.Join(kdir, version)}
	if _, err := os.Stat(filepath.Join(k.Root, ".complete")); err == nil {
		return k, nil
	}
	logf("testbed: downloading and extracting %s (once; cached in %s)", pkg, kdir)
	if err := fetchKernel(pkg, k); err != nil {
		return Kernel{}, err
	}
	return k, nil
}

// kernelVersion is a Debian kernel ABI name such as 6.1.0-56-amd64: it
// starts with a digit and holds only what a Debian package name may.
var kernelVersion = regexp.MustCompile(`^[0-9][0-9a-z.+-]*-[a-z0-9]+$`)

// KernelPackage names the Debian package of the kernel asked for, given as
// its ABI name (6.1.0-56-amd64) or its package (linux-image-6.1.0-56-amd64),
// or returns "" for none asked (the current one). Anything else is refused
// before it reaches apt-get.
func KernelPackage(want string) (string, error) {
	if want == "" {
		return "", nil
	}
	version := strings.TrimPrefix(want, "linux-image-")
	if !kernelVersion.MatchString(version) {
		return "", fmt.Errorf("%q is not a Debian kernel: want an ABI name such as 6.1.0-56-amd64, or its linux-image- package", want)
	}
	return "linux-image-" + version, nil
}

func resolveKernelPackage() (string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return "", errors.New("apt-cache not found: the testbed needs a Debian or Ubuntu host to fetch its kernel")
	}
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends linux-image-amd64: %v: %s (run `apt-get update`)", err, bytes.TrimSpace(out))
	}
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(line, "Depends: "); ok && strings.HasPrefix(name, "linux-image-") {
			return name, nil
		}
	}
	return "", fmt.Errorf("apt-cache depends linux-image-amd64 names no kernel package (run `apt-get update`): %s", out)
}

func fetchKernel(pkg string, k Kernel) error {
	for _, tool := range []string{"apt-get", "dpkg-deb", "depmod"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: run `make deps` (installs kmod) on a Debian host", tool)
		}
	}
	if err := os.MkdirAll(filepath.Dir(k.Root), 0o755); err != nil {
		return err
	}
	dl, err := os.MkdirTemp(filepath.Dir(k.Root), "download-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dl)
	if err := run(dl, "apt-get", "download", pkg); err != nil {
		return fmt.Errorf("downloading %s: %w", pkg, err)
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s left %d .deb files, want 1", pkg, len(debs))
	}
	// Extract next to the final place and rename, so an interrupted run never
	// leaves a half-extracted kernel that looks complete.
	staging := filepath.Join(dl, "root")
	if err := run(dl, "dpkg-deb", "-x", debs[0], staging); err != nil {
		return err
	}
	if err := run(dl, "depmod", "-b", staging, k.Version); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(staging, ".complete"), nil, 0o644); err != nil {
		return err
	}
	os.RemoveAll(k.Root)
	return os.Rename(staging, k.Root)
}

func newestCachedKernel(kdir string) (Kernel, bool) {
	stamps, _ := filepath.Glob(filepath.Join(kdir, "*", ".complete"))
	if len(stamps) == 0 {
		return Kernel{}, false
	}
	newest := filepath.Dir(stamps[0])
	for _, s := range stamps[1:] {
		if root := filepath.Dir(s); compareVersions(filepath.Base(root), filepath.Base(newest)) > 0 {
			newest = root
		}
	}
	return Kernel{Version: filepath.Base(newest), Root: newest}, true
}

// compareVersions orders kernel ABI names as their numbers do, so that
// 6.1.0-10-amd64 follows 6.1.0-9-amd64 (a string order puts it first): the
// names are compared a run of digits or of other characters at a time,
// digit runs by value.
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		ra, rb := leadingRun(a), leadingRun(b)
		a, b = a[len(ra):], b[len(rb):]
		if c := compareRuns(ra, rb); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// leadingRun is s's first run of digits, or of other characters.
func leadingRun(s string) string {
	digit := isDigit(s[0])
	i := 1
	for i < len(s) && isDigit(s[i]) == digit {
		i++
	}
	return s[:i]
}

// compareRuns compares two runs: digits by value (longer without leading
// zeros is larger), anything else as strings, digits before other text.
func compareRuns(a, b string) int {
	da, db := isDigit(a[0]), isDigit(b[0])
	switch {
	case da && db:
		a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
		if c := cmp.Compare(len(a), len(b)); c != 0 {
			return c
		}
	case da != db:
		if da {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func run(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
