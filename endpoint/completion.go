package endpoint

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

var pastTime = time.Unix(1, 0)

// ackBatch: CQ events are acked in batches (ibv_ack_cq_events takes a mutex).
const ackBatch = 64

// pollLoop is the completion goroutine: it drains the CQ in batches, re-arms
// it, polls once more to close the race between the last poll and the arm,
// and sleeps on the completion channel through the netpoller. After Close it
// collects the flushed work requests and tears the verbs objects down.
func (ep *Endpoint) pollLoop() {
	defer close(ep.pollDone)
	var closeDeadline time.Time
	lastWork := time.Now()
	for {
		n := ep.poll()
		if n > 0 && ep.cfg.Poll == PollHybrid { // only hybrid needs the clock (nanotime is dear under emulation)
			lastWork = time.Now()
		}
		closing, pending := ep.closingState()
		if closing {
			if closeDeadline.IsZero() {
				closeDeadline = time.Now().Add(ep.cfg.CloseTimeout)
			}
			if pending == 0 || time.Now().After(closeDeadline) {
				break
			}
		}
		switch {
		case n > 0:
			continue
		case !closing && ep.cfg.Poll != PollEvent && ep.callersPolling():
			// Callers of Next poll the CQ in their own goroutines: two
			// spinning pollers per endpoint would only fight for the CPU.
			ep.standAside()
			continue
		case !closing && (ep.cfg.Poll == PollBusy ||
			ep.cfg.Poll == PollHybrid && time.Since(lastWork) < ep.cfg.Spin):
			// Spin, but let the goroutines that consume and post run:
			// with few cores a tight loop would starve them until preempted.
			runtime.Gosched()
			continue
		}
		if err := ep.cq.ReqNotify(false); err != nil {
			ep.cfg.Logger.Error().Err(err).Msg("arming the CQ")
		}
		if n := ep.poll(); n > 0 {
			if ep.cfg.Poll == PollHybrid {
				lastWork = time.Now()
			}
			continue
		}
		if closing {
			// Flushed completions raise an event too; the short deadline
			// only bounds a lost one.
			ep.wait.SetDeadline(time.Now().Add(10 * time.Millisecond))
		}
		werr := ep.wait.Wait()
		if werr != nil && !errors.Is(werr, os.ErrDeadlineExceeded) {
			ep.cfg.Logger.Error().Err(werr).Msg("waiting on the completion channel")
			ep.markClosing()
		}
		if ep.unacked >= ackBatch {
			ep.cq.AckEvents(ep.unacked)
			ep.unacked = 0
		}
	}
	ep.cq.AckEvents(ep.unacked)
	ep.teardown()
}

// takeEvent takes one event from the completion channel for fdwait: false
// when there is none yet. Only the completion goroutine calls it.
func (ep *Endpoint) takeEvent() bool {
	err := ep.ch.GetEvent()
	if err == syscall.EAGAIN {
		return false
	}
	if err == nil {
		ep.unacked++
	}
	return true
}

func (ep *Endpoint) markClosing() {
	ep.mu.Lock()
	ep.closing = true
	ep.mu.Unlock()
}

