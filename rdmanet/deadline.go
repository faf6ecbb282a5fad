package rdmanet

import (
	"context"
	"sync"
	"time"
)

// deadline is one direction's deadline, as a context that ends when the
// deadline passes. Moving a deadline that has not passed keeps the context,
// so pending calls wait on until the new time; once it passed, setting a
// new one (or none) gives later calls a fresh context.
type deadline struct {
	mu      sync.Mutex
	ctx     context.Context
	cancel  context.CancelFunc
	timer   *time.Timer
	gen     uint64 // which set armed timer; a late timer of an older set does nothing
	expired bool
	stopped bool // the connection is closed: set arms nothing
}

func (d *deadline) init() { d.ctx, d.cancel = context.WithCancel(context.Background()) }

// context is what a call waits on.
func (d *deadline) context() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctx
}

// set moves the deadline to t; the zero t means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	d.disarm()
	if !t.IsZero() && !t.After(time.Now()) {
		d.expire()
		return
	}
	if d.expired {
		d.ctx, d.cancel = context.WithCancel(context.Background())
		d.expired = false
	}
	if t.IsZero() {
		return
	}
	gen := d.gen
	d.timer = time.AfterFunc(time.Until(t), func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gen == gen {
			d.expire()
		}
	})
}

// stop disarms the timer for good (the connection is closed).
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	d.disarm()
}

// disarm stops the armed timer, if any; d.mu is held.
func (d *deadline) disarm() {
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
}

// expire ends the context; d.mu is held.
func (d *deadline) expire() {
	if !d.expired {
		d.cancel()
		d.expired = true
	}
}
