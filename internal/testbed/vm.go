// Package testbed boots Soft-RoCE (rdma_rxe) guests under qemu and runs a
// command inside them, so that tests of this project run on a real RDMA
// device on hosts whose kernel has none. See ../../../shared/TESTBED.md for
// the measured facts it is built on.
package testbed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options tune a run.
type Options struct {
	// Guests is 1 (the device on dummy0, loopback inside the guest) or 2
	// (two guests joined by qemu's UDP socket netdev, the device on each
	// one's eth0).
	Guests int
	// Device is the RDMA device each guest creates: DeviceRXE (rxe0, the
	// default) or DeviceSIW (siw0; its module is built on first use).
	Device string
	// Timeout bounds the whole run; the guests are killed when it expires.
	Timeout time.Duration
	// Verbose streams the guests' consoles (kernel and init) to Stderr.
	Verbose bool
	// MemoryMB per guest.
	MemoryMB int
	// WritableDir, if set, is a host directory the guest sees writable at
	// the same path (everything else of the host is read-only there).
	WritableDir string
	// Kernel, if set, is the Debian kernel the guests boot (an ABI name
	// such as 6.1.0-56-amd64, or its linux-image- package) instead of the
	// one linux-image-amd64 depends on now; see EnsureKernel.
	Kernel string
	Stdout io.Writer
	Stderr io.Writer
}

// testHost is the name the guest's /etc/hosts gives its two addresses.
const testHost = "rdmacm-testbed"

// Environment variables a command finds in the guest.
const (
	EnvAddr      = "RDMACM_TEST_ADDR"      // this guest's IPv4 address on the rxe netdev
	EnvAddr6     = "RDMACM_TEST_ADDR6"     // and its IPv6 address
	EnvHost      = "RDMACM_TEST_HOST"      // a name for both (/etc/hosts)
	EnvPeerAddr  = "RDMACM_TEST_PEER_ADDR" // the other guest's address (pair mode)
	EnvDevice    = "RDMACM_TEST_DEVICE"    // the RDMA device name: rxe0 or siw0
	EnvTransport = "RDMACM_TEST_TRANSPORT" // its transport: roce or iwarp
	EnvNetdev    = "RDMACM_TEST_NETDEV"    // the netdev under it: dummy0, or eth0 with two guests
	EnvGuest     = "RXEVM_GUEST"           // this guest's index, 0 or 1
)

// ErrTimeout is returned when the guests outlive Options.Timeout.
var ErrTimeout = errors.New("testbed: guest timed out")

// HostHasRDMA reports whether this host already has an RDMA device, in
// which case commands run directly instead of in a guest.
func HostHasRDMA() bool {
	entries, err := os.ReadDir("/sys/class/infiniband")
	return err == nil && len(entries) > 0
}

// Run runs argv with the caller's working directory and environment and
// returns its exit status. On a host with an RDMA device it runs directly;
// otherwise inside fresh Soft-RoCE guests. ctx cancellation (SIGINT, SIGTERM)
// and Options.Timeout stop the guests; no qemu process outlives Run.
func Run(ctx context.Context, argv []string, opts Options) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("testbed: no command to run")
	}
	if opts.Guests == 0 {
		opts.Guests = 1
	}
	if opts.Guests > 2 || opts.Guests < 1 {
		return 0, fmt.Errorf("testbed: %d guests asked; 1 or 2 are supported", opts.Guests)
	}
	if opts.MemoryMB == 0 {
		opts.MemoryMB = 2048
	}
	if opts.Device == "" {
		opts.Device = DeviceRXE
	}
	if _, ok := deviceTransport[opts.Device]; !ok {
		return 0, fmt.Errorf("testbed: device %q: want %s or %s", opts.Device, DeviceRXE, DeviceSIW)
	}
	if opts.WritableDir != "" {
		abs, err := filepath.Abs(opts.WritableDir)
		if err != nil {
			return 0, err
		}
		if st, err := os.Stat(abs); err != nil || !st.IsDir() {
			return 0, fmt.Errorf("testbed: writable directory %s: not a directory", abs)
		}
		opts.WritableDir = abs
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, opts.Timeout, fmt.Errorf("%w after %v", ErrTimeout, opts.Timeout))
		defer cancel()
	}
	// A host with its own rxe device runs the command directly, unless a
	// kernel was asked for: only a guest can boot it.
	if HostHasRDMA() && opts.Guests == 1 && opts.Device == DeviceRXE && opts.Kernel == "" {
		return runOnHost(ctx, argv, opts)
	}
	return runInGuests(ctx, argv, opts)
}

