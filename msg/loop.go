package msg

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
)

// handle takes one of the endpoint's completions (its handler): received
// messages go to the inbox, credits to the count, send buffers back to
// their pool, rendezvous reads start and finish here. The endpoint calls
// it in whichever goroutine polls its CQ (its completion goroutine, or a
// reader in recv), one completion at a time and in order, so it owns what
// is marked handle's own; it must never block: the inbox holds as many
// messages as there are receives.
func (c *Conn) handle(comp endpoint.Completion) {
	switch comp.Op {
	case endpoint.OpSend:
		switch tok := comp.Context.(type) {
		case sendToken, probeToken:
			c.sendPool.Put(comp.Buffer)
			c.mu.Lock()
			if p, ok := tok.(probeToken); ok && comp.Err == nil {
				c.stats.KeepaliveRTT = time.Since(p.posted)
			}
			c.signal() // for flush
			c.mu.Unlock()
		}
		switch {
		case errors.Is(comp.Err, endpoint.ErrClosed):
			// Flushed: the connection is over, but why (the peer's
			// goodbye, a crash) is the receive side's to say, after
			// every message that arrived before; the send and receive
			// queues' completions are not ordered with each other.
			// Closing the endpoint flushes the receives that say it,
			// once the endpoint has had its chance to learn why: its
			// own Close would give it a reason of its own.
			c.awaitEndCause()
			c.mu.Lock()
			c.closeEndpointLocked()
			c.mu.Unlock()
		case comp.Err != nil:
			c.fail(c.endError("send", comp.Err))
		}
	case endpoint.OpRecv:
		if comp.Err != nil {
			c.recvPool.Put(comp.Buffer)
			c.fail(c.endError("receive", comp.Err))
			c.recvFlushed = true
			c.endReceivesIfAllIn()
			return
		}
		if err := c.received(comp.Buffer, comp.Len); err != nil {
			c.recvPool.Put(comp.Buffer)
			c.fail(err)
		}
	case endpoint.OpRead:
		rr := comp.Context.(*rendezvousRead)
		c.mu.Lock()
		c.reading--
		// Silence counts from the end of the read, not from the last
		// check: on rxe the READ runs inside the post call, which
		// holds the endpoint for its length, so the control loop's
		// own posts (and with them its checks) may have waited too.
		c.lastRecv = time.Now()
		c.mu.Unlock()
		if comp.Err != nil {
			rr.region.Close()
			c.fail(c.rendezvousError(rr.info.Length, comp.Err))
			c.rvReads--
			c.endReceivesIfAllIn()
			return
		}
		// The confirmation is owed before the application can have the
		// message: a Close right after its Recv waits for it
		// (sayGoodbye).
		c.mu.Lock()
		c.stats.RendezvousReceived++
		c.stats.RendezvousBytesReceived += uint64(rr.size)
		c.dones = append(c.dones, rr.info.RVID)
		c.wakeControl()
		c.mu.Unlock()
		c.deliver(arrival{typ: rr.info.Type, id: rr.hdr.ID, payload: rr.region.Bytes()[:rr.size], region: rr.region})
		if c.rvReads--; c.rvReads == 0 && c.heldEOF != nil {
			c.inbox <- *c.heldEOF // after every message announced before it
			c.heldEOF = nil
		}
		c.endReceivesIfAllIn()
	}
}

// ended runs once after the endpoint's last completion (its handler's
// end): the endpoint is gone, closed here or because the peer left.
func (c *Conn) ended() {
	if c.heldEOF != nil { // a rendezvous read before it failed
		c.recvPool.Put(c.heldEOF.buf)
		c.heldEOF = nil
	}
	c.fail(c.endError("receive", ErrClosed))
	c.endReceives()
	close(c.handlerDone)
}

// deliver hands an arrived message to the router (setRouter) when it takes
// it, in this goroutine: an RPC response goes straight to its caller, a
// request straight to its handler, with no goroutine hand-off in between.
// Everything else goes to the inbox, in order.
func (c *Conn) deliver(r arrival) {
	if route := c.router.Load(); route != nil {
		switch (*route)(r) {
		case routed:
			return
		case toInboxHanded:
			r.handed = true
		}
	}
	c.inbox <- r
}

// routing is a router's verdict on an arrival (setRouter).
type routing uint8

const (
	toInbox       routing = iota // the inbox takes it, in order
	routed                       // the router took it, and owns it
	toInboxHanded                // the inbox takes it, marked handed (serveConn)
)

