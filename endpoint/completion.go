package endpoint

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

var pastTime = time.Unix(1, 0)

// closeQuiet is how long Close waits for the next flushed completion once
// the QP is in the error state. The device flushes what it was given at
// once; what is still owed after a quiet spell was posted after the QP
// failed into a queue the device never looks at again (a receive reposted
// on siw after the peer's close), and would hold Close for CloseTimeout.
const closeQuiet = 100 * time.Millisecond

// ackBatch: CQ events are acked in batches (ibv_ack_cq_events takes a mutex).
const ackBatch = 64

// pollLoop is the completion goroutine: it drains the CQ in batches, re-arms
// it, polls once more to close the race between the last poll and the arm,
// and sleeps on the completion channel through the netpoller. While callers
// of Next poll or wait themselves, it stands aside. After Close it collects
// the flushed work requests and tears the verbs objects down.
func (ep *Endpoint) pollLoop() {
	defer close(ep.pollDone)
	var closeDeadline, quietSince time.Time
	lastWork := time.Now()
	p := &ep.poller
	for {
		n := ep.poll()
		if n > 0 && ep.mode == PollHybrid { // only hybrid needs the clock (nanotime is dear under emulation)
			lastWork = time.Now()
		}
		closing, owed := ep.closingState()
		if closing {
			now := time.Now()
			if closeDeadline.IsZero() {
				closeDeadline = now.Add(ep.cfg.CloseTimeout)
			}
			if n > 0 || quietSince.IsZero() && ep.qpFailed.Load() {
				quietSince = now
			}
			if !owed || now.After(closeDeadline) || !quietSince.IsZero() && now.Sub(quietSince) > closeQuiet {
				break
			}
		}
		switch {
		case n > 0:
			continue
		case !closing && p.callersPolling():
			// Callers of Next poll the CQ or wait on its channel in
			// their own goroutines: a second poller would only take
			// the CPU from them, a second waiter cannot wait.
			p.standAside()
			continue
		case !closing && ep.spinsInBackground() && (ep.mode == PollBusy ||
			ep.mode == PollHybrid && time.Since(lastWork) < ep.cfg.Spin):
			// Spin, but let the goroutines that consume and post run:
			// with few cores a tight loop would starve them until preempted.
			runtime.Gosched()
			continue
		}
		if p.channelFailed.Load() {
			// The close failHere began collects the flushes by polling,
			// at the pace of the closing waits this replaces.
			time.Sleep(closingWait)
			continue
		}
		if closing {
			p.role <- struct{}{} // a caller of Next that holds it sees Close and gives it back
		} else {
			select {
			case p.role <- struct{}{}:
			default: // a caller of Next waits on the channel
				p.standAside()
				continue
			}
		}
		n, _, _, werr := ep.waitEvent(context.Background(), false, 0, time.Time{})
		<-p.role
		if n > 0 && ep.mode == PollHybrid {
			lastWork = time.Now()
		}
		ep.checkWait(werr)
	}
	p.role <- struct{}{}
	ep.cq.AckEvents(p.unacked)
	p.unacked = 0
	<-p.role
	p.unwatch()
	ep.teardown()
}

// spinsInBackground says whether the completion goroutine polls in the
// endpoint's mode (busy, hybrid) when no caller polls. In handler mode it
// does only while a goroutine waits for a completion it does not poll for
// (seam.Kick): those who wait for completions spin for them themselves
// (seam.Progress), and between their waits the completions of a busy or
// hybrid endpoint wake the completion goroutine through the channel, as
// in event mode. A spinner that nobody waits for would take a core from
// the goroutines that copy and post, and from the device's own work on a
// software device; an idle connection would keep a core busy.
func (ep *Endpoint) spinsInBackground() bool {
	return ep.handle == nil || ep.poller.waiting.Load() > 0
}

// takeEvent takes one event from the completion channel for fdwait: false
// when there is none yet. A read that fails ends the wait too, and
// waitEvent returns its error: waiting again would find the channel
// readable and fail again, a spin that never ends the endpoint. Only the
// holder of poller.role calls it.
func (ep *Endpoint) takeEvent() bool {
	switch err := ep.ch.GetEvent(); err {
	case syscall.EAGAIN:
		return false
	case nil:
		ep.poller.unacked++
		ep.poller.events.Add(1)
	default:
		ep.poller.takeErr = err
	}
	return true
}

