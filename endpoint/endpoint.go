// Package endpoint is one connected RC queue pair: post sends, receives,
// RDMA writes and reads, and atomics on it, and receive each work request's
// context back, exactly once, on the Completions channel (or from Next,
// which with busy or hybrid polling polls the CQ in the caller's goroutine).
//
// Package cm creates endpoints (Dial, Listener.Accept); this package owns
// what happens on the queue pair: slot accounting (a post never exceeds the
// queue depth; ErrQueueFull instead), selective signaling, inline sends,
// batching of many work requests into one ibv_post_send, the completion
// goroutine (on Go's netpoller, never a thread parked in C), and teardown.
//
// A post that returns an error posted nothing (except as *PostError says
// for a batch): its buffers are still the caller's, to put back or post
// again. A post that succeeds hands its buffers to the device until its
// completion comes back.
package endpoint

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/internal/asyncevent"
	"github.com/go-rdma/rdmacm/internal/fdwait"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Op is the kind of a work request or completion.
type Op int

// Operations.
const (
	OpSend Op = iota
	OpRecv
	OpWrite
	OpRead
	OpCompareAndSwap
	OpFetchAndAdd
	OpRecvWriteImm // a receive consumed by the peer's RDMA_WRITE_WITH_IMM
)

var opNames = [...]string{"send", "recv", "RDMA write", "RDMA read", "compare-and-swap", "fetch-and-add", "recv (write with imm)"}

// String names the operation.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// Completion is the outcome of one work request.
type Completion struct {
	Context any   // what the caller passed to Post*
	Op      Op    // for receives, OpRecvWriteImm when the peer wrote with imm
	Err     error // nil, a *CompletionError, or an error matching ErrClosed
	Len     int   // bytes received (receives); bytes posted (others)
	Imm     uint32
	HasImm  bool
	Buffer  *bufpool.Buffer // the buffer posted, when the post named one

	to chan<- Completion // the request's Notify, where it goes instead of Completions
}