// setRouter makes route the first to see every message that arrives from
// now on. route runs in the connection's completion handler (handle): it
// must not block, and it owns what it takes (it releases it).
func (c *Conn) setRouter(route func(arrival) routing) { c.router.Store(&route) }

// endReceives says every message that arrived is in the inbox
// (recvEnded). Idempotent.
func (c *Conn) endReceives() { c.recvEndOnce.Do(func() { close(c.recvEnded) }) }

// endReceivesIfAllIn calls endReceives once a receive has come back failed
// (none after it arrived) and no rendezvous read is in flight; handle's own.
func (c *Conn) endReceivesIfAllIn() {
	if c.recvFlushed && c.rvReads == 0 {
		c.endReceives()
	}
}

// awaitEndCause waits (seam.AwaitEnd: as long as the CM's word may lag the
// device's failure) for the endpoint to learn why the connection ended,
// unless this side knows already (an error of its own, its Close, the
// peer's goodbye).
func (c *Conn) awaitEndCause() {
	c.mu.Lock()
	known := c.err != nil || c.peerClosed
	c.mu.Unlock()
	if !known {
		seam.AwaitEnd(c.ep)
	}
}

// endCause waits (awaitEndCause) for the endpoint to learn why the
// connection ended, and returns the endpoint's reason (nil if it has none)
// and whether the peer said goodbye.
func (c *Conn) endCause() (reason error, peerClosed bool) {
	c.awaitEndCause()
	c.mu.Lock()
	peerClosed = c.peerClosed
	c.mu.Unlock()
	return c.ep.Err(), peerClosed
}

// endError is why the connection ended when one of its work requests failed
// (what: "send" or "receive"): the peer's goodbye if it came, else the
// endpoint's reason (the peer disconnected, ...) if it has one or gets one
// within the endpoint's grace, else the failure itself. A device's failure
// and the CM's word race when the peer leaves: siw flushes the queues, or
// fails the send in progress with a local error, before the CM reports.
func (c *Conn) endError(what string, err error) error {
	reason, peerClosed := c.endCause()
	c.mu.Lock()
	saidGoodbye := c.closing && !c.confirmFirst
	c.mu.Unlock()
	switch {
	case peerClosed:
		return ErrPeerClosed
	case saidGoodbye:
		// This side's Close said goodbye, or Abort is closing: the end
		// is its own, though on iWARP the peer's disconnect, on reading
		// the goodbye, may be what this side sees first (sayGoodbye).
		return seam.ErrClosedHere
	case reason == nil:
	case errors.Is(reason, err) && !errors.Is(err, endpoint.ErrClosed):
		// The endpoint ended with this very failure, nothing else
		// first: say where it came from.
	default:
		return reason
	}
	return fmt.Errorf("msg: %s: %w", what, err)
}

