// Command rxevm runs a command on a Soft-RoCE (rdma_rxe) or, with -device
// siw, a soft-iWARP device: inside a fresh qemu guest when this host has no
// RDMA device (always for siw), directly otherwise.
// It exits with the command's exit status, so it works as `go test -exec`:
//
//	go test -exec "$(pwd)/bin/rxevm" ./integration/...
//	rxevm ibv_devinfo
//	rxevm -guests 2 sh -c 'echo $RDMACM_TEST_ADDR $RDMACM_TEST_PEER_ADDR'
//
// The guest sees the host's root read-only, the caller's working directory
// and environment, and RDMACM_TEST_ADDR (the address the device is bound
// to), RDMACM_TEST_DEVICE (rxe0 or siw0), RDMACM_TEST_TRANSPORT (roce or
// iwarp), RXEVM_GUEST and, with two guests, RDMACM_TEST_PEER_ADDR.
// TMPDIR is /var/tmp, a tmpfs. -w DIR makes one host directory writable,
// to bring results out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/internal/flagcheck"
	"github.com/go-rdma/rdmacm/internal/testbed"
)

func main() {
	guestAgent := flag.String("guest-agent", "", "internal: run the job file `path` inside a guest")
	guests := flag.Int("guests", 1, "number of guests: 1, or 2 joined by a UDP link (each with the device on eth0)")
	device := flag.String("device", envString("RXEVM_DEVICE", testbed.DeviceRXE), "the RDMA device: rxe (Soft-RoCE, rxe0) or siw (soft-iWARP, siw0; its module is built once) (env RXEVM_DEVICE)")
	timeout := flag.Duration("timeout", envDuration("RXEVM_TIMEOUT", 20*time.Minute), "kill the guests after this long; 0 for no bound (env RXEVM_TIMEOUT)")
	memory := flag.Int("memory", 2048, "guest memory in MiB")
	writable := flag.String("w", os.Getenv("RXEVM_WRITABLE"), "a host `dir` the guest may write (env RXEVM_WRITABLE); the rest is read-only")
	kernel := flag.String("kernel", os.Getenv("RXEVM_KERNEL"), "boot this Debian `kernel` (e.g. 6.1.0-56-amd64) instead of the one linux-image-amd64 depends on now; fetched and cached once (env RXEVM_KERNEL)")
	verbose := flag.Bool("v", os.Getenv("RXEVM_VERBOSE") != "", "stream the guests' consoles to stderr (env RXEVM_VERBOSE)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: rxevm [flags] command [args...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	if *guestAgent != "" {
		if err := testbed.GuestAgent(*guestAgent); err != nil {
			fmt.Fprintf(os.Stderr, "rxevm guest agent: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := checkFlags(*guests, *timeout, *kernel); err != nil {
		fmt.Fprintf(os.Stderr, "rxevm: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code, err := testbed.Run(ctx, flag.Args(), testbed.Options{
		Guests: *guests, Device: *device, Timeout: *timeout, Verbose: *verbose, MemoryMB: *memory, WritableDir: *writable,
		Kernel: *kernel,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "rxevm: %v\n", err)
		if code == 0 {
			code = 125
		}
	}
	os.Exit(code)
}

// checkFlags refuses what the testbed would otherwise take for its default
// (-guests 0, -memory 0) or for no bound at all (a negative -timeout), and a
// -kernel that names no Debian kernel.
func checkFlags(guests int, timeout time.Duration, kernel string) error {
	if err := flagcheck.AtLeast(flag.CommandLine, 1, "guests", "memory"); err != nil {
		return err
	}
	if guests > 2 {
		return fmt.Errorf("-guests %d: want 1 or 2", guests)
	}
	if timeout < 0 {
		return fmt.Errorf("-timeout %v: want 0 (no bound) or more", timeout)
	}
	if _, err := testbed.KernelPackage(kernel); err != nil {
		return fmt.Errorf("-kernel: %w", err)
	}
	return nil
}

func envString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}