// Endpoint is a connected queue pair. Post*, Next and Close are safe for
// concurrent use.
type Endpoint struct {
	// Who owns what:
	//   - Posting goroutines (any caller of Post*) take mu and own, under
	//     it, the slot tables, the send FIFO, the verbs batches and the
	//     scratch arrays; closing and gotRecv are under mu too.
	//   - The completion goroutine (pollLoop) owns the stand-aside state
	//     and the verbs objects' teardown. It polls the CQ under poller.mu,
	//     as do callers of Next; the CQ's completion array belongs to
	//     whoever holds poller.mu.
	//   - The holder of poller.role (the completion goroutine or one caller
	//     of Next) arms the CQ, waits on the completion channel, and owns
	//     its events and their acks (poller.unacked).
	//   - In handler mode, the holder of poller.mu calls the handler, after
	//     letting go of mu and queue.mu: the handler may post.
	//   - The delivery goroutine (deliverLoop) owns the batch it is sending
	//     to Completions; queue.mu guards what it swaps with the pollers.
	//   - Package cm's event goroutine calls the PeerGone it was given,
	//     which takes qpMu to move the QP to the error state.
	//
	// Lock order: poller.role, then poller.mu, then mu, then queue.mu
	// (drain takes the last three), then poller.deadlineMu; qpMu is taken
	// alone. Close sets closing, disconnects, and
	// waits for the completion goroutine (pollDone), which tears
	// everything down and lets the delivery goroutine finish (queue.ended).

	cfg  seam.EndpointConfig
	mode PollMode
	srq  *SRQ
	id   *verbs.CMID
	ch   *verbs.CompChannel
	cq   *verbs.CQ
	wait *fdwait.Waiter
	caps verbs.QPCaps
	dev  verbs.DeviceAttr
	pd   *seam.Domain
	pdv  *bufpool.PD // pd's public view (PD)

	peerData []byte // the peer's private data, set once before the endpoint is returned

	mu        sync.Mutex // posting, slots
	closing   bool
	sends     slotTable
	recvs     slotTable
	sendFIFO  ring     // send slots in posting order, for selective signaling
	owed      []uint32 // complete's: signaled slots passed over, reused
	unsigRun  int      // unsignaled sends since the last signaled one
	sendBatch *verbs.SendBatch
	recvBatch *verbs.RecvBatch
	scratch   []Request   // postOne's single request, reused
	sges      []verbs.SGE // the batch being posted: its scatter/gather entries,
	spans     [][2]int    // and each request's part of them, reused
	sendTaken []uint32    // slots taken by the batch being posted, reused
	recvTaken []uint32
	received  chan struct{} // closed at the first good receive (seam.Control.Received)
	gotRecv   bool          // received is closed
	stats     Stats         // under mu

	queue  completionQueue
	poller cqPoller

	// Handler mode (seam.EndpointConfig.Handler): completions go to
	// handle, in order, in whichever goroutine polls the CQ (the
	// completion goroutine or a caller of Progress), instead of to
	// Completions; handleEnd runs once after the last. handled holds a
	// poll's completions until the locks are let go; it belongs to the
	// holder of poller.mu, and to teardown.
	handle    func(Completion)
	handleEnd func()
	handled   []Completion

	pollDone chan struct{}
	closedBy atomic.Pointer[error] // closedHere's cause, set once before closing
	// calledClose: the application called Close (refusal), maybe after
	// the endpoint had ended by itself.
	calledClose atomic.Bool
	closeErr    error
	onClose     func() error

	doneOnce sync.Once
	done     chan struct{}
	doneErr  atomic.Pointer[error]
	failing  *time.Timer // the end of a failed request (or an unexplained flush), due after its grace; under mu
	failure  error       // the failed request's error, which posts are refused with meanwhile; under mu
	notified bool        // handler mode: the poll under way delivered to a Notify channel; under mu

	closeOnce sync.Once

	// qpMu serializes rdma_disconnect (from Close and from the CM
	// goroutine) with the QP's destruction: librdmacm reads id->qp in both.
	qpMu         sync.Mutex
	disconnected bool
	qpDestroyed  bool
	// qpFailed: the QP is in the error state, so every work request
	// posted before it got there completes promptly; Close waits no
	// longer for one posted later (see closeQuiet).
	qpFailed atomic.Bool

	// The device's asynchronous events (deviceEvent): unwatch stops
	// them, and teardown calls it before it destroys the QP and CQ. live
	// is set once the endpoint is whole; events before that are not
	// acted on.
	unwatch func()
	live    atomic.Bool
}

// cqPoller is the state of polling the CQ: who may poll it now, who
// waits on the completion channel, and how the completion goroutine stands
// aside while callers of Next poll or wait themselves.
type cqPoller struct {
	mu   sync.Mutex // one poller of the CQ at a time
	gone bool       // the CQ is destroyed (under mu)
	// Callers of Next that poll the CQ or wait on its channel themselves;
	// the completion goroutine stands aside while they do.
	callers   atomic.Int32
	nextCalls atomic.Uint64 // Next and Progress calls, ever
	// progress moves each time a poll handled completions (handler mode)
	// and at each Wake: a caller of Progress returns when it moved.
	progress  atomic.Uint64
	spun      atomic.Uint32 // polls of spinning callers, ever
	yielded   atomic.Int64  // when a spinning caller last yielded, since spinEpoch
	seenCalls uint64        // nextCalls when the completion goroutine last looked
	kick      chan struct{} // wakes a completion goroutine standing aside
	kicked    atomic.Bool   // a goroutine waits for a completion it does not poll for (seam.Kick)
	waiting   atomic.Int32  // such goroutines now: from seam.Kick to seam.KickDone
	aside     *time.Timer
	asideFor  time.Duration // the current stand-aside back-off

	// role is the right to arm the CQ, wait on the completion channel and
	// take its events (a semaphore: send to take it, receive to give it
	// back). The completion goroutine holds it, or one caller of Next at a
	// time: the netpoller lets one goroutine wait on a descriptor, and the
	// waiter is the one woken. unacked and takeErr are under it.
	role    chan struct{}
	unacked int           // CQ events taken and not yet acked
	takeErr error         // the channel's read failed (takeEvent)
	events  atomic.Uint64 // CQ events taken, ever (Stats.CQEvents)
	// channelFailed: a wait on the channel failed (its read, or arming
	// the CQ), and the endpoint is closing; nobody waits on the channel
	// again (such a wait would fail at once: a spin).
	channelFailed atomic.Bool

	// The channel's deadline is set by the holder of role, by Close, by a
	// caller of Next that wants the role from the completion goroutine,
	// by whoever else puts a completion in Completions while a caller of
	// Next waits on the channel (interruptWait), and by the end of that
	// caller's context; deadlineMu orders them.
	deadlineMu    sync.Mutex
	deadline      time.Time       // what is set
	closing       bool            // Close has begun: every wait is short from now on
	loopWaiting   bool            // the completion goroutine waits on the channel
	callerHolds   bool            // a caller of Next holds role,
	callerWaiting bool            // and waits on the channel,
	holderDone    <-chan struct{} // until this closes (its context's Done)
	// One context.AfterFunc serves every Next with the same context, so
	// that a loop on Next allocates nothing: watched is that context's
	// Done, stopWatch unregisters it.
	watched   <-chan struct{}
	stopWatch func() bool
}

