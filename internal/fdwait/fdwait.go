// Package fdwait waits for a C library's file descriptor (a CM event
// channel, a completion channel) on Go's netpoller, so that waiting costs a
// parked goroutine, never an OS thread blocked in C, and so that Close and
// deadlines wake the waiter.
package fdwait

import (
	"errors"
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

// ErrBlocking refuses a descriptor without O_NONBLOCK: the netpoller
// cannot watch it, and try's read would block a thread.
var ErrBlocking = errors.New("fdwait: the descriptor is not non-blocking")

// New watches fd for readability. fd must be non-blocking already, as the
// C library's non-blocking read needs it to be (the dup shares its status
// flags, so looking at them again would cost a system call for each
// connection). try does the non-blocking read itself (through the C
// library) and returns false when it found nothing (EAGAIN). name appears
// in errors.
func New(fd int, name string, try func() bool) (*Waiter, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fdwait: dup %s: %w", name, err)
	}
	f := os.NewFile(uintptr(nfd), name) // reads the flags: pollable only if non-blocking
	if err := f.SetReadDeadline(time.Time{}); errors.Is(err, os.ErrNoDeadline) {
		f.Close()
		return nil, fmt.Errorf("fdwait: %s: %w", name, ErrBlocking)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Waiter{f: f, rc: rc, try: func(uintptr) bool { return try() }}, nil
}

// Wait calls try until it returns true, parking on the netpoller while the
// descriptor is not readable. It returns os.ErrDeadlineExceeded after
// SetDeadline's time and another error after Close.
func (w *Waiter) Wait() error { return w.rc.Read(w.try) }

// SetDeadline makes Wait return at t; a time in the past wakes it now.
func (w *Waiter) SetDeadline(t time.Time) error { return w.f.SetReadDeadline(t) }

// Close wakes any Wait and closes the dup.
func (w *Waiter) Close() error { return w.f.Close() }