func runOnHost(ctx context.Context, argv []string, opts Options) (int, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = opts.Stdout, opts.Stderr, os.Stdin
	err := cmd.Run()
	if ctx.Err() != nil {
		return 0, context.Cause(ctx)
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return exitErr.ExitCode(), nil
	}
	return 0, err
}

// guest is one running qemu and what it streams back.
type guest struct {
	index   int
	cmd     *exec.Cmd
	exited  chan struct{} // closed when qemu has exited
	console *tailBuffer
	copies  sync.WaitGroup
	started string // the agent writes it on the share before the job runs
	status  string // status file on the share
}

// bootTimeout bounds a guest's boot, from qemu's start until its agent
// starts the job; a boot takes about 8 s. Rarely, a TCG guest hangs
// before the job starts, printing nothing: it is killed and booted again,
// up to bootAttempts times in all, rather than holding the run until its
// timeout. A job that started is never run twice.
const (
	bootTimeout  = 90 * time.Second
	bootAttempts = 3
)

func runInGuests(ctx context.Context, argv []string, opts Options) (int, error) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return 0, errors.New("testbed: qemu-system-x86_64 not found: run `make deps` (installs qemu-system-x86)")
	}
	agent, err := os.Executable()
	if err != nil {
		return 0, err
	}
	if argv[0], err = resolveCommand(argv[0]); err != nil {
		return 0, err
	}
	k, err := EnsureKernel(opts.Kernel, func(f string, a ...any) { fmt.Fprintf(opts.Stderr, f+"\n", a...) })
	if err != nil {
		return 0, err
	}
	var siwPath string
	if opts.Device == DeviceSIW {
		if siwPath, err = EnsureSiw(k, func(f string, a ...any) { fmt.Fprintf(opts.Stderr, f+"\n", a...) }); err != nil {
			return 0, err
		}
	}
	mods, err := moduleFiles(k, opts.Device, siwPath)
	if err != nil {
		return 0, err
	}
	runDir, err := os.MkdirTemp("", "rxevm-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(runDir)
	share := filepath.Join(runDir, "share")
	if err := os.Mkdir(share, 0o777); err != nil {
		return 0, err
	}
	wd, err := os.Getwd()
	if err != nil {
		return 0, err
	}

	for attempt := 1; ; attempt++ {
		ports, err := freeUDPPorts(opts.Guests)
		if err != nil {
			return 0, err
		}
		guests := make([]*guest, 0, opts.Guests)
		for i := range opts.Guests {
			g, err := startGuest(ctx, i, qemu, agent, k, mods, runDir, share, wd, argv, ports, opts)
			if err != nil {
				stopGuests(guests)
				return 0, err
			}
			guests = append(guests, g)
		}
		hung := waitForJobs(ctx, guests, bootTimeout)
		if hung == nil || attempt == bootAttempts {
			return waitForGuests(ctx, guests)
		}
		stopGuests(guests)
		fmt.Fprintf(opts.Stderr, "rxevm: guest %d did not start its job within %v (boot %d of %d); booting again. Its console ended with:\n%s\n",
			hung.index, bootTimeout, attempt, bootAttempts, hung.console.String())
	}
}

// waitForJobs waits until every guest has started its job or exited, and
// returns the first that did neither within timeout (nil if none did, or
// ctx ended).
func waitForJobs(ctx context.Context, guests []*guest, timeout time.Duration) *guest {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		var waiting *guest
		for _, g := range guests {
			if !g.jobStarted() {
				waiting = g
				break
			}
		}
		if waiting == nil {
			return nil
		}
		select {
		case <-poll.C:
		case <-deadline.C:
			return waiting
		case <-ctx.Done():
			return nil
		}
	}
}

// jobStarted says the guest's agent started the job, or qemu is gone
// (exitStatus then says why).
func (g *guest) jobStarted() bool {
	select {
	case <-g.exited:
		return true
	default:
	}
	_, err := os.Stat(g.started)
	return err == nil
}

// stopGuests kills the guests and waits until they and their output are gone.
func stopGuests(guests []*guest) {
	for _, g := range guests {
		g.cmd.Process.Kill()
		<-g.exited
		g.copies.Wait()
	}
}

