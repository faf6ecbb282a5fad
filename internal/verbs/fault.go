//go:build rdmacm_faultinject

package verbs

// #include "shim.h"
import "C"

import (
	"net"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Fault injection, built only with the rdmacm_faultinject tag (make
// test-faults): failures no device can be made to produce on purpose, so
// that the library's handling of them runs on a real connection.

var fault struct {
	mu      sync.Mutex
	op      WCOpcode
	err     error    // armed: the next poll finding op fails with it
	failOp  WCOpcode // armed with failAs: the next completion of failOp fails
	failAs  WCStatus
	hold    WCOpcode // with holding: polls finding hold keep what they found
	holding bool
	stashed map[*CQ]int    // completions a failed poll left for the next
	refuse  *refusal       // armed: the next post holding it refuses it
	event   repeated       // armed: reads of a pending CQ event fail
	arm     repeated       // armed: arming a CQ fails
	qpMove  repeated       // armed: moving a QP to the error state fails
	cmEvent repeated       // armed: reads of a pending CM event fail
	async   repeated       // armed: reads of a pending asynchronous event fail
	discon  error          // armed: the next rdma_disconnect fails
	listen6 error          // armed: rdma_listen of IPv6 addresses fails
	create  creation       // armed: a creation of create.kind fails
	cqSize  int            // armed: a CQ is created with this many entries,
	cqSkip  int            // after this many more
	shrunk  *CQ            // the CQ cqSize made, until it is destroyed
	holdCQ  bool           // polls of shrunk keep what they found
	lastQP  uintptr        // the QPKey of the QP created last
	rewrite AsyncEventType // armed (not 0): the next port event read becomes this, about lastQP
	fired   int            // failures injected so far (Injected)
}

// ForGood, as the count of FailCQEvents, FailCQArms, FailQPMoves,
// FailCMEvents or FailAsyncEvents, fails every call until the fault is armed again (with a
// nil error to disarm it).
const ForGood = -1

// repeated is a failure armed for a number of calls (or ForGood).
type repeated struct {
	err  error
	left int
}

// set arms r with err for times calls (ForGood: every one; nil: none).
func (r *repeated) set(err error, times int) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	*r = repeated{err: err, left: times}
}

// next takes r's failure for this call, if one is armed.
func (r *repeated) next() error {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	return r.take()
}

// take returns the failure for this call, if one is armed, and counts it.
// fault.mu is held.
func (r *repeated) take() error {
	if r.err == nil || r.left == 0 {
		return nil
	}
	if r.left > 0 {
		r.left--
	}
	fault.fired++
	return r.err
}

// Injected returns how many failures the faults armed with a count
// (FailCQEvents, FailCQArms, FailQPMoves, FailCMEvents, FailAsyncEvents)
// and FailCreate have injected in this process, so that a test can bound
// how often a failed device is tried again, or know that a creation was
// refused.
func Injected() int {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	return fault.fired
}

// FailNextPollFinding makes the next PollRetry, on any CQ of the process,
// whose first completion is an op fail with err. The completions it found
// stay in that CQ's poll array, and its next PollRetry returns them, as
// if the failed poll had taken none.
func FailNextPollFinding(op WCOpcode, err error) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.op, fault.err = op, err
}

// FailNextCompletion makes the next successful completion of op that a
// PollRetry finds, on any CQ of the process, report status instead, as a
// device reports a request it could not carry out. The queue pair is not
// moved to the error state: what the library does next is what is tested.
// WCSuccess disarms it.
func FailNextCompletion(op WCOpcode, status WCStatus) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.failOp, fault.failAs = op, status
}

// HoldCompletions, with hold set, makes every PollRetry, on any CQ of
// the process, whose first completion is an op keep what it found and
// return nothing, as a device that has not carried out those requests
// yet; such a CQ is not polled again while they are held. With hold
// false, the next PollRetry of each such CQ returns them.
func HoldCompletions(op WCOpcode, hold bool) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.hold, fault.holding = op, hold
}

// stashedPoll returns the completions a failed poll of cq left, if any,
// or none while completions are held.
func (cq *CQ) stashedPoll() (int, bool) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	n, ok := fault.stashed[cq]
	if ok && (fault.holding || fault.holdCQ && cq == fault.shrunk) {
		return 0, true
	}
	delete(fault.stashed, cq)
	return n, ok
}

// forgetStash drops what cq's polls left, and its mark as the CQ
// ShrinkCQ made, as it is destroyed.
func (cq *CQ) forgetStash() {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	delete(fault.stashed, cq)
	if cq == fault.shrunk {
		fault.shrunk = nil
	}
}