// received handles one arrived message in receive buffer b.
func (c *Conn) received(b *bufpool.Buffer, n int) error {
	var h Header
	if err := h.Decode(b.Bytes()[:n]); err != nil {
		return err
	}
	c.mu.Lock()
	c.receivedTotal++
	c.stats.MessagesReceived++
	c.lastRecv = time.Now()
	if !c.mayTalk { // the dialer's first message: this side may speak now
		c.mayTalk = true
		c.signal()
		c.wakeControl()
	}
	if h.Credits > 0 { // sends may go
		c.credits += int(h.Credits)
		c.signal()
	}
	c.peerReleased = h.Released
	c.peerWantsCredit = h.Flags&FlagWantsCredit != 0
	if c.peerWantsCredit {
		c.stats.CreditAsksReceived++
	}
	if c.creditStateLocked(c.eofWaitingLocked()).due() { // the peer may be starving
		c.wakeControl()
	}
	c.mu.Unlock()
	switch h.Type {
	case TypeCredit:
		c.repost(b)
	case TypeClose:
		// The peer disconnects next (on iWARP this side does, below); the
		// end is ErrPeerClosed either way.
		c.mu.Lock()
		c.peerClosed = true
		closing := c.closing
		c.signal() // a Close may wait for it (awaitPeerDisconnect)
		c.mu.Unlock()
		c.recvPool.Put(b)
		if !closing && seam.SendsCompleteLocally(c.ep) {
			// On iWARP this side disconnects first (sayGoodbye): from
			// now on it sends nothing, and everything it sent before
			// reaches the peer ahead of the disconnect.
			c.fail(ErrPeerClosed)
		}
	case TypeCloseWrite:
		// The reader's io.EOF, once the messages before it are read. Its
		// buffer (a credit) goes back when RecvMessage takes it.
		r := arrival{typ: h.Type, buf: b}
		if c.rvReads > 0 {
			c.heldEOF = &r
		} else {
			c.inbox <- r
		}
	case TypeRendezvousDone:
		c.mu.Lock()
		p, ok := c.rvSend[h.ID]
		delete(c.rvSend, h.ID)
		c.mu.Unlock()
		c.repost(b)
		if !ok {
			return fmt.Errorf("%w: done for rendezvous %d, which is not pending", ErrMalformed, h.ID)
		}
		c.giveBack(p)
		close(p.done)
	case TypeRendezvous:
		var info rendezvousInfo
		if err := info.decode(b.Bytes()[HeaderSize:n]); err != nil {
			return err
		}
		var headBytes [maxRendezvousHead]byte // the receive is reposted next
		head := headBytes[:copy(headBytes[:], info.Head)]
		info.Head = nil
		// The receive is free again at once, but its credit is withheld
		// until the message is released: rendezvous messages count
		// against the receive depth like the others.
		if err := c.ep.PostRecv(nil, b); err != nil {
			c.recvPool.Put(b)
		}
		// The read counts as in flight from here: registering a large
		// region can take this goroutine, which also takes the peer's
		// messages, for seconds, and the keepalive must not read that as
		// the peer's silence.
		c.mu.Lock()
		c.reading++
		c.mu.Unlock()
		if err := c.readRendezvous(info, head, h); err != nil {
			c.mu.Lock()
			c.reading--
			c.mu.Unlock()
			return err
		}
		c.rvReads++
	default:
		c.deliver(arrival{typ: h.Type, id: h.ID, payload: b.Bytes()[HeaderSize:n], buf: b})
	}
	return nil
}

// readRendezvous registers a region for the peer's rendezvous message,
// writes the offer's head at its start and posts the RDMA READ that
// fetches the rest behind it; its completion delivers the message. The
// region is registered for remote write, as iWARP requires of a READ's
// sink; its key never leaves this side. An offer larger than this side
// receives (WithMaxRecvSize) ends the connection before anything is
// registered.
func (c *Conn) readRendezvous(info rendezvousInfo, head []byte, h Header) error {
	size := len(head) + int(info.Length)
	if size > c.o.maxRecv { // the hello told the peer so: it is not a msg peer, or a broken one
		return fmt.Errorf("%w: the peer offered a %d-byte message, more than the %d this side receives", ErrMalformed, size, c.o.maxRecv)
	}
	region, err := c.rv.get(size, bufpool.RemoteWrite)
	if err != nil {
		return fmt.Errorf("msg: a region for a %d-byte rendezvous: %w", size, err)
	}
	copy(region.Bytes(), head)
	rr := &rendezvousRead{info: info, hdr: h, region: region, size: size}
	sink, err := region.Buffer().Segment(len(head), int(info.Length))
	if err == nil {
		err = c.ep.PostReadv(rr, []bufpool.Segment{sink}, bufpool.Remote{Addr: info.Addr, RKey: info.RKey, Len: uint64(info.Length)})
	}
	if err != nil {
		region.Close()
		return c.rendezvousError(info.Length, err)
	}
	return nil
}

// rendezvousError is why a rendezvous read failed. When the connection
// ended under it (the device flushed the read, or refused it as the queue
// pair left the state that sends, or the peer's side failed it because the
// peer's process died and took its memory's registration with it before
// its connection) the endpoint's reason says why, once it has one or gets
// one within the endpoint's grace, as for a flushed receive. A failure the
// CM does not explain within the grace (a live peer's bad key) ends the
// endpoint itself, and stays. After the peer's goodbye the read's own
// failure stays too: the peer left with a message announced and not yet
// read.
func (c *Conn) rendezvousError(length uint32, err error) error {
	_, refused := errors.AsType[*endpoint.PostError](err)
	_, failed := errors.AsType[*endpoint.CompletionError](err)
	if refused || failed || errors.Is(err, endpoint.ErrClosed) {
		if reason, peerClosed := c.endCause(); reason != nil && !peerClosed && !errors.Is(reason, err) {
			err = reason
		}
	}
	return fmt.Errorf("msg: reading a %d-byte rendezvous: %w", length, err)
}