// waitForGuests waits for every guest to end and returns the first
// non-zero exit status among them, or the first error.
func waitForGuests(ctx context.Context, guests []*guest) (int, error) {
	status := 0
	var firstErr error
	for _, g := range guests {
		<-g.exited
		g.copies.Wait()
		code, err := g.exitStatus(ctx)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if code != 0 && status == 0 {
			status = code
		}
	}
	return status, firstErr
}

func (g *guest) exitStatus(ctx context.Context) (int, error) {
	if ctx.Err() != nil {
		return 0, context.Cause(ctx)
	}
	data, err := os.ReadFile(g.status)
	if err != nil {
		return 0, fmt.Errorf("testbed: guest %d ended without reporting an exit status (%v); its console ended with:\n%s",
			g.index, g.cmd.ProcessState, g.console.String())
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

func startGuest(ctx context.Context, i int, qemu, agent string, k Kernel, mods []string,
	runDir, share, wd string, argv []string, ports []int, opts Options) (*guest, error) {
	g := &guest{index: i, exited: make(chan struct{}), console: &tailBuffer{max: 16 << 10},
		started: filepath.Join(share, fmt.Sprintf("started-%d", i)), status: filepath.Join(share, fmt.Sprintf("status-%d", i))}
	for _, f := range []string{g.started, g.status} { // left by an earlier boot
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	cfg := guestConfig{Kind: opts.Device, NIC: "dummy0", Addr: "10.77.0.1/24", Addr6: "fd77::1/64", Host: testHost, Agent: agent, Share: share, Out: opts.WritableDir,
		Job: filepath.Join(share, fmt.Sprintf("job-%d.json", i))}
	env := append(os.Environ(), EnvDevice+"="+opts.Device+"0", EnvTransport+"="+deviceTransport[opts.Device], EnvGuest+"="+strconv.Itoa(i),
		"TMPDIR=/var/tmp") // the host's /tmp is read-only in the guest; /var/tmp is a tmpfs
	if opts.Guests == 2 {
		cfg.NIC = "eth0"
		cfg.Addr = fmt.Sprintf("10.77.1.%d/24", i+1)
		cfg.Addr6 = fmt.Sprintf("fd77:1::%d/64", i+1)
		env = append(env, EnvPeerAddr+"="+fmt.Sprintf("10.77.1.%d", 2-i))
	}
	env = append(env, EnvAddr+"="+strings.Split(cfg.Addr, "/")[0], EnvAddr6+"="+strings.Split(cfg.Addr6, "/")[0],
		EnvHost+"="+cfg.Host, EnvNetdev+"="+cfg.NIC)
	jobData, _ := json.Marshal(job{Argv: argv, Env: env, Dir: wd, StartedFile: g.started, StatusFile: g.status})
	if err := os.WriteFile(cfg.Job, jobData, 0o644); err != nil {
		return nil, err
	}
	initrd := filepath.Join(runDir, fmt.Sprintf("initramfs-%d.cpio", i))
	if err := writeInitramfs(initrd, k, mods, cfg); err != nil {
		return nil, err
	}

	stdout, stderr := opts.Stdout, opts.Stderr
	if opts.Guests > 1 {
		stdout = &prefixWriter{w: opts.Stdout, prefix: fmt.Sprintf("[guest%d] ", i)}
		stderr = &prefixWriter{w: opts.Stderr, prefix: fmt.Sprintf("[guest%d] ", i)}
	}
	var consoleOut io.Writer = g.console
	if opts.Verbose {
		consoleOut = io.MultiWriter(g.console, &prefixWriter{w: opts.Stderr, prefix: fmt.Sprintf("[console%d] ", i)})
	}
	accel := accelArgs()
	args := []string{
		"-display", "none", "-nodefaults", "-no-reboot", "-nic", "none",
		"-m", strconv.Itoa(opts.MemoryMB), "-smp", "2",
		"-kernel", k.Image(), "-initrd", initrd,
		"-append", kernelCmdline(accel),
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + share + ",mount_tag=share,security_model=none",
	}
	if opts.WritableDir != "" {
		args = append(args, "-virtfs", "local,path="+opts.WritableDir+",mount_tag=out,security_model=none")
	}
	args = append(args, accel...)
	// ttyS0: console, ttyS1: the command's stdout, ttyS2: its stderr. Each is
	// a unix socket qemu connects to, so output streams as it is written.
	for n, w := range []io.Writer{consoleOut, stdout, stderr} {
		sock := filepath.Join(runDir, fmt.Sprintf("g%d-tty%d.sock", i, n))
		l, err := net.Listen("unix", sock)
		if err != nil {
			return nil, err
		}
		g.copies.Add(1)
		go func() {
			defer g.copies.Done()
			defer l.Close()
			conn, err := acceptUntil(ctx, g.exited, l)
			if err != nil {
				return
			}
			defer conn.Close()
			io.Copy(w, conn)
		}()
		id := fmt.Sprintf("s%d", n)
		args = append(args, "-chardev", "socket,id="+id+",path="+sock, "-serial", "chardev:"+id)
	}
	if opts.Guests == 2 {
		args = append(args,
			"-netdev", fmt.Sprintf("socket,id=n0,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", ports[1-i], ports[i]),
			"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:77:01:%02x", i+1))
	}
	cmd := exec.CommandContext(ctx, qemu, args...)
	var qemuOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &qemuOut, g.console
	// If rxevm itself is killed, the kernel kills qemu too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		close(g.exited) // the sockets' accepts give up
		return nil, fmt.Errorf("testbed: starting qemu: %w", err)
	}
	g.cmd = cmd
	go func() {
		cmd.Wait()
		close(g.exited)
	}()
	return g, nil
}

// acceptUntil accepts qemu's connection to l, giving up when ctx ends or
// qemu has exited without connecting: it refused its arguments, say, and
// the guest's output copies must not wait for it (waitForGuests waits for
// them).
func acceptUntil(ctx context.Context, exited <-chan struct{}, l net.Listener) (net.Conn, error) {
	accepted := make(chan struct{})
	defer close(accepted)
	go func() {
		select {
		case <-ctx.Done():
		case <-exited:
		case <-accepted:
			return
		}
		l.Close()
	}()
	return l.Accept()
}

// kernelCmdline is the guest kernel's command line. Under TCG the kernel
// distrusts the emulated TSC and picks the HPET, which makes every clock
// read an emulated MMIO access, several times dearer than the TSC: Go
// reads the clock in its scheduler, so the TSC is forced there. Under KVM
// the kernel's own choice is right.
func kernelCmdline(accel []string) string {
	line := "console=ttyS0 panic=-1 quiet loglevel=3"
	if slices.Contains(accel, "tcg,thread=multi") {
		line += " clocksource=tsc tsc=reliable"
	}
	return line
}

// accelArgs picks KVM only where it can boot a stock kernel: the CPU shows
// vmx or svm and the host's KVM is not the PVM flavour. Otherwise TCG.
func accelArgs() []string {
	tcg := []string{"-accel", "tcg,thread=multi", "-cpu", "max"}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return tcg
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
	} else {
		return tcg
	}
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	for _, flag := range strings.Fields(string(cpuinfo)) {
		if flag == "vmx" || flag == "svm" {
			return []string{"-accel", "kvm", "-cpu", "host"}
		}
	}
	return tcg
}

