// Package fdwait waits for a C library's file descriptor (a CM event
// channel, a completion channel) on Go's netpoller, so that waiting costs a
// parked goroutine, never an OS thread blocked in C, and so that Close and
// deadlines wake the waiter.
package fdwait

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Waiter watches a dup of a descriptor; the original stays owned by the C
// library, which closes it itself.
type Waiter struct {
	f   *os.File
	rc  syscall.RawConn
	try func(uintptr) bool // built once: Wait allocates nothing
}

// New watches fd for readability. try does the non-blocking read itself
// (through the C library) and returns false when it found nothing (EAGAIN).
// name appears in errors.
func New(fd int, name string, try func() bool) (*Waiter, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fdwait: dup %s: %w", name, err)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return nil, fmt.Errorf("fdwait: non-blocking %s: %w", name, err)
	}
	f := os.NewFile(uintptr(nfd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Waiter{f: f, rc: rc, try: func(uintptr) bool { return try() }}, nil
}

// Wait calls try until it returns true, parking on the netpoller while the
// descriptor is not readable. It returns os.ErrDeadlineExceeded after
// SetDeadline's time and an error matching os.ErrClosed after Close.
func (w *Waiter) Wait() error { return w.rc.Read(w.try) }

// SetDeadline makes Wait return at t; a time in the past wakes it now.
func (w *Waiter) SetDeadline(t time.Time) error { return w.f.SetReadDeadline(t) }

// Close wakes any Wait and closes the dup.
func (w *Waiter) Close() error { return w.f.Close() }
