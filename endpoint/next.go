package endpoint

import (
	"context"
	"runtime"
	"time"

	"github.com/go-rdma/rdmacm/internal/seam"
)

// While callers of Next poll, the completion goroutine looks again whether
// anyone still does after minAside, then after twice as long each time they
// still do, up to maxAside. The looks are wake-ups that take a CPU from
// the spinning callers, hence the back-off; maxAside bounds the extra delay
// of a completion nobody waits for in Next.
const (
	minAside = time.Millisecond
	maxAside = 16 * time.Millisecond
)

// A spinning Next polls the CQ up to pollsPerCall times per call into C
// (a crossing costs more than a poll, several times more under emulation,
// and the time between two looks is how late a completion is seen). It
// checks its context, its spin time and the channel (for its close) once
// per spinCheckEvery polls: each check costs more than a poll under
// emulation.
//
// The spinning callers yield the processor once yieldEvery has passed
// since one of them last did, looking at the clock once per
// yieldCheckEvery polls counted across calls of Next (a ping-pong's Next
// returns within a few polls, and a count that started again at each call
// would never reach a yield). The yield lets other goroutines run even
// with GOMAXPROCS=1, and reschedules the spinner before the runtime's
// system monitor finds it on one time slice for 10 ms: the monitor then
// takes its P while it is in a call into C, most of a spin's time, and
// every such take sets the monitor waking every 20 µs again for a
// millisecond or more. Each of those wake-ups is a context switch that
// takes a CPU from a spinner or from the device's own work (rxe runs in
// the kernel). Not more often either: each runtime.Gosched wakes an idle
// thread to look for work, at the same cost.
const (
	pollsPerCall    = 16
	spinCheckEvery  = 64
	yieldCheckEvery = 1024
	yieldEvery      = 2 * time.Millisecond
)

// yieldIfDue yields the processor if no spinning caller has done so for
// yieldEvery; the first caller to see it due does.
func (p *cqPoller) yieldIfDue() {
	now := time.Since(spinEpoch)
	last := time.Duration(p.yielded.Load())
	if now-last >= yieldEvery && p.yielded.CompareAndSwap(int64(last), int64(now)) {
		runtime.Gosched()
	}
}

// spinEpoch is what cqPoller.yielded counts from, on the monotonic clock.
var spinEpoch = time.Now()

// Next waits for the next completion of the stream Completions delivers
// (each completion goes to one reader: Next or the channel).
//
// Next waits in the caller's goroutine, so a completion reaches the caller
// without a goroutine hand-off: the lowest-latency way to wait. With
// PollBusy it polls the CQ until a completion arrives or ctx ends, as
// perftest's loop does; with PollHybrid it polls for the spin time, then
// sleeps; with PollEvent it sleeps at once. A sleeping Next waits on the
// completion channel itself, and is woken by the completion it returns;
// one caller of Next does at a time, and the others wait for it to hand
// them completions or its place.
//
// While callers wait in Next, the completion goroutine stands aside (it
// looks again after 1 ms, backing off to every 16 ms while Next is still
// called, and polls once a look finds no Next since the last), so a
// completion nobody waits for in Next, arriving when no Next is polling,
// can reach Completions up to 32 ms later: an endpoint is best read one
// way, Next or the channel. A spinning Next yields the processor every
// 2 ms and otherwise keeps its P busy: a program with spinning callers
// wants GOMAXPROCS above their number.
//
// Next returns ctx's error when ctx ends first, and an error matching
// ErrClosed once the endpoint is closed and every completion was delivered.
func (ep *Endpoint) Next(ctx context.Context) (Completion, error) {
	if !ep.made() {
		return Completion{}, errNotMade
	}
	// Counted even when the channel answers at once: a caller that always
	// finds one there would otherwise never make the completion goroutine
	// stand aside, and the two would take turns on the CPU (with a
	// runtime.Gosched each) for every completion.
	ep.poller.nextCalls.Add(1)
	select {
	case c, ok := <-ep.queue.out:
		return ep.delivered(c, ok)
	default:
	}
	if c, got, err := ep.await(ctx, ep.poller.progress.Load()); got || err != nil {
		return c, err
	}
	select {
	case c, ok := <-ep.queue.out:
		return ep.delivered(c, ok)
	case <-ctx.Done():
		return Completion{}, ctx.Err()
	}
}