// startClosing starts closing with cause (closedHere): first the waiters'
// flag (wakeWaiters), then the completion goroutine's (ep.closing), in that
// order. The first cause holds; first says whether it is this call's. The
// completion goroutine acks the CQ events taken so far once it sees
// ep.closing and nothing is owed, and lets go of the role; a caller of Next
// that then took the role and an event would leave it unacked, and
// destroying the CQ would wait for that ack forever. Callers look at their
// flag before each wait, so with it set first, none waits once the acks
// are final.
func (ep *Endpoint) startClosing(cause error) (first bool) {
	first = ep.closedBy.CompareAndSwap(nil, &cause)
	ep.wakeWaiters()
	ep.mu.Lock()
	ep.closing = true
	if ep.failing != nil {
		ep.failing.Stop() // Close's own end comes first
	}
	ep.mu.Unlock()
	return first
}

// closingState says whether the endpoint is closing, and whether the
// device still owes a completion: for a receive, or for a signaled send
// (which brings back the unsignaled ones before it). Nothing is owed for
// the unsignaled sends after the last signaled one: they may have finished
// without a completion, and teardown completes them with ErrClosed once
// the QP is destroyed (waiting for them would take the whole close timeout).
func (ep *Endpoint) closingState() (closing, owed bool) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.recvs.inUse() > 0 {
		return ep.closing, true
	}
	f := &ep.sendFIFO
	for i := range f.count {
		if ep.sends.slots[f.buf[(f.head+i)%len(f.buf)]].signaled {
			return ep.closing, true
		}
	}
	return ep.closing, false
}

// poll drains the CQ unless it is destroyed and returns how many work
// completions it found. The completion goroutine and callers of Next both
// poll; pollMu keeps them off the CQ (and its reused completion array) at
// the same time. A failing CQ closes the endpoint.
func (ep *Endpoint) poll() int {
	n, _, _ := ep.pollFor(false)
	return n
}

// pollFor is poll for a caller of Next (want): when nothing precedes the
// first new completion in the stream, it is returned (handed) instead of
// going to the channel, which spares the caller a channel round trip.
func (ep *Endpoint) pollFor(want bool) (n int, c Completion, handed bool) {
	ep.poller.mu.Lock()
	var err error
	if !ep.poller.gone {
		n, handed, err = ep.drain(want)
		if handed {
			c, ep.queue.handOff = ep.queue.handOff, Completion{}
		}
	}
	ep.poller.mu.Unlock()
	if err != nil {
		ep.failHere("polling the CQ", err)
		ep.poller.wake()
	}
	return n, c, handed
}

// drain polls the CQ until a poll returns less than a full batch and
// queues a Completion for every work request that finished, including the unsignaled sends a
// signaled completion stands for; with want, the first of them goes to
// queue.handOff when it can (handed). pollMu is held.
func (ep *Endpoint) drain(want bool) (total int, handed bool, err error) {
	retries := 0
	if want {
		retries = pollsPerCall - 1 // the caller spins anyway
	}
	for {
		n, err := ep.cq.PollRetry(retries)
		retries = 0 // after completions, only what else is there
		if err != nil || n == 0 {
			return total, handed, err
		}
		total += n
		ep.mu.Lock()
		ep.queue.mu.Lock()
		ep.queue.handWanted = want && !handed
		for i := range n {
			ep.complete(ep.cq.At(i))
		}
		handed = handed || want && !ep.queue.handWanted
		ep.queue.handWanted = false
		notify := len(ep.queue.items) > 0
		sent := ep.queue.sent
		ep.queue.sent = false
		notified := ep.notified
		ep.notified = false
		ep.queue.mu.Unlock()
		ep.mu.Unlock()
		if notify {
			ep.queue.notify()
		}
		if sent {
			ep.interruptWait(false)
		}
		if len(ep.handled) > 0 || notified {
			ep.runHandler()
			handed = handed || want
		}
		if n < ep.cq.Batch() {
			// The CQ was empty after these: another poll now would
			// most likely find nothing, and it costs a cgo call.
			return total, handed, nil
		}
	}
}

