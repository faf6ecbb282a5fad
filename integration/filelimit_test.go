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

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// TestFileLimitFailsConnectionsCleanly: a process at its limit of open
// files (RLIMIT_NOFILE, as a busy service can be) cannot open a
// connection's completion channel, or the duplicate of it that Go's
// netpoller watches. With the limit set so that no more files can be
// opened, then one more, and so on until a connection is made, each cm
// dial and accept, and each msg dial and accept, that fails does so with
// an error matching syscall.EMFILE and leaves the device and the
// process's open files as they were. A listener whose side met the limit
// rejects its dialer, warns its logger, and serves the next dialer. The
// sweep must meet the duplicate's failure on both sides: no injected
// fault reaches that step.
func TestFileLimitFailsConnectionsCleanly(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)

	t.Run("CM", func(t *testing.T) {
		var log lockedBuffer
		l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithLogger(zerolog.New(&log)))
		require.NoError(t, err)
		defer l.Close()
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		accepted := make(chan acceptance, 1)
		go func() {
			ep, err := l.Accept(actx)
			accepted <- acceptance{ep, err}
		}()
		var dialed *endpoint.Endpoint
		sweepFileLimit(t, &log, func() (err error) {
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
		l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), msg.WithLogger(zerolog.New(&log)))
		require.NoError(t, err)
		defer l.Close()
		var dialed *msg.Conn
		sweepFileLimit(t, &log, func() (err error) {
			dialed, err = msg.Dial(ctx, l.Addr().String())
			return err
		})
		accepted, err := l.Accept(ctx)
		require.NoError(t, err, "the connection made once the limit allowed it")
		require.NoError(t, dialed.Close())
		require.NoError(t, accepted.Close())
		requireListenerServes(t, ctx, l)
	})
}

// sweepFileLimit runs dial with the process allowed no more open files,
// then one more, and so on, until it succeeds. Each dial that fails must
// fail for want of a file: its own (EMFILE), or, where it was rejected,
// its listener's, which must warn of it in log. Each must leave the
// device and the process's open files as it found them. The sweep must
// meet the duplicate of a completion channel (fdwait's) failing on the
// dialer's side and on the listener's.
func sweepFileLimit(t *testing.T, log *lockedBuffer, dial func() error) {
	t.Helper()
	const dupFailure = "fdwait: dup completion channel"
	var dialerDup, listenerDup bool
	for spare := 0; ; spare++ {
		require.Less(t, spare, 16, "no dial succeeded with room for more files")
		before := currentDeviceState(t)
		from := len(log.String())
		err := withFileLimit(t, spare, dial)
		if err == nil {
			break
		}
		t.Logf("room for %d more files: %v", spare, err)
		if _, rejected := errors.AsType[*cm.RejectError](err); rejected {
			loggedRefusal(t, log, from, syscall.EMFILE)
			listenerDup = listenerDup || strings.Contains(log.String()[from:], dupFailure)
		} else {
			require.ErrorIs(t, err, syscall.EMFILE, "with room for %d more files", spare)
			dialerDup = dialerDup || strings.Contains(err.Error(), dupFailure)
		}
		require.Equal(t, before, currentDeviceState(t), "what the failed dial made is still there (room for %d more files)", spare)
	}
	require.True(t, dialerDup, "no dial failed to duplicate its completion channel")
	require.True(t, listenerDup, "no accept failed to duplicate its completion channel")
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