func (ep *Endpoint) delivered(c Completion, ok bool) (Completion, error) {
	if !ok {
		return Completion{}, ep.refusal()
	}
	return c, nil
}

// await waits for a completion in the caller's goroutine: it spins (busy
// and hybrid modes), then waits on the completion channel (hybrid and
// event modes). It returns got or err, or neither when the endpoint is
// closing: the channel then has what is left, and its close. In handler
// mode, got means completions were handled (by this call or another)
// since progress stood at since, or Wake was called; c is then empty.
func (ep *Endpoint) await(ctx context.Context, since uint64) (c Completion, got bool, err error) {
	p := &ep.poller
	p.callers.Add(1)
	defer func() {
		// Leaving without a completion, the caller will sleep on the
		// channel or give up: the completion goroutine must poll again.
		// Leaving with one, it will most likely be back; unless a
		// goroutine waits for a completion it does not poll for itself
		// (Kick), which must not wait for the stand-aside to end.
		if p.callers.Add(-1) == 0 && (!got || p.kicked.Swap(false)) {
			p.wake()
		}
	}()
	if ep.mode != PollEvent {
		if c, got, err = ep.spin(ctx, since); got || err != nil || ep.mode == PollBusy {
			return c, got, err
		}
	}
	select {
	case p.role <- struct{}{}:
	default:
		// The completion goroutine holds the role (it gives it back
		// when asked) or another caller does (it hands on what it
		// finds, then its place).
		ep.interruptWait(true)
		select {
		case p.role <- struct{}{}:
		case c, ok := <-ep.queue.out:
			c, err = ep.delivered(c, ok)
			return c, true, err
		case <-ctx.Done():
			return Completion{}, false, ctx.Err()
		}
	}
	ep.holdRole(ctx)
	defer p.releaseRole()
	deadline, _ := ctx.Deadline()
	for !p.isClosing() {
		_, c, handed := ep.pollFor(true)
		if handed {
			return c, true, nil
		}
		select {
		case c, ok := <-ep.queue.out:
			c, err = ep.delivered(c, ok)
			return c, true, err
		default:
		}
		if p.progress.Load() != since {
			return Completion{}, true, nil
		}
		if err := ctx.Err(); err != nil {
			return Completion{}, false, err
		}
		_, c, handed, werr := ep.waitEvent(ctx, true, since, deadline)
		if handed {
			return c, true, nil
		}
		if ep.checkWait(werr) {
			break // the channel has what is left, and its close
		}
		if werr != nil && !deadline.IsZero() && !time.Now().Before(deadline) {
			return Completion{}, false, context.DeadlineExceeded
		}
	}
	return Completion{}, false, nil
}

// spin polls the CQ in the caller's goroutine until a completion is ready
// (got; in handler mode, progress moved from since), ctx ends (err), or,
// with PollHybrid, the spin time has passed.
func (ep *Endpoint) spin(ctx context.Context, since uint64) (c Completion, got bool, err error) {
	var start time.Time
	if ep.mode == PollHybrid {
		start = time.Now()
	}
	for i := pollsPerCall; ; i += pollsPerCall {
		if _, c, handed := ep.pollFor(true); handed || ep.poller.progress.Load() != since {
			return c, true, nil
		}
		// Completions reach the channel when another goroutine polled;
		// a closed channel has no length, hence the periodic look.
		if len(ep.queue.out) > 0 || i%spinCheckEvery == 0 {
			select {
			case c, ok := <-ep.queue.out:
				c, err = ep.delivered(c, ok)
				return c, true, err
			default:
			}
		}
		if i%spinCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return Completion{}, false, err
			}
			if ep.mode == PollHybrid && time.Since(start) > ep.cfg.Spin {
				return Completion{}, false, nil
			}
		}
		if ep.poller.spun.Add(pollsPerCall)%yieldCheckEvery == 0 {
			ep.poller.yieldIfDue()
		}
	}
}