// disconnect disconnects and moves the QP to the error state, once, and
// never after the QP is destroyed. On InfiniBand and RoCE a successful
// rdma_disconnect has made that move itself (a second one would be a
// system call for nothing, at every close); on iWARP it only drains the
// QP (SQD), and after a failed rdma_disconnect the state is unknown, so
// FailQP makes the move there.
func (ep *Endpoint) disconnect() {
	ep.qpMu.Lock()
	defer ep.qpMu.Unlock()
	if ep.disconnected || ep.qpDestroyed {
		return
	}
	ep.disconnected = true
	err := ep.id.Disconnect()
	if err != nil {
		ep.cfg.Logger.Debug().Err(err).Msg("rdma_disconnect")
	}
	if err == nil && !ep.dev.IWARP {
		ep.qpFailed.Store(true)
		return
	}
	if err := ep.id.FailQP(); err != nil {
		ep.cfg.Logger.Debug().Err(err).Msg("moving the QP to the error state")
		return
	}
	ep.qpFailed.Store(true)
}

type slot struct {
	ctx      any
	buf      *bufpool.Buffer
	op       Op
	length   int
	signaled bool
	silent   bool // no Completion unless it fails (Silent)
	used     bool
	notify   chan<- Completion // Request.Notify
}

// slotTable maps a work request id to what the caller posted. wr_id is the
// slot index (plus a bit for receives), never a pointer.
type slotTable struct {
	slots []slot
	free  []uint32
}

func newSlotTable(n int) slotTable {
	t := slotTable{slots: make([]slot, n), free: make([]uint32, n)}
	for i := range t.free {
		t.free[i] = uint32(n - 1 - i)
	}
	return t
}

func (t *slotTable) inUse() int { return len(t.slots) - len(t.free) }

const recvBit = 1 << 32

// ring is a fixed-size FIFO of slot indices (it never holds more than the
// send queue depth, so it never grows).
type ring struct {
	buf         []uint32
	head, count int
}

func (r *ring) push(v uint32) {
	r.buf[(r.head+r.count)%len(r.buf)] = v
	r.count++
}

func (r *ring) pop() uint32 {
	v := r.buf[r.head]
	r.head = (r.head + 1) % len(r.buf)
	r.count--
	return v
}

// unpop puts vs back at the head, in their order, as they were before
// they were popped.
func (r *ring) unpop(vs []uint32) {
	r.head = (r.head - len(vs) + len(r.buf)) % len(r.buf)
	r.count += len(vs)
	for i, v := range vs {
		r.buf[(r.head+i)%len(r.buf)] = v
	}
}

// dropNewest forgets the n most recently pushed entries.
func (r *ring) dropNewest(n int) { r.count -= n }

func init() {
	seam.NewEndpoint = newEndpoint
	seam.CheckLimits = func(dev *verbs.Context, cfg seam.EndpointConfig) error {
		_, err := fitDevice(dev, &cfg)
		return err
	}
}

// fitDevice fills in cfg's defaults and checks it against dev's limits,
// whose attributes it returns.
func fitDevice(dev *verbs.Context, cfg *seam.EndpointConfig) (verbs.DeviceAttr, error) {
	setDefaults(cfg)
	attr, err := dev.QueryDevice()
	if err != nil {
		return attr, err
	}
	return attr, checkLimits(*cfg, attr)
}

