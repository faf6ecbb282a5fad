package endpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// closingWait bounds each wait on the completion channel once Close has
// begun: flushed completions raise an event too, and the bound only covers
// a lost one.
const closingWait = 10 * time.Millisecond

// waitEvent arms the CQ, polls it once more (a completion that arrived
// before the arm raises no event) and, when that finds nothing, waits for
// the completion channel's next event until deadline (zero: none). The
// caller holds poller.role: a caller of Next (forCaller, waiting until ctx
// ends or, in handler mode, progress moves from since) or the completion
// goroutine, which does not wait while a caller of Next wants the role.
// It returns the poll's result; err is the wait's (os.ErrDeadlineExceeded
// when it was cut short, which the caller sorts out).
func (ep *Endpoint) waitEvent(ctx context.Context, forCaller bool, since uint64, deadline time.Time) (n int, c Completion, handed bool, err error) {
	if err := ep.cq.ReqNotify(false); err != nil {
		// An unarmed CQ raises no event however many completions come:
		// the wait could never end.
		return 0, Completion{}, false, fmt.Errorf("arming the CQ: %w", err)
	}
	if n, c, handed = ep.pollFor(forCaller); n > 0 {
		return n, c, handed, nil
	}
	p := &ep.poller
	p.deadlineMu.Lock()
	if p.closing {
		if short := time.Now().Add(closingWait); deadline.IsZero() || deadline.After(short) {
			deadline = short
		}
	}
	if !deadline.Equal(p.deadline) {
		ep.wait.SetDeadline(deadline)
		p.deadline = deadline
	}
	// Looked at after the deadline is set, under deadlineMu: whoever
	// comes later to cut this wait short finds it started. A caller of
	// Next does not wait when a completion is in the channel already
	// (another goroutine polled, or the delivery goroutine caught up).
	var skip bool
	if forCaller {
		skip = ctx.Err() != nil || len(ep.queue.out) > 0 || p.progress.Load() != since
		p.callerWaiting = !skip
	} else {
		skip = p.callers.Load() > 0
		p.loopWaiting = !skip
	}
	p.deadlineMu.Unlock()
	if skip {
		return 0, Completion{}, false, nil
	}
	if err = ep.wait.Wait(); err == nil && p.takeErr != nil {
		err, p.takeErr = p.takeErr, nil
	}
	p.deadlineMu.Lock()
	p.loopWaiting, p.callerWaiting = false, false
	p.deadlineMu.Unlock()
	if p.unacked >= ackBatch {
		ep.cq.AckEvents(p.unacked)
		p.unacked = 0
	}
	return 0, Completion{}, false, err
}

// checkWait sorts out a wait's error: a deadline is the waiters' own
// business; anything else means the completion channel failed (its read,
// or arming the CQ), and the endpoint closes (true) rather than wait on it
// again: nobody waits on it from then on (channelFailed).
func (ep *Endpoint) checkWait(err error) bool {
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	ep.poller.channelFailed.Store(true)
	ep.failHere("waiting on the completion channel", err)
	return true
}

// cutWaitShort makes the current wait on the completion channel return
// now. deadlineMu is held.
func (p *cqPoller) cutWaitShort(ep *Endpoint) {
	ep.wait.SetDeadline(pastTime)
	p.deadline = pastTime
}

// interruptWait cuts short the current wait on the completion channel if
// it is the completion goroutine's (loop) or a caller of Next's (!loop).
// A caller of Next that wants the role asks the completion goroutine for
// it this way; whoever puts completions in the channel, other than a
// caller holding the role, makes a waiting holder look there.
func (ep *Endpoint) interruptWait(loop bool) {
	p := &ep.poller
	p.deadlineMu.Lock()
	if loop && p.loopWaiting || !loop && p.callerWaiting {
		p.cutWaitShort(ep)
	}
	p.deadlineMu.Unlock()
}

// holdRole records that a caller of Next took the role, and makes the end
// of its context cut its waits short.
func (ep *Endpoint) holdRole(ctx context.Context) {
	p := &ep.poller
	p.deadlineMu.Lock()
	defer p.deadlineMu.Unlock()
	done := ctx.Done()
	p.callerHolds, p.holderDone = true, done
	if done != nil && done != p.watched {
		if p.stopWatch != nil {
			p.stopWatch()
		}
		p.watched = done
		p.stopWatch = context.AfterFunc(ctx, func() { ep.contextEnded(done) })
	}
}

// releaseRole gives back a caller of Next's role.
func (p *cqPoller) releaseRole() {
	p.deadlineMu.Lock()
	p.callerHolds, p.holderDone = false, nil
	p.deadlineMu.Unlock()
	<-p.role
}

// contextEnded cuts short the wait of a caller of Next whose context
// closed done.
func (ep *Endpoint) contextEnded(done <-chan struct{}) {
	p := &ep.poller
	p.deadlineMu.Lock()
	defer p.deadlineMu.Unlock()
	if p.callerHolds && p.holderDone == done {
		p.cutWaitShort(ep)
	}
	if p.watched == done {
		p.watched, p.stopWatch = nil, nil
	}
}

// unwatch drops the context registration when the endpoint is torn down,
// so that a long-lived context does not keep the endpoint alive.
func (p *cqPoller) unwatch() {
	p.deadlineMu.Lock()
	defer p.deadlineMu.Unlock()
	if p.stopWatch != nil {
		p.stopWatch()
	}
	p.watched, p.stopWatch = nil, nil
}

// wakeWaiters is Close's: every wait from now on is short, and the one in
// progress ends now.
func (ep *Endpoint) wakeWaiters() {
	p := &ep.poller
	p.deadlineMu.Lock()
	p.closing = true
	p.cutWaitShort(ep)
	p.deadlineMu.Unlock()
}

func (p *cqPoller) isClosing() bool {
	p.deadlineMu.Lock()
	defer p.deadlineMu.Unlock()
	return p.closing
}