func init() {
	seam.ProgressMark = func(ep any) uint64 { return ep.(*Endpoint).poller.progress.Load() }
	seam.Progress = func(ep any, ctx context.Context, mark uint64) error {
		return ep.(*Endpoint).progressFor(ctx, mark)
	}
	seam.Wake = func(ep any) { ep.(*Endpoint).signalProgress() }
	seam.Kick = func(ep any) { ep.(*Endpoint).poller.kickPoller() }
	seam.KickDone = func(ep any) { ep.(*Endpoint).poller.waiting.Add(-1) }
	seam.SendsCompleteLocally = func(ep any) bool { return ep.(*Endpoint).dev.IWARP }
	seam.AwaitEnd = func(ep any) { ep.(*Endpoint).awaitEnd() }
	seam.ErrClosedHere = errClosedHere
	seam.CloseEndpoint = func(ep any, cause error) error { return ep.(*Endpoint).closeWith(cause) }
}

// progressFor is seam.Progress: a Next for a handler-mode endpoint, whose
// completions go to the handler in whichever goroutine polls. It waits in
// the caller's goroutine as Next does, so the completion a caller waits
// for is handled there, without a goroutine hand-off.
func (ep *Endpoint) progressFor(ctx context.Context, mark uint64) error {
	ep.poller.nextCalls.Add(1)
	_, got, err := ep.await(ctx, mark)
	if !got && err == nil {
		return ep.refusal() // closing: the completion goroutine handles what is left
	}
	return err
}

// callersPolling says whether a caller polls in Next now or has called
// Next since the completion goroutine last looked. Completion goroutine only.
func (p *cqPoller) callersPolling() bool {
	n := p.nextCalls.Load()
	recent := n != p.seenCalls
	p.seenCalls = n
	if !recent && p.callers.Load() == 0 {
		p.asideFor = 0 // back to polling: the next stand-aside starts short
		return false
	}
	return true
}

// standAside parks the completion goroutine until a caller leaves Next
// without a completion, Close, or a look after the back-off time finds
// the endpoint closing or no caller of Next since the last look. A look
// reads flags and counters and nothing else: polling the CQ, or taking a
// lock the spinning callers hold, would make them wake this goroutine
// (and an idle thread to run it) when they let go of it, and a caller in
// Next drains the CQ anyway.
func (p *cqPoller) standAside() {
	for {
		p.asideFor = min(max(minAside, 2*p.asideFor), maxAside)
		if p.aside == nil {
			p.aside = time.NewTimer(p.asideFor)
		} else {
			p.aside.Reset(p.asideFor)
		}
		select {
		case <-p.kick:
			p.aside.Stop()
			p.asideFor = 0
			p.kicked.Store(false)
			// Whoever kicked left Next without a completion and now waits
			// for this goroutine: the Next calls so far must not make it
			// stand aside again on its next look.
			p.seenCalls = p.nextCalls.Load()
			return
		case <-p.aside.C:
		}
		if p.isClosing() || !p.callersPolling() {
			return
		}
	}
}

// kickPoller is seam.Kick: a goroutine is about to wait for a completion it
// will not poll for. While a caller of Progress polls, that caller will
// handle it; otherwise, or once the last such caller leaves, the
// completion goroutine must poll now rather than stand aside.
func (p *cqPoller) kickPoller() {
	p.waiting.Add(1)
	p.kicked.Store(true)
	if p.callers.Load() == 0 {
		p.wake()
	}
}

// wake ends the completion goroutine's standAside (now or, if it is
// not standing aside, the next time it does: the kick is buffered).
func (p *cqPoller) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}