// newEndpoint is seam.NewEndpoint.
func newEndpoint(id *verbs.CMID, cfg seam.EndpointConfig, onClose func() error) (any, *seam.Control, error) {
	vctx := id.Context()
	if vctx == nil {
		return nil, nil, fmt.Errorf("endpoint: the id has no device (resolve the address first): %w", verbs.ErrNoDevice)
	}
	dev, err := fitDevice(vctx, &cfg)
	if err != nil {
		return nil, nil, err
	}
	ep := &Endpoint{cfg: cfg, mode: PollMode(cfg.Poll), id: id, dev: dev, onClose: onClose,
		pollDone: make(chan struct{}), done: make(chan struct{})}
	if cfg.SRQ != nil {
		ep.srq = cfg.SRQ.(*SRQ)
	}
	if cfg.Handler != nil {
		ep.handle, ep.handleEnd = cfg.Handler.(func(Completion)), cfg.HandlerEnd
	}
	if err := ep.create(vctx); err != nil {
		return nil, nil, err
	}
	ep.pdv = seam.WrapPD(ep.pd).(*bufpool.PD)
	// Slots are what was asked, not what the device granted: the CQ was
	// sized for exactly these, so it can never overflow.
	ep.sends = newSlotTable(cfg.SendDepth)
	ep.sendFIFO = ring{buf: make([]uint32, cfg.SendDepth)}
	ep.owed = make([]uint32, 0, cfg.SendDepth)
	ep.recvs = newSlotTable(cfg.RecvDepth)
	ep.sendBatch = verbs.NewSendBatch(cfg.SendDepth, cfg.SendDepth*cfg.MaxSGE)
	ep.recvBatch = verbs.NewRecvBatch(cfg.RecvDepth, cfg.RecvDepth*cfg.MaxSGE)
	ep.scratch = make([]Request, 1)
	ep.sendTaken = make([]uint32, 0, cfg.SendDepth)
	ep.recvTaken = make([]uint32, 0, cfg.RecvDepth)
	ep.queue.init(cfg.SendDepth + cfg.RecvDepth)
	ep.poller.kick = make(chan struct{}, 1)
	ep.poller.role = make(chan struct{}, 1)
	ep.received = make(chan struct{})
	ep.live.Store(true)
	go ep.pollLoop()
	go ep.deliverLoop()
	ctl := &seam.Control{
		PeerGone: func(cause error) {
			ep.mu.Lock()
			closing := ep.closing
			ep.mu.Unlock()
			switch {
			case closing:
				// This side's Close came first: its own disconnect is what
				// the CM reports (iWARP does, to the side that closes).
				cause = ep.closedHere()
			case ep.ended():
				// An earlier end's cause stands (setDone keeps the first):
				// the port need not be read for this one.
			default:
				// The port only: a peer's orderly close comes this way,
				// once per connection, and listing the host's addresses
				// would cost it more than a port query. Neither device
				// ends a connection by the CM's word when its address is
				// deleted: a request fails, or the peer goes silent.
				cause = whileLocalFault(ep.id.Context(), ep.id.PortNum(), nil, cause)
			}
			ep.setDone(cause)
			ep.disconnect()
		},
		Received:    ep.received,
		Established: func(privateData []byte) { ep.peerData = privateData },
	}
	return ep, ctl, nil
}

// checkLimits refuses, with ErrInvalid and the option that asked, a
// configuration the device cannot hold. Left to the device, each would fail
// later as a bare EINVAL from ibv_create_cq or rdma_create_qp.
func checkLimits(cfg seam.EndpointConfig, dev verbs.DeviceAttr) error {
	entries := cqEntries(cfg)
	switch {
	case cfg.SendDepth > dev.MaxQPWR || cfg.RecvDepth > dev.MaxQPWR:
		return fmt.Errorf("%w: queue depth %d/%d exceeds the device's %d (cm.WithQueueDepth, WithSendDepth, WithRecvDepth)", ErrInvalid, cfg.SendDepth, cfg.RecvDepth, dev.MaxQPWR)
	case entries > dev.MaxCQE:
		return fmt.Errorf("%w: %d sends and %d receives need a completion queue of %d entries; the device's hold at most %d (cm.WithQueueDepth, WithSendDepth, WithRecvDepth)", ErrInvalid, cfg.SendDepth, entries-cfg.SendDepth, entries, dev.MaxCQE)
	case cfg.MaxSGE > dev.MaxSGE:
		return fmt.Errorf("%w: %d scatter/gather entries per request exceed the device's %d (cm.WithMaxSGE)", ErrInvalid, cfg.MaxSGE, dev.MaxSGE)
	}
	return nil
}