// complete turns one work completion into Completions; ep.mu and
// ep.queue.mu are held.
func (ep *Endpoint) complete(wc verbs.WC) {
	if wc.WRID&(recvBit|srqBit) != 0 {
		var s slot
		ok := false
		if wc.WRID&srqBit != 0 {
			s, ok = ep.srq.complete(uint32(wc.WRID &^ srqBit))
		} else if idx := uint32(wc.WRID &^ recvBit); int(idx) < len(ep.recvs.slots) && ep.recvs.slots[idx].used {
			s, ok = ep.recvs.release(idx), true
		}
		if !ok {
			ep.cfg.Logger.Error().Uint64("wr_id", wc.WRID).Msg("completion for an unknown receive")
			return
		}
		c := Completion{Context: s.ctx, Op: OpRecv, Buffer: s.buf, Len: int(wc.ByteLen), to: s.notify}
		if wc.Opcode == verbs.WCRecvRDMAWithImm {
			c.Op = OpRecvWriteImm
		}
		if wc.Flags&verbs.WCWithImm != 0 {
			c.Imm, c.HasImm = wc.Imm, true
		}
		if wc.Status != verbs.WCSuccess {
			c.Err, c.Len = ep.completionError(OpRecv, wc), 0
		}
		ep.countCompleted(c.Err)
		if c.Err == nil && !ep.gotRecv {
			ep.gotRecv = true
			close(ep.received)
		}
		ep.output(c)
		return
	}
	idx := uint32(wc.WRID)
	// A completion stands for the unsignaled requests posted before it:
	// the device has finished them. It never stands for a signaled one
	// still owed its own completion: siw completes a send or write when
	// TCP takes it, and a READ only when its response arrives, so the
	// sends after a READ complete first. Those wait for their own, in
	// order, at the head.
	owed := ep.owed[:0]
	for ep.sendFIFO.count > 0 {
		head := ep.sendFIFO.pop()
		if head != idx && ep.sends.slots[head].signaled {
			owed = append(owed, head)
			continue
		}
		s := ep.sends.release(head)
		c := Completion{Context: s.ctx, Op: s.op, Buffer: s.buf, Len: s.length, to: s.notify}
		if head == idx && wc.Status != verbs.WCSuccess {
			c.Err = ep.completionError(s.op, wc)
		}
		ep.countCompleted(c.Err)
		if !s.silent || c.Err != nil {
			ep.output(c)
		}
		if head == idx {
			break
		}
	}
	ep.sendFIFO.unpop(owed)
}

// output hands c on: to the handler (after the poll, once the locks are
// let go) in handler mode, unless it is for a request's Notify, and
// otherwise to the completion queue. A completion for a Notify in handler
// mode counts as progress too (notified), so that a goroutine that drives
// the endpoint while it waits on its Notify channel (seam.Progress) looks
// there. ep.mu and ep.queue.mu are held.
func (ep *Endpoint) output(c Completion) {
	if ep.handle != nil {
		if c.to == nil {
			ep.handled = append(ep.handled, c)
			return
		}
		ep.notified = true
	}
	ep.queue.emit(c)
}

// runHandler hands the poll's completions to the handler, in order, and
// makes callers of Progress look (signalProgress): something was handled. The holder of
// poller.mu calls it, or teardown once nothing polls.
func (ep *Endpoint) runHandler() {
	for i := range ep.handled {
		ep.handle(ep.handled[i])
		ep.handled[i] = Completion{} // drop references for the GC
	}
	ep.handled = ep.handled[:0]
	ep.signalProgress()
}

// signalProgress makes every caller of Progress in flight return: its
// mark is behind now, and a caller waiting on the channel is cut short.
func (ep *Endpoint) signalProgress() {
	ep.poller.progress.Add(1)
	ep.interruptWait(false)
}

// completionError is the error of a failed work completion. A failure
// other than a flush has moved the QP to the error state: the connection
// is over, and Done and Err say so, unless Close caused it (some devices,
// siw among them, fail the request in progress with a local error rather
// than a flush when the connection is torn down). A flush that nothing on
// this side explains (no Close, no failure, no word from the CM) says the
// same of the QP: the peer's bad request failed it here (a responder
// error), or the peer's end is still on its way; it ends the connection
// too, after a longer grace (unexplainedFlushGrace). ep.mu is held: Close
// sets closing under it before it disconnects.
func (ep *Endpoint) completionError(op Op, wc verbs.WC) error {
	err := &CompletionError{Op: op, Status: Status(wc.Status), VendorErr: wc.VendorErr}
	if ep.closing {
		err.closedBy = ep.closedHere()
	}
	if err.closedBy != nil || ep.failure != nil {
		return err
	}
	switch {
	case err.Status != StatusFlushed:
		err.local = ep.localFault()
		if ep.failing != nil {
			ep.failing.Stop() // an unexplained flush's: this failure explains it
		}
		ep.failing = time.AfterFunc(failureGrace, func() { ep.endFailed(err) })
		ep.failure = err
	case ep.failing == nil && !ep.ended():
		// Posts are still taken: refusing them with the flush would
		// give the peer's crash on siw, whose flush comes before the
		// CM's word, a reason other than the CM's.
		ep.failing = time.AfterFunc(unexplainedFlushGrace, func() { ep.endFailed(err) })
	}
	return err
}

