// Package removal removes the RDMA device under a process that uses it.
// The device cannot go while any process holds it open (rxe and siw do
// not let the kernel take it from a live process, and librdmacm keeps its
// own hold until the process exits), so the process that uses the device
// is a child of the test, which itself never opens the device. It has a
// package of its own: every other test binary holds the device.
package removal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// roleEnv makes the test binary the child that uses the device.
const roleEnv = "RDMACM_REMOVAL_CHILD"

// removalBound is how long the child's connections and listeners may take
// to notice the removal; the kernel tells them at once.
const removalBound = 10 * time.Second

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "removal":
		os.Exit(child())
	case "connect":
		os.Exit(connects())
	}
	goleak.VerifyTestMain(m)
}

// TestDeviceRemovalEndsWhatUsesIt: when the RDMA device is removed (`rdma
// link delete`) under a process with connections and listeners on it,
// within removalBound each connection ends with an error matching
// cm.ErrDeviceRemoved (a cm endpoint's Done and Err, a msg reader waiting
// in Recv; on one device, an end may see its peer disconnect first,
// cm.ErrPeerDisconnected, but not both ends); a datagram Conn's waiting
// ReadFrom, and its later WriteTo and Resolve, fail with such an error (on
// iWARP dgram refuses the Conn); a cm or msg listener's waiting Accept
// returns such an error instead of waiting for ever, and so does an
// http.Server's Serve on an rdmanet listener, while a msg listener on
// every address, bound to no device, waits on in Accept until its Close
// (the kernel drops only its listen on the device); a new Dial and Listen
// fail with an error matching syscall.ENODEV; every Close returns, and no
// goroutine is left. The removal completes once that process exits, and
// the device put back connects again.
func TestDeviceRemovalEndsWhatUsesIt(t *testing.T) {
	rxetest.Addr(t) // skips, or fails, without a device
	netdev := os.Getenv("RDMACM_TEST_NETDEV")
	if netdev == "" {
		t.Skip("removes the device and puts it back: runs only in the testbed's guest (make test)")
	}
	dev, kind := rxetest.Device(), "rxe"
	if rxetest.IWARP() {
		kind = "siw"
	}

	c := childProcess("removal")
	c.Stderr = os.Stderr
	out, err := c.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "the child said nothing")
	require.Equal(t, "ready", lines.Text())

	removed := make(chan error, 1)
	go func() {
		out, err := exec.Command("rdma", "link", "delete", dev).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		removed <- err
	}()
	var failures []string
	for lines.Scan() {
		t.Logf("child: %s", lines.Text())
		if strings.HasPrefix(lines.Text(), "FAIL") {
			failures = append(failures, lines.Text())
		}
	}
	require.NoError(t, c.Wait(), "the child failed")
	require.Empty(t, failures)
	select {
	case err := <-removed:
		require.NoError(t, err, "rdma link delete")
	case <-time.After(30 * time.Second):
		t.Fatal("the device was not removed after the child exited")
	}

	out2, err := exec.Command("rdma", "link", "add", dev, "type", kind, "netdev", netdev).CombinedOutput()
	require.NoError(t, err, "putting the device back: %s", out2)
	// In another child too: this process must never hold the device,
	// or the next run's removal would wait for it.
	out2, err = childProcess("connect").CombinedOutput()
	require.NoError(t, err, "connecting on the device put back: %s", out2)
}

// childProcess is this test binary run as the child of role.
func childProcess(role string) *exec.Cmd {
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), roleEnv+"="+role)
	return c
}