// cqEntries sizes the one CQ of both queues, an entry for every slot, so
// that it cannot overflow. With an SRQ, every shared receive may complete
// there.
func cqEntries(cfg seam.EndpointConfig) int {
	if cfg.SRQ != nil {
		return cfg.SendDepth + len(cfg.SRQ.(*SRQ).slots.slots)
	}
	return cfg.SendDepth + cfg.RecvDepth
}

func setDefaults(c *seam.EndpointConfig) {
	if c.SendDepth <= 0 {
		c.SendDepth = 128
	}
	if c.RecvDepth <= 0 {
		c.RecvDepth = 128
	}
	if c.MaxSGE <= 0 {
		c.MaxSGE = 4
	}
	if c.MaxInline < 0 {
		c.MaxInline = 0
	} else if c.MaxInline == 0 {
		c.MaxInline = 64
	}
	if c.SignalEvery <= 0 {
		c.SignalEvery = max(1, c.SendDepth/4)
	}
	if c.Spin <= 0 {
		c.Spin = 50 * time.Microsecond
	}
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = 5 * time.Second
	}
}

// create makes the verbs objects, undoing what it made when a step fails.
func (ep *Endpoint) create(vctx *verbs.Context) (err error) {
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if ep.cfg.PD != nil && seam.DomainOf(ep.cfg.PD) == nil {
		return fmt.Errorf("%w: the shared protection domain (cm.WithPD) is closed", ErrInvalid)
	}
	switch shared := seam.DomainOf(ep.cfg.PD); {
	case ep.srq != nil:
		shared = ep.srq.pd
		fallthrough
	case shared != nil:
		if !shared.OnDevice(vctx) {
			return fmt.Errorf("%w: the shared protection domain is on another device", ErrInvalid)
		}
		if err := shared.Acquire(); err != nil {
			return fmt.Errorf("endpoint: the shared protection domain: %w", err)
		}
		ep.pd = shared
	default:
		if ep.pd, err = seam.NewDomain(vctx); err != nil {
			return err
		}
	}
	undo = append(undo, func() { ep.pd.Release() })
	if ep.ch, err = vctx.NewCompChannel(); err != nil {
		return err
	}
	undo = append(undo, func() { ep.ch.Destroy() })
	if ep.cq, err = vctx.NewCQ(cqEntries(ep.cfg), ep.ch, 64); err != nil {
		return err
	}
	undo = append(undo, func() { ep.cq.Destroy() })
	init := verbs.QPInit{SendCQ: ep.cq, RecvCQ: ep.cq,
		MaxSendWR: ep.cfg.SendDepth, MaxRecvWR: ep.cfg.RecvDepth,
		MaxSendSGE: ep.cfg.MaxSGE, MaxRecvSGE: ep.cfg.MaxSGE, MaxInline: ep.cfg.MaxInline}
	if srq := ep.srq; srq != nil {
		if err = srq.attach(); err != nil {
			return err
		}
		undo = append(undo, srq.detach)
		init.SRQ, init.MaxRecvWR, init.MaxRecvSGE = srq.srq, 0, 0
	}
	if ep.caps, err = ep.id.CreateQP(ep.pd.PD(), init); err != nil {
		return ep.explainCreateQP(init, err)
	}
	undo = append(undo, func() { ep.id.DestroyQP() })
	if ep.wait, err = fdwait.New(ep.ch.Fd(), "completion channel", ep.takeEvent); err != nil {
		return err
	}
	undo = append(undo, func() { ep.wait.Close() })
	ep.unwatch, err = asyncevent.Watch(vctx, ep.deviceEvent, ep.cfg.Logger)
	return err
}

