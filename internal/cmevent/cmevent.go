// Package cmevent reads rdma_cm event channels on Go's netpoller: a
// channel's fd is non-blocking and waited on through a dup, so a goroutine
// waiting for a CM event parks, never an OS thread in C. A Channel is one
// id's own (package dgram); a Queue is one id's share of the channel the
// process's connected ids have in common (package cm).
package cmevent

import (
	"context"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/internal/fdwait"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

var pastTime = time.Unix(1, 0)

// Channel is one CM event channel and the netpoller wait on it. One
// goroutine at a time reads it.
type Channel struct {
	EC   *verbs.EventChannel
	wait *fdwait.Waiter
	// what the last take found
	ev     *verbs.Event
	getErr error
}

// New creates a channel.
func New() (*Channel, error) {
	ch, err := verbs.NewEventChannel()
	if err != nil {
		return nil, err
	}
	c := &Channel{EC: ch}
	if c.wait, err = fdwait.New(ch.Fd(), "rdma_cm event channel", c.take); err != nil {
		ch.Destroy()
		return nil, err
	}
	return c, nil
}

// take is the non-blocking read fdwait calls: false when no event is pending.
func (c *Channel) take() bool {
	c.ev, c.getErr = c.EC.GetEvent()
	return c.getErr != syscall.EAGAIN
}

// Next returns the next event, waiting until ctx ends or StopWaiting. The
// caller acks it.
func (c *Channel) Next(ctx context.Context) (*verbs.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	c.wait.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.wait.SetDeadline(pastTime) })
	defer stop()
	if err := c.wait.Wait(); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return c.taken()
}

// taken hands over what the last successful Wait's take found.
func (c *Channel) taken() (*verbs.Event, error) {
	ev, err := c.ev, c.getErr
	c.ev, c.getErr = nil, nil
	return ev, err
}

// StopWaiting makes a Next in progress, and every later one, fail with an
// error matching os.ErrClosed. The channel itself stays until Destroy.
func (c *Channel) StopWaiting() error { return c.wait.Close() }

// Destroy stops waiting and frees the channel; every id on it must be
// destroyed first.
func (c *Channel) Destroy() {
	c.wait.Close()
	c.EC.Destroy()
}

// ResolveTimeout is a resolution step's timeout in ms for
// rdma_resolve_addr and rdma_resolve_route: def, or what is left of ctx if
// that is sooner (at least 1).
func ResolveTimeout(ctx context.Context, def time.Duration) int {
	d := def
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		d = time.Until(dl)
	}
	return max(1, int(d/time.Millisecond))
}