// endFailed ends the connection a failed work request (or an unexplained
// flush) took down, once the CM has not explained it within its grace:
// Done closes with it, and the endpoint disconnects, as it does when the
// peer leaves, so that the peer hears now and not when this side's
// application calls Close (its QP may still be in RTS: a failure the
// requester found, a local length error say, leaves the responder as it
// was).
func (ep *Endpoint) endFailed(err error) {
	ep.setDone(err)
	ep.disconnect()
}

// failureGrace is how long the CM's word on why a connection ended may lag
// the device's failure. When the peer leaves, the two race: siw flushes the
// queues, or fails the request it is sending with a local QP error, when
// the peer's close breaks its TCP connection, and reports the disconnect a
// moment later; rxe usually reports first. So a failed work request waits
// this long before it becomes the connection's end (Done, Err), for the CM
// to say why first, and a failure the CM never explains (a bad key,
// retries exhausted) ends the connection when the grace is over; and
// awaitEnd waits this long for the CM's reason for a flush or a refusal.
const failureGrace = 100 * time.Millisecond

// unexplainedFlushGrace is how long a flush nothing on this side explains
// waits for the CM's word before it ends the connection. A peer whose
// request failed (ours among them) disconnects after its own failureGrace,
// and its word takes a while more to come; a peer that never disconnects
// (a program that keeps its failed connection open) must not leave this
// side's Done open, and its posted receives waiting, for ever.
const unexplainedFlushGrace = 10 * failureGrace

// awaitEnd is seam.AwaitEnd: it waits until Done is closed, at most
// failureGrace. Without the wait, the same crash of the peer would end a
// connection with a different error on each device. When a work request
// has failed already, or a flush came that nothing explained (ep.failing),
// Done closes when that grace is over, or sooner for the CM's word or
// Close; a grace of awaitEnd's own could run out first and leave the
// caller (msg, taking a flush the failure caused) with no reason, so it
// waits for Done then, bounded only against a Done that never closes.
func (ep *Endpoint) awaitEnd() {
	if ep.ended() {
		return
	}
	grace := failureGrace
	ep.mu.Lock()
	if ep.failing != nil {
		grace = 2 * unexplainedFlushGrace
	}
	ep.mu.Unlock()
	wait := time.NewTimer(grace)
	defer wait.Stop()
	select {
	case <-ep.done:
	case <-wait.C:
	}
}

// teardown destroys the verbs objects in order (QP, CQ, channel), then
// completes whatever the device never handed back with ErrClosed: once the
// QP is destroyed the device no longer touches those buffers.
func (ep *Endpoint) teardown() {
	ep.unwatch()
	ep.qpMu.Lock()
	ep.qpDestroyed = true
	qpErr := ep.id.DestroyQP()
	ep.qpMu.Unlock()
	ep.poller.mu.Lock()
	ep.poller.gone = true
	errs := []error{qpErr, ep.cq.Destroy(), ep.wait.Close(), ep.ch.Destroy(), ep.pd.Release()}
	ep.poller.mu.Unlock()
	if ep.srq != nil {
		ep.srq.detach()
	}
	closed := ep.closedHere()
	ep.mu.Lock()
	ep.queue.mu.Lock()
	for ep.sendFIFO.count > 0 {
		s := ep.sends.release(ep.sendFIFO.pop())
		ep.output(Completion{Context: s.ctx, Op: s.op, Buffer: s.buf, Err: closed, to: s.notify})
	}
	for i := range ep.recvs.slots {
		if ep.recvs.slots[i].used {
			s := ep.recvs.release(uint32(i))
			ep.output(Completion{Context: s.ctx, Op: OpRecv, Buffer: s.buf, Err: closed, to: s.notify})
		}
	}
	ep.queue.closed = true
	close(ep.queue.ended)
	ep.queue.mu.Unlock()
	ep.mu.Unlock()
	if ep.handle != nil {
		ep.runHandler()
		if ep.handleEnd != nil {
			ep.handleEnd()
		}
	}
	ep.queue.notify()
	ep.sendBatch.Free()
	ep.recvBatch.Free()
	if ep.onClose != nil {
		errs = append(errs, ep.onClose())
	}
	ep.closeErr = errors.Join(errs...)
}

