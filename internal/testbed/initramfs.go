package testbed

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed init.sh
var initScript []byte

// guestModules are loaded in this order (each after its dependencies).
// crc32_generic must come before `rdma link add`: rxe needs crc32 and the
// guest has no modprobe to load it on demand.
var guestModules = []string{
	"virtio_pci", "9pnet_virtio", "9p",
	"crc32_generic", "crc32-pclmul",
	"ib_uverbs", "rdma_rxe", "rdma_ucm",
	"dummy", "veth", "virtio_net", "sch_netem",
	"sch_prio", "cls_u32", "act_gact", // the wire tests' RTU filter
}

// guestConfig is what one guest's init needs to know.
type guestConfig struct {
	Kind  string // the RDMA device's type: DeviceRXE or DeviceSIW
	NIC   string // netdev the device is created on: dummy0 (one guest) or eth0 (pair)
	Addr  string // CIDR IPv4 address of NIC
	Addr6 string // CIDR IPv6 address of NIC
	Host  string // a name the guest's /etc/hosts gives Addr6 and Addr
	Agent string // host path of the rxevm binary, run as the guest agent
	Job   string // host path of the job description
	Share string // host path of the writable share
	Out   string // host directory the guest may write (Options.WritableDir), or ""
}

// moduleFiles resolves the modules a guest with device loads, and their
// dependencies, to .ko paths in load order, without duplicates: guestModules,
// then for siw its dependencies and the siw.ko built for k (siwPath).
func moduleFiles(k Kernel, device, siwPath string) ([]string, error) {
	names := guestModules
	if device == DeviceSIW {
		names = append(names[:len(names):len(names)], siwModules...)
	}
	modRoot := filepath.Join(k.Root, "lib", "modules", k.Version)
	var files []string
	seen := map[string]bool{}
	for _, m := range names {
		out, err := exec.Command("modprobe", "-d", k.Root, "-S", k.Version, "--show-depends", m).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("modprobe --show-depends %s: %v: %s", m, err, bytes.TrimSpace(out))
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 || f[0] != "insmod" { // "builtin x" needs nothing
				continue
			}
			if rel, err := filepath.Rel(modRoot, f[1]); err != nil || strings.HasPrefix(rel, "..") {
				return nil, fmt.Errorf("module %s outside %s", f[1], modRoot)
			}
			if !seen[f[1]] {
				seen[f[1]] = true
				files = append(files, f[1])
			}
		}
	}
	if device == DeviceSIW {
		files = append(files, siwPath)
	}
	return files, nil
}

// writeInitramfs builds the guest's initramfs: busybox, the modules, init and
// its config. It is rebuilt for every guest (about 10 MB, well under a
// second), so it can never go stale.
func writeInitramfs(path string, k Kernel, mods []string, cfg guestConfig) error {
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("busybox: %w (run `make deps`: it installs busybox-static)", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	c := &cpioWriter{w: bw}
	for _, d := range []string{"bin", "dev", "proc", "sys", "host", "lib", "lib/modules"} {
		c.Dir(d)
	}
	c.CharDev("dev/console", 5, 1)
	c.File("bin/busybox", 0o755, busybox)
	for _, applet := range []string{"sh", "mount", "insmod", "mkdir", "ip", "chroot", "poweroff", "sleep", "stty", "grep", "sync", "cat"} {
		c.Symlink("bin/"+applet, "busybox")
	}
	c.File("init", 0o755, initScript)
	c.File("rxevm.conf", 0o644, []byte(fmt.Sprintf("KIND=%s\nNIC=%s\nADDR=%s\nADDR6=%s\nHOST=%s\nAGENT=%s\nJOB=%s\nSHARE=%s\nOUT=%s\n",
		shQuote(cfg.Kind), shQuote(cfg.NIC), shQuote(cfg.Addr), shQuote(cfg.Addr6), shQuote(cfg.Host), shQuote(cfg.Agent), shQuote(cfg.Job),
		shQuote(cfg.Share), shQuote(cfg.Out))))
	var list bytes.Buffer
	for _, path := range mods {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// Flatten: modules are stored by base name, which is unique.
		name := filepath.Base(path)
		c.File("lib/modules/"+name, 0o644, data)
		list.WriteString(name + "\n")
	}
	c.File("modules.list", 0o644, list.Bytes())
	if err := c.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