// stash keeps the n completions cq's poll found for a later poll. fault.mu
// is held.
func (cq *CQ) stash(n int) {
	if fault.stashed == nil {
		fault.stashed = map[*CQ]int{}
	}
	fault.stashed[cq] = n
}

// injectedFault fails the poll that found n completions on cq, if the
// armed fault is for the first one's opcode; it keeps them for the next.
// Before that, it gives the first of them that FailNextCompletion names
// its status. It returns how many the poll returns: none if they are held.
func (cq *CQ) injectedFault(n int) (int, error) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	if n > 0 && (fault.holding && cq.At(0).Opcode == fault.hold || fault.holdCQ && cq == fault.shrunk) {
		cq.stash(n)
		return 0, nil
	}
	if fault.failAs != WCSuccess {
		wcs := unsafe.Slice(cq.wcs, n)
		for i := range wcs {
			if WCOpcode(wcs[i].opcode) == fault.failOp && WCStatus(wcs[i].status) == WCSuccess {
				wcs[i].status = C.uint32_t(fault.failAs)
				fault.failAs = WCSuccess
				break
			}
		}
	}
	if fault.err == nil || n == 0 || cq.At(0).Opcode != fault.op {
		return n, nil
	}
	err := fault.err
	fault.err = nil
	cq.stash(n)
	return 0, err
}

// FailNextPost makes the next Post, on any queue pair of the process, that
// holds a receive (recv) or a send request of this index refuse it with
// err, as a device refuses a request it cannot take: the requests before
// it are posted (and complete), it and those after it are not, and after
// a refused receive no send is posted. A nil err disarms it.
func FailNextPost(recv bool, index int, err error) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.refuse = nil
	if err != nil {
		fault.refuse = &refusal{recv: recv, index: index, err: err}
	}
}

// injectedRefusal takes the armed refusal if a post of nrecv receives and
// nsend sends holds its request.
func injectedRefusal(nrecv, nsend int) (refusal, bool) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	f := fault.refuse
	if f == nil {
		return refusal{}, false
	}
	held := nsend
	if f.recv {
		held = nrecv
	}
	if held <= f.index {
		return refusal{}, false
	}
	fault.refuse = nil
	return *f, true
}

// FailCQEvents makes the next times GetEvents (or every one: ForGood),
// on any completion channel of the process, that have an event to read
// fail with err instead, as a channel whose device went away does. The
// event stays in the channel. A nil err disarms it.
func FailCQEvents(err error, times int) {
	fault.event.set(err, times)
}

// injectedFault fails this GetEvent if a failure is armed and an event is
// pending (a GetEvent that would find none is left alone, so that the
// channel that fails is the one the test makes an event on).
func (ch *CompChannel) injectedFault() error {
	return injectedReadFault(&fault.event, ch.Fd())
}

// injectedReadFault takes r's failure for a read of fd, if one is armed
// and fd has something to read.
func injectedReadFault(r *repeated, fd int) error {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	if r.err == nil {
		return nil
	}
	pending := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pending, 0); err != nil || n == 0 {
		return nil
	}
	return r.take()
}

// FailCMEvents makes the next times GetEvents (or every one: ForGood), on
// any CM event channel of the process, that have an event to read fail
// with err instead. The event stays in the channel. A nil err disarms it.
func FailCMEvents(err error, times int) {
	fault.cmEvent.set(err, times)
}

// injectedFault fails this GetEvent as FailCMEvents armed it.
func (c *EventChannel) injectedFault() error {
	return injectedReadFault(&fault.cmEvent, c.Fd())
}

// FailAsyncEvents makes the next times reads of a device's pending
// asynchronous event (or every one: ForGood), on any device context of
// the process, fail with err and leave the event unread. A nil err
// disarms it.
func FailAsyncEvents(err error, times int) {
	fault.async.set(err, times)
}

// injectedAsyncFault fails this GetAsyncEvent as FailAsyncEvents armed it.
func (c *Context) injectedAsyncFault() error {
	return injectedReadFault(&fault.async, int(c.p.async_fd))
}

// FailCQArms makes the next times ReqNotify calls (or every one:
// ForGood), on any CQ of the process, fail with err without arming it, as
// the CQ of a device that went away does. A nil err disarms it.
func FailCQArms(err error, times int) {
	fault.arm.set(err, times)
}

// injectedArmFault takes the armed ReqNotify failure, if any.
func injectedArmFault() error {
	return fault.arm.next()
}