// explainCreateQP names the option behind rdma_create_qp's EINVAL where
// it can. The device publishes no inline limit, so a refused inline size
// shows only as the same QP created without inline data: that one is made,
// destroyed, and the failure reported as WithInline's.
func (ep *Endpoint) explainCreateQP(init verbs.QPInit, err error) error {
	if !errors.Is(err, syscall.EINVAL) || init.MaxInline == 0 {
		return err
	}
	init.MaxInline = 0
	if _, probeErr := ep.id.CreateQP(ep.pd.PD(), init); probeErr != nil {
		return err
	}
	refused := fmt.Errorf("%w: the device does not inline %d bytes (cm.WithInline): %w", ErrInvalid, ep.cfg.MaxInline, err)
	return errors.Join(refused, ep.id.DestroyQP())
}

// PD is the protection domain of the endpoint's QP. Pools and regions made
// on it serve this endpoint, and the endpoints that share its PD
// (cm.WithPD); the peers of other endpoints cannot reach them.
func (ep *Endpoint) PD() *bufpool.PD {
	if !ep.made() {
		return nil
	}
	return ep.pdv
}

// LocalAddr is this side's address of the connection.
func (ep *Endpoint) LocalAddr() net.Addr {
	if !ep.made() {
		return nil
	}
	return ep.cfg.LocalAddr
}

// RemoteAddr is the peer's address.
func (ep *Endpoint) RemoteAddr() net.Addr {
	if !ep.made() {
		return nil
	}
	return ep.cfg.RemoteAddr
}

// PrivateData is what the peer sent with the connection: its connect
// request's private data on the accepting side, its accept's on the
// dialing side. The CM may pad it with zeros to the transport's size.
func (ep *Endpoint) PrivateData() []byte {
	if !ep.made() {
		return nil
	}
	return ep.peerData
}

// Completions delivers one Completion per posted work request (Silent ones
// only when they fail; those with a Notify channel go there instead), each
// once the device has finished it. Receives come in posting order, and so
// do sends and writes; a READ's or an atomic's comes when its response has
// arrived, which siw reports after the sends posted behind it. At the end
// of the connection the device flushes what it holds, each with an error
// matching ErrClosed, except on siw a send posted after the peer's
// terminate failed the QP and before this side heard: it stays in the
// send queue, which the device no longer reads. After Close it delivers
// every remaining one, each with an error matching ErrClosed, and is then
// closed: read it until it is closed, or use CloseAndDrain. If nobody
// reads it for the close timeout after Close (cm.WithCloseTimeout,
// default 5 s), the completions not read are dropped and their buffers
// put back in their pools.
func (ep *Endpoint) Completions() <-chan Completion {
	if !ep.made() {
		return noCompletions
	}
	return ep.queue.out
}

// Done is closed when the connection has ended: Close, the peer left, or
// the endpoint failed (Err says which).
func (ep *Endpoint) Done() <-chan struct{} {
	if !ep.made() {
		return seam.Closed
	}
	return ep.done
}

// Err says why Done closed (nil while the connection is up): after Close,
// an error matching ErrClosed and net.ErrClosed; when the peer left,
// polling the CQ or waiting on its channel failed (the endpoint then
// closes itself), or the device reported a failure (ErrDeviceFailure),
// one matching ErrClosed but not net.ErrClosed; or one
// holding the *CompletionError of a work request that failed and took the
// connection down with it (errors.As finds it; it matches ErrClosed too).
// On RC, a failed work request moves the QP to the error state; Done then
// closes within 100 ms, unless the CM says first that the peer left, and
// posts are refused with the request's error from its completion on (the
// device would never complete them). A completion flushed while nothing
// on this side ended the connection (the peer's bad request failed the
// QP here, say) closes Done within a second, with the flush's
// *CompletionError, unless the CM says first that the peer left; posts
// are taken meanwhile. Once Done is closed, posts are
// refused with this error, and after Close with one matching
// net.ErrClosed.
func (ep *Endpoint) Err() error {
	if !ep.made() {
		return errNeverMade
	}
	if p := ep.doneErr.Load(); p != nil {
		return *p
	}
	return nil
}