// controlLoop sends what the protocol itself owes the peer: rendezvous
// confirmations, credits when half the receives were reposted and no
// message carried them, and keepalives when nothing else was sent for an
// interval. It may use the credit send keeps back. It also ends the
// connection when the peer, able to send, has been silent too long.
func (c *Conn) controlLoop() {
	defer close(c.ctrlDone)
	var tick <-chan time.Time
	if c.checkEvery > 0 {
		t := time.NewTicker(c.checkEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		if silent := c.checkSilence(time.Now()); silent != nil {
			c.mu.Unlock()
			// A peer silent because this side's link or address went
			// away: the error says so.
			c.fail(seam.EndpointWhileLocalFault(c.ep, silent))
			return
		}
		if m, ok := c.takeStreamLocked(false); ok { // a credit came for the stream's held bytes
			c.mu.Unlock()
			c.postStream(m) // a refusal ends the connection
			continue
		}
		eofWaiting := c.eofWaitingLocked()
		cs := c.creditStateLocked(eofWaiting)
		eofDue := eofWaiting && cs.dataMayGo()
		keepaliveDue := c.keepaliveEvery > 0 && time.Since(c.lastSend) >= c.keepaliveEvery
		other := c.greet || eofDue || len(c.dones) > 0 || keepaliveDue
		owed := c.mayTalk && cs.controlOwed(other, c.askedForCredit, c.creditWaiters > 0)
		switch {
		case c.closing: // only confirmations the goodbye waits for
			owed = c.mayTalk && c.confirmFirst && len(c.dones) > 0
		case c.peerClosed:
			// The peer said goodbye and disconnects next: it sends
			// nothing more, so credits, asks and keepalives are for
			// nothing, and on iWARP one that reaches it after it stopped
			// reading makes siw reset the connection (TCPAbortOnClose).
			owed = false
		}
		var b *bufpool.Buffer
		if owed && cs.mayControl() {
			b, _ = c.sendPool.TryGet()
		}
		if b == nil { // nothing owed, or no credit or buffer yet: wait for a change or a tick
			// Owing, it waits for a credit or a buffer; with stream
			// bytes held, for a credit or the end of a copy or a post.
			// Otherwise for work (wakeControl) or the tick alone.
			var ch <-chan struct{}
			held := !c.streamEmptyLocked()
			if owed || held || eofWaiting {
				ch = c.changes()
			}
			if held {
				c.stream.watched = true
			}
			kick := owed || c.streamWaitingLocked()
			c.mu.Unlock()
			if kick {
				seam.Kick(c.ep) // the credit or buffer comes with a completion nobody may be polling for
			}
			select {
			case <-ch:
			case <-c.ctrlWake:
			case <-tick:
			}
			if kick {
				seam.KickDone(c.ep)
			}
			continue
		}
		h := Header{Type: TypeCredit}
		c.greet = false
		switch {
		case len(c.dones) > 0:
			h = Header{Type: TypeRendezvousDone, ID: c.dones[0]}
			c.dones = c.dones[1:]
			c.confirming = true
		case eofDue:
			h = Header{Type: TypeCloseWrite}
			c.eofOwed = false
		}
		c.takeCreditLocked(&h)
		c.mu.Unlock()
		h.Encode(b.Bytes())
		_ = c.post(outgoing{b: b, h: h, probe: keepaliveDue}) // a refusal is post's to handle
		if h.Type == TypeRendezvousDone {
			c.mu.Lock()
			c.confirming = false
			c.signal() // a goodbye may wait for it
			c.mu.Unlock()
		}
	}
}

// creditStateLocked is what the credit rules (creditState) look at now;
// eofWaiting: eofWaitingLocked's answer, taken once by a caller that
// needs it too. c.mu is held.
func (c *Conn) creditStateLocked(eofWaiting bool) creditState {
	return creditState{
		credits:     c.credits,
		toGrant:     c.toGrant,
		grantAt:     c.grantAt,
		released:    c.toGrantReleased > 0,
		peerCredits: c.peerCredits(),
		peerWants:   c.peerWantsCredit,
		dataWaits:   c.mayTalk && (c.creditWaiters > 0 || c.streamWaitingLocked() || eofWaiting),
		peerRoom:    int(int32(uint32(c.peerDepth) + c.peerReleased - c.dataSent)),
		dialer:      c.dialer,
	}
}

// eofWaitingLocked says the end of data (CloseWrite's) waits for nothing
// but a credit: every message let through before it is queued; c.mu is
// held.
func (c *Conn) eofWaitingLocked() bool {
	return c.eofOwed && c.posting.Load() == 0 && c.streamEmptyLocked()
}

// peerCredits is how many messages the peer may send at most (fewer if
// some are on their way); c.mu is held.
func (c *Conn) peerCredits() int { return c.o.recvDepth + c.granted - c.receivedTotal }

// checkSilence is the keepalive rule; c.mu is held. The peer sends at
// least every keepalive interval while it has two credits or more, so
// silence longer than the timeout while it had them means the peer or the
// link is gone. (With one, it may send only if it has credits to give
// this side, and it may not: this side would grant it more otherwise,
// unless it holds the peer's messages. With none or one, silence is this
// side's doing and does not count. Nor does it while a rendezvous
// read is in flight either way, and a large read on a slow link outlasts
// the timeout: while the peer reads one of this side's regions, its
// messages are behind the RDMA READ in the connection's packet order;
// while this side reads one of the peer's (counted from the announcement:
// registering the region takes the goroutine that takes the peer's
// messages), those messages wait.)
//
// Nor does time in which this side itself did not run: a check later than
// one tick after the previous one means the process was stopped (a GC
// stop-the-world waiting on a long non-preemptible copy, a descheduled
// VM), and the peer's messages could not be taken then either.
func (c *Conn) checkSilence(now time.Time) error {
	if c.o.keepaliveTimeout <= 0 {
		return nil
	}
	if tick := c.checkEvery; tick > 0 && !c.lastCheck.IsZero() {
		// Stopped from stalledFrom to now. A message taken since then
		// (lastRecv later) was heard after the stop: nothing to discount.
		if stalledFrom := c.lastCheck.Add(tick); now.After(stalledFrom) && c.lastRecv.Before(stalledFrom) {
			c.lastRecv = c.lastRecv.Add(now.Sub(stalledFrom))
		}
	}
	c.lastCheck = now
	if c.peerCredits() <= 1 || len(c.rvSend) > 0 || c.reading > 0 {
		c.lastRecv = now
		return nil
	}
	if d := now.Sub(c.lastRecv); d > c.o.keepaliveTimeout {
		return fmt.Errorf("%w for %v: %w", ErrPeerSilent, d.Round(time.Millisecond), ErrClosed)
	}
	return nil
}

// binder is a connection's completion handler from the moment its
// endpoint exists, before its Conn does: completions that come first wait
// in early, and attach hands them to the Conn, in order, before any later
// one. If no Conn is ever attached (the set-up failed), abandon puts their
// buffers back (discard), and those of completions still to come: an
// endpoint cm closes after Dial returned (an iWARP connect abandoned in
// the kernel) flushes its receives later.
type binder struct {
	c         atomic.Pointer[Conn]
	mu        sync.Mutex
	early     []endpoint.Completion
	ended     bool // the endpoint's last completion came before the Conn
	discarded bool // no Conn will come: buffers go back as they arrive
}

// handle is the endpoint's handler; it runs one completion at a time.
func (b *binder) handle(comp endpoint.Completion) {
	if c := b.c.Load(); c != nil {
		c.handle(comp)
		return
	}
	b.mu.Lock()
	if c := b.c.Load(); c != nil { // attached meanwhile, after early was handed over
		b.mu.Unlock()
		c.handle(comp)
		return
	}
	if b.discarded {
		b.mu.Unlock()
		if comp.Buffer != nil {
			seam.PutBack(comp.Buffer)
		}
		return
	}
	b.early = append(b.early, comp)
	b.mu.Unlock()
}

// end is the endpoint's handler end.
func (b *binder) end() {
	b.mu.Lock()
	c := b.c.Load()
	if c == nil {
		b.ended = true
	}
	b.mu.Unlock()
	if c != nil {
		c.ended()
	}
}

// attach makes c the handler of what came and what comes.
func (b *binder) attach(c *Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.early {
		c.handle(b.early[i])
	}
	b.early = nil
	if b.ended {
		c.ended()
	}
	b.c.Store(c)
}

// renew forgets the end of the endpoint b served, which closed before a
// Conn was attached, so that b can serve the next one (cm.Dial's next
// try; see postReceives). discard has put that endpoint's buffers back.
func (b *binder) renew() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended, b.discarded = false, false
}

// discard puts back the buffers of what came for a Conn that was never
// made, and of what comes later.
func (b *binder) discard() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, comp := range b.early {
		if comp.Buffer != nil {
			seam.PutBack(comp.Buffer)
		}
	}
	b.early, b.discarded = nil, true
}