// FailQPMoves makes the next times CMID.FailQP calls (or every one:
// ForGood), of any id of the process, fail with err and leave the QP as
// it was, as for a device that went away. A nil err disarms it.
func FailQPMoves(err error, times int) {
	fault.qpMove.set(err, times)
}

// injectedQPMoveFault takes the armed FailQP failure, if any.
func injectedQPMoveFault() error {
	return fault.qpMove.next()
}

// FailNextDisconnect makes the next Disconnect, of any id of the process,
// fail with err without disconnecting.
func FailNextDisconnect(err error) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.discon = err
}

// injectedDisconnectFault takes the armed Disconnect failure, if any.
func injectedDisconnectFault() error {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	err := fault.discon
	fault.discon = nil
	return err
}

// creation is an armed FailCreate.
type creation struct {
	kind Resource
	skip int
	err  error
}

// FailCreate makes a creation of a kind of device object fail with err,
// once, as a device out of memory or past its limits refuses one: the
// first after skip more of that kind, on any device of the process, have
// been created. Nothing is created by the failed call. A nil err disarms
// it.
func FailCreate(kind Resource, skip int, err error) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.create = creation{kind: kind, skip: skip, err: err}
}

// injectedCreateFault takes the armed FailCreate failure if this creation
// of kind is the one it names.
func injectedCreateFault(kind Resource) error {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	c := &fault.create
	if c.err == nil || c.kind != kind {
		return nil
	}
	if c.skip > 0 {
		c.skip--
		return nil
	}
	err := c.err
	*c = creation{}
	fault.fired++
	return err
}

// ShrinkCQ makes a CQ hold entries completions whatever its creator asked
// for, so that the device overruns it (IBV_EVENT_CQ_ERR) when more than
// that complete before a poll: the first CQ created, on any device of the
// process, after skip more have been. 0 entries disarms it.
func ShrinkCQ(skip, entries int) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.cqSkip, fault.cqSize = skip, entries
}

// HoldShrunkCQ, with hold set, makes every PollRetry of the CQ that
// ShrinkCQ made keep what it found and return nothing, as a poller that
// has fallen behind, so that the device overruns it; the process's other
// CQs are polled as ever. With hold false, its next PollRetry returns
// them. Nothing raises a CQ event for them: a poll that nothing else
// prompts (an endpoint's close does) never comes.
func HoldShrunkCQ(hold bool) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.holdCQ = hold
}

// injectedCQSize is the size a CQ is created with: cqe, or what ShrinkCQ
// armed (shrunk).
func injectedCQSize(cqe int) (size int, shrunk bool) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	switch {
	case fault.cqSize == 0:
		return cqe, false
	case fault.cqSkip > 0:
		fault.cqSkip--
		return cqe, false
	}
	cqe, fault.cqSize = fault.cqSize, 0
	fault.fired++
	return cqe, true
}

// markShrunk records cq as the CQ ShrinkCQ made, for HoldShrunkCQ.
func (cq *CQ) markShrunk() {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.shrunk = cq
}

// FailIPv6Listens makes every Listen of an id bound to an IPv6 address
// fail with err, as soft-iWARP's does where the kernel has no IPv6
// (EAFNOSUPPORT). A nil err disarms it.
func FailIPv6Listens(err error) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.listen6 = err
}

// injectedListenFault takes the armed Listen failure if id is bound to an
// IPv6 address.
func (id *CMID) injectedListenFault() error {
	a, ok := id.LocalAddr().(*net.TCPAddr)
	if !ok || a.IP.To4() != nil {
		return nil
	}
	fault.mu.Lock()
	defer fault.mu.Unlock()
	return fault.listen6
}

// RewriteNextAsyncEvent makes the next asynchronous event about a port
// (its state, its LID or GID table) that the process reads, on any
// device, come out as typ about the QP created last, as a device reports
// a QP that failed; the port's event is lost. Something must raise a
// port's event: on rxe a new address of the netdev does (a GID table
// change), on siw a new MAC address (a LID change). 0 disarms it.
func RewriteNextAsyncEvent(typ AsyncEventType) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.rewrite = typ
}

// noteQPCreated records the QP created last, for RewriteNextAsyncEvent.
func noteQPCreated(key uintptr) {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	fault.lastQP = key
}

// injectedRewrite is ev, or what RewriteNextAsyncEvent armed in its place.
func injectedRewrite(ev AsyncEvent) AsyncEvent {
	fault.mu.Lock()
	defer fault.mu.Unlock()
	if fault.rewrite == 0 || ev.Port == 0 {
		return ev
	}
	ev = AsyncEvent{Type: fault.rewrite, Element: fault.lastQP}
	fault.rewrite = 0
	fault.fired++
	return ev
}