// completionQueue hands completions to Completions. A completion goes
// straight into the channel when the channel has room and nothing is queued
// before it (no goroutine hand-off); otherwise it is queued and the delivery
// goroutine sends it, so that a slow reader of Completions never stops the
// CQ from being polled (or Close from finishing).
type completionQueue struct {
	out        chan Completion
	mu         sync.Mutex
	items      []Completion
	delivering bool // the delivery goroutine holds a batch not yet sent
	// While a caller of Next polls (handWanted), emit puts a completion
	// nothing precedes in handOff instead of the channel and clears
	// handWanted. handOff belongs to the holder of Endpoint.pollMu.
	handWanted bool
	handOff    Completion
	sent       bool // emit sent to out since the poller last looked
	closed     bool
	ended      chan struct{} // closed with closed: the endpoint is torn down
	wake       chan struct{}
}

func (q *completionQueue) init(capacity int) {
	q.out = make(chan Completion, capacity)
	q.wake = make(chan struct{}, 1)
	q.ended = make(chan struct{})
}

// emit delivers c in order; q.mu is held. A completion for a request's
// Notify channel goes there at once when it has room, and otherwise
// through the delivery goroutine.
func (q *completionQueue) emit(c Completion) {
	if c.to != nil {
		to := c.to
		c.to = nil
		select {
		case to <- c:
			return
		default:
			c.to = to
			q.items = append(q.items, c)
			return
		}
	}
	if len(q.items) == 0 && !q.delivering {
		// The channel's length only shrinks outside q.mu: when it is
		// empty here, nothing comes before c.
		if q.handWanted && len(q.out) == 0 {
			q.handOff, q.handWanted = c, false
			return
		}
		select {
		case q.out <- c:
			q.sent = true
			return
		default:
		}
	}
	q.items = append(q.items, c)
}

func (q *completionQueue) notify() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// deliverLoop sends queued completions to Completions, and closes it once
// the endpoint is torn down and everything is delivered. It swaps two
// slices with the pollers: it owns batch while delivering it, they append
// to the other. Once the endpoint is torn down, it waits at most
// CloseTimeout for a reader to take what the channel cannot hold; then it
// empties the channel, puts the buffers of everything undelivered back in
// their pools and ends, so that an endpoint whose Completions nobody reads
// still frees everything.
func (ep *Endpoint) deliverLoop() {
	q := &ep.queue
	var batch []Completion
	var giveUp <-chan time.Time // armed once the endpoint is torn down
	abandoned := false
	for {
		<-q.wake
		for {
			q.mu.Lock()
			batch, q.items = q.items, batch[:0]
			q.delivering = len(batch) > 0
			closed := q.closed
			q.mu.Unlock()
			if len(batch) == 0 {
				if closed {
					close(q.out)
					return
				}
				break
			}
			for i := range batch {
				if !abandoned && !q.deliver(batch[i], &giveUp, ep.cfg.CloseTimeout) {
					abandoned = true
					q.reclaimChannel()
				}
				if abandoned && batch[i].Buffer != nil {
					seam.PutBack(batch[i].Buffer)
				}
				batch[i] = Completion{} // drop references for the GC
			}
			ep.interruptWait(false)
		}
	}
}

// reclaimChannel takes what nobody read from the channel and puts its
// buffers back in their pools.
func (q *completionQueue) reclaimChannel() {
	for {
		select {
		case c := <-q.out:
			if c.Buffer != nil {
				seam.PutBack(c.Buffer)
			}
		default:
			return
		}
	}
}

// deliver sends c to Completions (or its request's Notify), waiting for a
// reader; false when the endpoint has been torn down for longer than
// timeout and nobody read.
func (q *completionQueue) deliver(c Completion, giveUp *<-chan time.Time, timeout time.Duration) bool {
	var to chan<- Completion = q.out
	if c.to != nil {
		to, c.to = c.to, nil
	}
	select {
	case to <- c:
		return true
	case <-q.ended:
	}
	if *giveUp == nil {
		*giveUp = time.After(timeout)
	}
	select {
	case to <- c:
		return true
	case <-*giveUp:
		return false
	}
}

// failHere ends the endpoint after what (polling the CQ, waiting on its
// channel) failed with err: it closes, and Done and every error the close
// causes say why, matching ErrClosed but not net.ErrClosed, since the
// application did not close it. It ends as Close does (endWith), so that
// the peer learns of the end at once and the queues flush: the completion
// goroutine then tears down within closeQuiet of the last completion it
// could take, not the close timeout. It cannot call Close, which waits for
// that goroutine, its caller. Close still frees it. It may run again while
// the close goes on (the CQ keeps failing); it logs once.
func (ep *Endpoint) failHere(what string, err error) {
	cause := fmt.Errorf("%w: %s failed: %w", ErrClosed, what, err)
	if ep.endWith(cause) {
		ep.cfg.Logger.Error().Err(err).Msgf("%s; closing the endpoint", what)
	}
}