// connects is the child that dials a listener on the device put back:
// it exits 0 once that connects.
func connects() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0")
	var l *cm.Listener
	for l == nil { // the device's address can take a moment to come back
		var err error
		if l, err = cm.Listen(ctx, addr); err != nil {
			if ctx.Err() != nil {
				fmt.Println("listening on the device put back:", err)
				return 1
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	defer l.Close()
	accepted := make(chan *endpoint.Endpoint, 1)
	go func() {
		ep, _ := l.Accept(ctx)
		accepted <- ep
	}()
	dialed, err := cm.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println("dialing on the device put back:", err)
		return 1
	}
	ep := <-accepted
	if err := errors.Join(dialed.Close(), ep.Close()); err != nil {
		fmt.Println("closing:", err)
		return 1
	}
	return 0
}

// child is the process the device is removed under: it sets up its
// connections and listeners, says "ready", and reports each check that
// fails as a line starting with FAIL. It exits 1 if one did.
func child() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	failed := false
	check := func(ok bool, format string, args ...any) {
		if !ok {
			failed = true
			fmt.Printf("FAIL: "+format+"\n", args...)
		}
	}
	removedErr := func(what string, err error) {
		check(errors.Is(err, cm.ErrDeviceRemoved), "%s: %v, want cm.ErrDeviceRemoved", what, err)
	}
	// Both ends of a connection are on the removed device: one may hear
	// that its peer disconnected before it hears of the removal, but the
	// kernel tells one of them first.
	pairRemoved := func(what string, errs ...error) {
		removed := 0
		for _, err := range errs {
			check(errors.Is(err, cm.ErrDeviceRemoved) || errors.Is(err, cm.ErrPeerDisconnected),
				"%s: %v, want cm.ErrDeviceRemoved or cm.ErrPeerDisconnected", what, err)
			if errors.Is(err, cm.ErrDeviceRemoved) {
				removed++
			}
		}
		check(removed > 0, "%s: neither end saw cm.ErrDeviceRemoved: %v", what, errs)
	}
	must := func(err error) {
		if err != nil {
			fmt.Println("FAIL: setting up:", err)
			os.Exit(1)
		}
	}
	addr := net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0")

	// A cm connection, and its listener waiting in Accept.
	cl, err := cm.Listen(ctx, addr)
	must(err)
	accepted := make(chan *endpoint.Endpoint, 1)
	go func() {
		ep, _ := cl.Accept(ctx)
		accepted <- ep
	}()
	dialed, err := cm.Dial(ctx, cl.Addr().String())
	must(err)
	server := <-accepted
	cmAccept := make(chan error, 1)
	go func() {
		_, err := cl.Accept(ctx)
		cmAccept <- err
	}()

	// A msg connection with a reader waiting on each side, and its
	// listener waiting in Accept.
	ml, err := msg.Listen(ctx, addr)
	must(err)
	mc, err := msg.Dial(ctx, ml.Addr().String())
	must(err)
	ms, err := ml.Accept(ctx)
	must(err)
	received := make(chan error, 2)
	for _, c := range []*msg.Conn{mc, ms} {
		go func() {
			_, err := c.Recv(ctx)
			received <- err
		}()
	}
	msgAccept := make(chan error, 1)
	go func() {
		_, err := ml.Accept(ctx)
		msgAccept <- err
	}()

	// A msg listener on every address, waiting in Accept.
	wl, err := msg.Listen(ctx, ":0")
	must(err)
	wildAccept := make(chan error, 1)
	go func() {
		_, err := wl.Accept(ctx)
		wildAccept <- err
	}()

	// net/http serving on an rdmanet listener.
	rl, err := rdmanet.Listen(ctx, addr)
	must(err)
	srv := &http.Server{Handler: http.NotFoundHandler()}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(rl) }()

	// A datagram Conn with a reader waiting (iWARP has none: dgram
	// refuses it).
	dc, err := dgram.Listen(ctx, addr)
	dgramRead := make(chan error, 1)
	if err == nil {
		go func() {
			_, _, err := dc.ReadFrom(make([]byte, 64))
			dgramRead <- err
		}()
	} else if !rxetest.IWARP() || !errors.Is(err, dgram.ErrNoIWARP) {
		must(err)
	}

	fmt.Println("ready")
	wait := func(what string, ch <-chan error) error {
		select {
		case err := <-ch:
			return err
		case <-time.After(removalBound):
			return fmt.Errorf("%s still waiting %v after the removal", what, removalBound)
		}
	}
	var ended []error
	for _, ep := range []*endpoint.Endpoint{dialed, server} {
		select {
		case <-ep.Done():
			ended = append(ended, ep.Err())
		case <-time.After(removalBound):
			check(false, "a cm endpoint: not done %v after the removal", removalBound)
		}
	}
	pairRemoved("a cm connection's endpoints' Err", ended...)
	pairRemoved("a msg connection's Recv", wait("a msg Recv", received), wait("a msg Recv", received))
	removedErr("cm.Listener.Accept", wait("cm.Listener.Accept", cmAccept))
	removedErr("msg.Listener.Accept", wait("msg.Listener.Accept", msgAccept))
	select {
	case err := <-wildAccept:
		check(false, "a wildcard msg.Listener.Accept: %v, want it waiting: it is bound to no device", err)
	default:
		check(wl.Close() == nil, "closing the wildcard msg.Listener")
		err := wait("a wildcard msg.Listener.Accept, after its Close", wildAccept)
		check(errors.Is(err, net.ErrClosed), "a wildcard msg.Listener.Accept, after its Close: %v, want net.ErrClosed", err)
	}
	removedErr("http.Server.Serve on rdmanet", wait("http.Server.Serve", served))

	if dc != nil {
		removedErr("a dgram ReadFrom", wait("a dgram ReadFrom", dgramRead))
		_, err = dc.WriteTo([]byte("after"), dc.LocalAddr())
		removedErr("a dgram WriteTo", err)
		_, err = dc.Resolve(ctx, dc.LocalAddr().String())
		removedErr("a dgram Resolve", err)
		check(dc.Close() == nil, "closing the dgram Conn")
	}

	_, err = cm.Dial(ctx, cl.Addr().String())
	check(errors.Is(err, syscall.ENODEV), "a new Dial: %v, want ENODEV", err)
	_, err = cm.Listen(ctx, addr)
	check(errors.Is(err, syscall.ENODEV), "a new Listen: %v, want ENODEV", err)

	closed := make(chan error, 1)
	go func() {
		closed <- errors.Join(dialed.Close(), server.Close(), mc.Close(), ms.Close(),
			ml.Close(), cl.Close(), srv.Close())
	}()
	select {
	case err := <-closed:
		check(err == nil, "closing: %v", err)
	case <-time.After(removalBound):
		check(false, "closing: not done %v after it began", removalBound)
	}
	cancel()
	check(goleak.Find() == nil, "goroutines left: %v", goleak.Find())
	if failed {
		return 1
	}
	return 0
}