// failed is why a post is refused before Close: Err once the connection
// is over, and already from a work request's failure on the device on,
// before its grace closes Done. The failure moved the QP to the error
// state, and the device flushed only what it held then: a request posted
// after it would never complete before Close. ep.mu is held.
func (ep *Endpoint) failed() error {
	if ep.ended() {
		return ep.Err()
	}
	if ep.failure != nil {
		return seam.Ended(ep.failure, ErrClosed)
	}
	return nil
}

// ended says Done is closed.
func (ep *Endpoint) ended() bool {
	select {
	case <-ep.done:
		return true
	default:
		return false
	}
}

// setDone ends the endpoint with cause (nil: this side's Close). Err then
// matches ErrClosed whatever the cause, as every error of an endpoint that
// is over does: a work request the device failed is kept inside.
func (ep *Endpoint) setDone(cause error) {
	ep.doneOnce.Do(func() {
		if cause == nil {
			cause = errClosedHere
		}
		cause = seam.Ended(cause, ErrClosed)
		ep.doneErr.Store(&cause)
		close(ep.done)
	})
}

// MaxInline is the inline size the device granted.
func (ep *Endpoint) MaxInline() int {
	if !ep.made() {
		return 0
	}
	return ep.caps.MaxInline
}

// CloseAndDrain closes the endpoint and reads Completions until it is
// closed, handing each remaining completion to each; with each nil, it
// puts every remaining completion's buffer back in its pool. It returns
// Close's error.
func (ep *Endpoint) CloseAndDrain(each func(Completion)) error {
	if !ep.made() {
		return errNotMade
	}
	err := ep.Close()
	for c := range ep.queue.out {
		switch {
		case each != nil:
			each(c)
		case c.Buffer != nil:
			seam.PutBack(c.Buffer)
		}
	}
	return err
}

// Close disconnects, waits (at most Config.CloseTimeout) for the device to
// hand back every posted work request that owes a completion (unsignaled
// sends after the last signaled one owe none), completes each pending
// context with an error matching ErrClosed, and destroys the QP, CQ and
// channel, then the connection id. Safe to call many times and
// concurrently with posts; every call returns the same result. Posts and
// Next after it fail with an error matching net.ErrClosed, whatever ended
// the endpoint first, as net's conns do after their Close; Err keeps why
// it ended.
func (ep *Endpoint) Close() error {
	if !ep.made() {
		return errNotMade
	}
	ep.calledClose.Store(true)
	return ep.closeWith(errClosedHere)
}

// made says whether ep was made by cm's Dial or Accept. A nil or zero
// Endpoint is one that ended before it began: its calls fail with
// errNotMade, Done and Completions are closed, and its other accessors
// give zero values, instead of panicking or waiting for ever.
func (ep *Endpoint) made() bool { return ep != nil && ep.done != nil }

var errNotMade = fmt.Errorf("%w: an Endpoint not made by cm's Dial or Accept", ErrInvalid)

// errNeverMade is an unmade Endpoint's Err: like every ended endpoint's,
// it matches ErrClosed.
var errNeverMade = seam.Ended(errNotMade, ErrClosed)

// noCompletions is an unmade Endpoint's Completions: closed, as an ended
// endpoint's is once drained.
var noCompletions = seam.ClosedChan[Completion]()

// closeWith is Close, which reports cause (it matches ErrClosed) as why
// the endpoint ended and in every error the close causes: package msg
// closes its endpoint with its connection's error (seam.CloseEndpoint), so
// that only the application's Close reads as net.ErrClosed. The first
// close's cause holds.
func (ep *Endpoint) closeWith(cause error) error {
	ep.closeOnce.Do(func() {
		ep.endWith(cause)
		ep.poller.wake()
		<-ep.pollDone
	})
	return ep.closeErr
}

// endWith ends the endpoint with cause, without waiting for the teardown:
// it starts closing (which wakes the completion goroutine, or a caller of
// Next), disconnects, so that posted work flushes back and the peer hears,
// and closes Done. Close and failHere both end so. first says whether
// cause is the one that holds.
func (ep *Endpoint) endWith(cause error) (first bool) {
	first = ep.startClosing(cause)
	ep.disconnect()
	ep.setDone(ep.closedHere())
	return first
}
