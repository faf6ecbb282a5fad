package integration

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// TestFileLimitFailsConnectionsCleanly: a process at its limit of open
// files (RLIMIT_NOFILE, as a busy service can be) cannot open the event
// channel librdmacm gives a listener's id while it binds, a connection's
// completion channel, or the duplicate of a channel that Go's netpoller
// watches. With the limit set so that no more files can be opened, then
// one more, and so on until the call works, each cm, msg and dgram
// Listen, each cm and msg dial and accept, each bufpool.OpenPD (which
// binds an id to find its device) and each dgram Dial that fails
// does so with an error matching syscall.EMFILE (not librdmacm's ENOMEM)
// and leaves the device and the process's open files as they were. A
// listener whose side met the limit rejects its dialer, warns its logger,
// and serves the next dialer. The sweeps must meet the duplicate's
// failure: no injected fault reaches that step.
func TestFileLimitFailsConnectionsCleanly(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	addr := net.JoinHostPort(rxetest.Addr(t), "0")

	t.Run("CM", func(t *testing.T) {
		var log lockedBuffer
		var l *cm.Listener
		openAtFileLimit(t, "cm.Listen", func() (err error) {
			l, err = cm.Listen(ctx, addr, cm.WithLogger(zerolog.New(&log)))
			return err
		})
		defer l.Close()
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		accepted := acceptInBackground(actx, l)
		var dialed *endpoint.Endpoint
		dialAtFileLimit(t, &log, func() (err error) {
			dialed, err = cm.Dial(ctx, l.Addr().String())
			return err
		})
		a := <-accepted
		require.NoError(t, a.err)
		closeAndDrain(t, dialed)
		closeAndDrain(t, a.ep)
	})

	t.Run("Msg", func(t *testing.T) {
		var log lockedBuffer
		var l *msg.Listener
		openAtFileLimit(t, "msg.Listen", func() (err error) {
			l, err = msg.Listen(ctx, addr, msg.WithLogger(zerolog.New(&log)))
			return err
		})
		defer l.Close()
		var dialed *msg.Conn
		dialAtFileLimit(t, &log, func() (err error) {
			dialed, err = msg.Dial(ctx, l.Addr().String())
			return err
		})
		accepted, err := l.Accept(ctx)
		require.NoError(t, err, "the connection made once the limit allowed it")
		require.NoError(t, dialed.Close())
		require.NoError(t, accepted.Close())
		requireListenerServes(t, ctx, l)
	})

	t.Run("OpenPD", func(t *testing.T) {
		var pd *bufpool.PD
		openAtFileLimit(t, "bufpool.OpenPD", func() (err error) {
			pd, err = bufpool.OpenPD(ctx, rxetest.Addr(t))
			return err
		})
		require.NoError(t, pd.Close())
	})

	t.Run("Dgram", func(t *testing.T) {
		srv := listenDgram(t, ctx)
		if srv == nil {
			return // iWARP: listenDgram asserted dgram's typed refusal
		}
		// A Conn opens a CM event channel and two completion channels,
		// each with its duplicate.
		var listened, dialed *dgram.Conn
		dups := openAtFileLimit(t, "dgram.Listen", func() (err error) {
			listened, err = dgram.Listen(ctx, addr)
			return err
		})
		defer listened.Close()
		require.NotZero(t, dups, "no dgram.Listen failed to duplicate a channel")
		to, err := listened.Resolve(ctx, srv.LocalAddr().String())
		require.NoError(t, err)
		sendDatagram(t, listened, to, srv, "from a Conn listened at the limit")

		dups = openAtFileLimit(t, "dgram.Dial", func() (err error) {
			dialed, err = dgram.Dial(ctx, srv.LocalAddr().String())
			return err
		})
		defer dialed.Close()
		require.NotZero(t, dups, "no dgram.Dial failed to duplicate a channel")
		sendDatagram(t, dialed, dialed.RemoteAddr(), srv, "from a Conn dialed at the limit")
	})
}

// openAtFileLimit sweeps open across the open-file limit
// (sweepFileLimit): each failure must match syscall.EMFILE. It returns
// how many of them were a channel's duplicate for the netpoller.
func openAtFileLimit(t *testing.T, name string, open func() error) (dups int) {
	t.Helper()
	sweepFileLimit(t, open, func(spare int, err error) {
		require.ErrorIs(t, err, syscall.EMFILE, "%s with room for %d more files", name, spare)
		if strings.Contains(err.Error(), "fdwait: dup") {
			dups++
		}
	})
	return dups
}

// dialAtFileLimit sweeps dial across the open-file limit
// (sweepFileLimit). Each dial that fails must fail for want of a file:
// its own (EMFILE), or, where it was rejected, its listener's, which must
// warn of it in log. The sweep must meet the duplicate of a completion
// channel (fdwait's) failing on the dialer's side and on the listener's.
func dialAtFileLimit(t *testing.T, log *lockedBuffer, dial func() error) {
	t.Helper()
	const dupFailure = "fdwait: dup completion channel"
	var dialerDup, listenerDup bool
	from := 0
	sweepFileLimit(t, func() error {
		from = len(log.String())
		return dial()
	}, func(spare int, err error) {
		if _, rejected := errors.AsType[*cm.RejectError](err); rejected {
			loggedRefusal(t, log, from, syscall.EMFILE)
			listenerDup = listenerDup || strings.Contains(log.String()[from:], dupFailure)
			return
		}
		require.ErrorIs(t, err, syscall.EMFILE, "with room for %d more files", spare)
		dialerDup = dialerDup || strings.Contains(err.Error(), dupFailure)
	})
	require.True(t, dialerDup, "no dial failed to duplicate its completion channel")
	require.True(t, listenerDup, "no accept failed to duplicate its completion channel")
}

// sweepFileLimit runs attempt with the process allowed no more open
// files, then one more, and so on, until it succeeds. check judges each
// failure, once what the attempt set off has ended; then the device and
// the process's open files must be as they were before the attempt.
func sweepFileLimit(t *testing.T, attempt func() error, check func(spare int, err error)) {
	t.Helper()
	for spare := 0; ; spare++ {
		require.Less(t, spare, 16, "no attempt succeeded with room for more files")
		before := currentDeviceState(t)
		err := withFileLimit(t, spare, attempt)
		if err == nil {
			return
		}
		t.Logf("room for %d more files: %v", spare, err)
		check(spare, err)
		require.Equal(t, before, currentDeviceState(t), "what the failed attempt made is still there (room for %d more files)", spare)
	}
}

// withFileLimit runs f with the process's soft limit of open files
// (RLIMIT_NOFILE) lowered so that only the spare lowest free descriptor
// numbers can be opened, and restores it. The limit bounds the numbers,
// not their count: a descriptor closed below it is free to open again.
func withFileLimit(t *testing.T, spare int, f func() error) error {
	t.Helper()
	var limit syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit))
	lowered := limit
	lowered.Cur = uint64(nthFreeDescriptor(spare))
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered))
	defer func() { require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit)) }()
	return f()
}

// nthFreeDescriptor is the n-th lowest descriptor number that is not open
// (from 0), found without opening one.
func nthFreeDescriptor(n int) int {
	for fd := 0; ; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); errors.Is(err, unix.EBADF) {
			if n == 0 {
				return fd
			}
			n--
		}
	}
}