// resolveCommand makes argv[0] an absolute path the guest can run: it runs
// in the same directory, but looks it up with its own PATH.
func resolveCommand(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("testbed: %w", err)
	}
	return filepath.Abs(p)
}

func freeUDPPorts(n int) ([]int, error) {
	ports := make([]int, n)
	conns := make([]net.PacketConn, n)
	for i := range ports {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		conns[i] = c
		ports[i] = c.LocalAddr().(*net.UDPAddr).Port
	}
	for _, c := range conns {
		c.Close()
	}
	return ports, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

// Write keeps p, dropping the oldest bytes beyond max.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

// String is the kept tail, with CRLF line ends made LF.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ReplaceAll(string(t.buf), "\r\n", "\n")
}

// prefixWriter prefixes every line with a guest's name (pair mode), so the
// two guests' output can be told apart.
type prefixWriter struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  string
	partial bool
}

// Write writes b with the prefix at the start of every line.
func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Split(scanLinesKeepNewline)
	for sc.Scan() {
		if !p.partial {
			out.WriteString(p.prefix)
		}
		line := sc.Bytes()
		out.Write(line)
		p.partial = line[len(line)-1] != '\n'
	}
	if _, err := p.w.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(b), nil
}

func scanLinesKeepNewline(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i+1], nil
	}
	if len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}