func (ep *Endpoint) closingState() (bool, int) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.closing, ep.sends.inUse() + ep.recvs.inUse()
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
	ep.pollMu.Lock()
	var err error
	if !ep.cqGone {
		n, handed, err = ep.drain(want)
		if handed {
			c, ep.queue.handOff = ep.queue.handOff, Completion{}
		}
	}
	ep.pollMu.Unlock()
	if err != nil {
		ep.cfg.Logger.Error().Err(err).Msg("polling the CQ; closing the endpoint")
		ep.markClosing()
		ep.wakePoller()
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
		ep.queue.mu.Unlock()
		ep.mu.Unlock()
		if notify {
			ep.queue.notify()
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
			s, ok = ep.cfg.SRQ.complete(uint32(wc.WRID &^ srqBit))
		} else if idx := uint32(wc.WRID &^ recvBit); int(idx) < len(ep.recvs.slots) && ep.recvs.slots[idx].used {
			s, ok = ep.recvs.release(idx), true
		}
		if !ok {
			ep.cfg.Logger.Error().Uint64("wr_id", wc.WRID).Msg("completion for an unknown receive")
			return
		}
		c := Completion{Context: s.ctx, Op: OpRecv, Buffer: s.buf, Len: int(wc.ByteLen)}
		if wc.Opcode == verbs.WCRecvRDMAWithImm {
			c.Op = OpRecvWriteImm
		}
		if wc.Flags&verbs.WCWithImm != 0 {
			c.Imm, c.HasImm = wc.Imm, true
		}
		if wc.Status != verbs.WCSuccess {
			c.Err, c.Len = &CompletionError{Op: OpRecv, Status: wc.Status, VendorErr: wc.VendorErr}, 0
		} else if !ep.gotRecv {
			ep.gotRecv = true
			close(ep.received)
		}
		ep.queue.emit(c)
		return
	}
	idx := uint32(wc.WRID)
	// Sends complete in order: every unsignaled send posted before this
	// one has completed successfully.
	for ep.sendFIFO.count > 0 {
		head := ep.sendFIFO.pop()
		s := ep.sends.release(head)
		c := Completion{Context: s.ctx, Op: s.op, Buffer: s.buf, Len: s.length}
		if head == idx && wc.Status != verbs.WCSuccess {
			c.Err = &CompletionError{Op: s.op, Status: wc.Status, VendorErr: wc.VendorErr}
		}
		if !s.silent || c.Err != nil {
			ep.queue.emit(c)
		}
		if head == idx {
			break
		}
	}
}

// teardown destroys the verbs objects in order (QP, CQ, channel), then
// completes whatever the device never handed back with ErrClosed: once the
// QP is destroyed the device no longer touches those buffers.
func (ep *Endpoint) teardown() {
	ep.qpMu.Lock()
	ep.qpDestroyed = true
	ep.id.DestroyQP()
	ep.qpMu.Unlock()
	ep.pollMu.Lock()
	ep.cqGone = true
	errs := []error{ep.cq.Destroy(), ep.wait.Close(), ep.ch.Destroy(), ep.pd.Release()}
	ep.pollMu.Unlock()
	if ep.cfg.SRQ != nil {
		ep.cfg.SRQ.detach()
	}
	ep.mu.Lock()
	ep.queue.mu.Lock()
	for ep.sendFIFO.count > 0 {
		s := ep.sends.release(ep.sendFIFO.pop())
		ep.queue.items = append(ep.queue.items, Completion{Context: s.ctx, Op: s.op, Buffer: s.buf, Err: ErrClosed})
	}
	for i := range ep.recvs.slots {
		if ep.recvs.slots[i].used {
			s := ep.recvs.release(uint32(i))
			ep.queue.items = append(ep.queue.items, Completion{Context: s.ctx, Op: OpRecv, Buffer: s.buf, Err: ErrClosed})
		}
	}
	ep.queue.closed = true
	ep.queue.mu.Unlock()
	ep.mu.Unlock()
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
	closed     bool
	wake       chan struct{}
}

func (q *completionQueue) init(capacity int) {
	q.out = make(chan Completion, capacity)
	q.wake = make(chan struct{}, 1)
}

// emit delivers c in order; q.mu is held.
func (q *completionQueue) emit(c Completion) {
	if len(q.items) == 0 && !q.delivering {
		// The channel's length only shrinks outside q.mu: when it is
		// empty here, nothing comes before c.
		if q.handWanted && len(q.out) == 0 {
			q.handOff, q.handWanted = c, false
			return
		}
		select {
		case q.out <- c:
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
// to the other.
func (ep *Endpoint) deliverLoop() {
	q := &ep.queue
	var batch []Completion
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
				q.out <- batch[i]
				batch[i] = Completion{} // drop references for the GC
			}
		}
	}
}
