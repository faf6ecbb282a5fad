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
	NIC   string // netdev rxe0 is created on: dummy0 (one guest) or eth0 (pair)
	Addr  string // CIDR IPv4 address of NIC
	Addr6 string // CIDR IPv6 address of NIC
	Agent string // host path of the rxevm binary, run as the guest agent
	Job   string // host path of the job description
	Share string // host path of the writable share
	Out   string // host directory the guest may write (Options.WritableDir), or ""
}

// moduleFiles resolves guestModules and their dependencies to .ko paths
// relative to lib/modules/<version>, in load order, without duplicates.
func moduleFiles(k Kernel) ([]string, error) {
	modRoot := filepath.Join(k.Root, "lib", "modules", k.Version)
	var files []string
	seen := map[string]bool{}
	for _, m := range guestModules {
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
			rel, err := filepath.Rel(modRoot, f[1])
			if err != nil || strings.HasPrefix(rel, "..") {
				return nil, fmt.Errorf("module %s outside %s", f[1], modRoot)
			}
			if !seen[rel] {
				seen[rel] = true
				files = append(files, rel)
			}
		}
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
	c.File("rxevm.conf", 0o644, []byte(fmt.Sprintf("NIC=%s\nADDR=%s\nADDR6=%s\nAGENT=%s\nJOB=%s\nSHARE=%s\nOUT=%s\n",
		shQuote(cfg.NIC), shQuote(cfg.Addr), shQuote(cfg.Addr6), shQuote(cfg.Agent), shQuote(cfg.Job),
		shQuote(cfg.Share), shQuote(cfg.Out))))
	modRoot := filepath.Join(k.Root, "lib", "modules", k.Version)
	var list bytes.Buffer
	for _, rel := range mods {
		data, err := os.ReadFile(filepath.Join(modRoot, rel))
		if err != nil {
			return err
		}
		// Flatten: modules are stored by base name, which is unique.
		name := filepath.Base(rel)
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
