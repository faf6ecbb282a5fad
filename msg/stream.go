package msg

import (
	"context"
	"fmt"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
)

// A byte stream (package rdmanet's, through seam.WriteStream) is written as
// TypeData messages whose boundaries mean nothing to its reader, so
// consecutive writes may share a message. Every write is copied into the
// connection's open stream message, which leaves at once while the reader
// keeps up: a lone write, or a ping-pong's, waits for nothing. While it
// does not, the write returns with its bytes held in the open message, and
// the writes after it fill that message up, to MaxInline. The reader is
// behind when no credit is free, or, when the peer reads as a stream too,
// when half its receives or more hold messages it has not given back
// (holdingLocked); the message leaves with the credits the peer returns,
// posted by whoever sees them first: a write, or the control loop. Only a
// write that finds the open message full waits, and only for a credit. This
// is what TCP does with bytes its peer's window will not take yet, and for
// the same reason: each message costs a receive, a credit and a doorbell
// whatever its size, so a reader that is behind gets the bytes of many
// writes in one message.
//
// The open message and its state are under c.mu; only one write runs at a
// time (the caller serializes them). stream.buf is the open message's send
// buffer (nil: none), stream.n its payload bytes; filling: a write is
// copying into it outside the lock; leaving: it was taken to be posted and
// is not queued yet, so that nothing of the stream can overtake it.
// watched: a goroutine waits for filling or leaving to end (streamWaitLocked,
// or the control loop while bytes are held); only then do their ends
// signal, so that a write that leaves at once wakes nobody.
type streamState struct {
	buf                       *bufpool.Buffer
	n                         int
	filling, leaving, watched bool
}

func init() {
	seam.WriteStream = func(c any, ctx context.Context, p []byte) error {
		return c.(*Conn).writeStream(ctx, p)
	}
	seam.FillStream = func(c any, ctx context.Context, fill func(p []byte) int) error {
		return c.(*Conn).fillStream(ctx, fill)
	}
	seam.CloseWithin = func(c any, d time.Duration) error {
		return c.(*Conn).close(goodbyeBounds{peer: d, total: d})
	}
	seam.ReadStream = func(c any, ctx context.Context, m any) error {
		return c.(*Conn).recvInto(ctx, m.(*Message))
	}
}

// writeStream writes p (at most MaxInline bytes) to the stream: it returns
// once p is posted or held in the open stream message. It fails as Send
// does; bytes it held are sent later, or lost with the connection.
func (c *Conn) writeStream(ctx context.Context, p []byte) error {
	if c.writeClosed.Load() { // even after the connection ended, as send
		return ErrWriteClosed
	}
	if len(p) > c.maxInline {
		return fmt.Errorf("msg: stream write of %d bytes, more than MaxInline (%d): %w", len(p), c.maxInline, endpoint.ErrInvalid)
	}
	var spare *bufpool.Buffer // a send buffer this call took for a new open message
	defer func() {
		if spare != nil {
			c.sendPool.Put(spare)
		}
	}()
	waited := false
	s := &c.stream
	c.mu.Lock()
	for {
		if err := c.streamRefusalLocked(); err != nil {
			c.mu.Unlock()
			return err
		}
		switch {
		case s.buf != nil && s.n+len(p) <= c.maxInline:
			return c.appendStreamLocked(p)
		case s.buf != nil: // full: it must leave first
			if err := c.makeRoomLocked(ctx, &waited); err != nil {
				return err
			}
		case spare != nil:
			s.buf, s.n, spare = spare, 0, nil
		default:
			c.mu.Unlock()
			b, err := c.sendBuffer(ctx)
			if err != nil {
				return err
			}
			spare = b
			c.mu.Lock()
		}
	}
}

// appendStreamLocked copies p into the open stream message, which has
// room for it, and posts the message if it may leave now; c.mu is held on
// entry and released. The copy runs outside the lock (filling), so that
// the completion handler, which takes c.mu for every arrival, does not
// wait for it.
func (c *Conn) appendStreamLocked(p []byte) error {
	s := &c.stream
	at := HeaderSize + s.n
	s.n += len(p)
	s.filling = true
	b := s.buf
	c.mu.Unlock()
	copy(b.Bytes()[at:], p)
	c.mu.Lock()
	s.filling = false
	c.streamMovedLocked()
	if c.err != nil { // it ended during the copy: Close drops the message
		err := c.endedLocked()
		c.mu.Unlock()
		return err
	}
	return c.leaveOrHoldLocked(at == HeaderSize)
}

// leaveOrHoldLocked posts the open stream message if it may leave now;
// otherwise it stays held, and when it was just opened (fresh) the
// control loop is told, to send it with the next credit. c.mu is held on
// entry and released.
func (c *Conn) leaveOrHoldLocked(fresh bool) error {
	m, ok := c.takeStreamLocked(false)
	c.mu.Unlock()
	if ok {
		return c.postStream(m)
	}
	if fresh {
		c.wakeControl()
	}
	return nil
}

// fillStream is seam.FillStream: fill writes into a send buffer of its
// own, outside the stream's state and with no lock held, so that a fill
// that blocks (a source waiting for input) holds up neither the control
// loop nor Close. Its n bytes then become the open stream message, after
// the bytes earlier writes left held; where they fit in that held message
// they are copied into it instead, so that small fills still share a
// message while no credit is free. A count outside the payload is
// refused with endpoint.ErrInvalid and sends nothing.
func (c *Conn) fillStream(ctx context.Context, fill func(p []byte) int) error {
	c.mu.Lock()
	err := c.streamRefusalLocked()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	b, err := c.sendBuffer(ctx)
	if err != nil {
		return err
	}
	payload := b.Bytes()[HeaderSize : HeaderSize+c.maxInline]
	n := fill(payload)
	if n <= 0 || n > len(payload) {
		c.sendPool.Put(b)
		if n == 0 {
			return nil
		}
		return fmt.Errorf("msg: stream fill of %d bytes into %d: %w", n, len(payload), endpoint.ErrInvalid)
	}
	s := &c.stream
	waited := false
	c.mu.Lock()
	for {
		if err := c.streamRefusalLocked(); err != nil {
			c.mu.Unlock()
			c.sendPool.Put(b)
			return err
		}
		switch {
		case s.buf == nil:
			s.buf, s.n = b, n
			return c.leaveOrHoldLocked(true)
		case s.n+n <= c.maxInline:
			err := c.appendStreamLocked(payload[:n])
			c.sendPool.Put(b)
			return err
		default: // the held message must leave first
			if err := c.makeRoomLocked(ctx, &waited); err != nil {
				c.sendPool.Put(b)
				return err
			}
		}
	}
}

// streamMovedLocked wakes the goroutines waiting for the stream's open
// message to move on, if any; c.mu is held.
func (c *Conn) streamMovedLocked() {
	if c.stream.watched {
		c.stream.watched = false
		c.signal()
	}
}

// streamWaitLocked waits, as awaitChangeLocked, for a change that includes
// the open stream message's filling or leaving ending.
func (c *Conn) streamWaitLocked(ctx context.Context) error {
	c.stream.watched = true
	return c.awaitChangeLocked(ctx)
}

// streamRefusalLocked is why the stream takes no more bytes: the
// connection ended, or Close or CloseWrite was called; c.mu is held.
func (c *Conn) streamRefusalLocked() error {
	if c.err != nil {
		return c.endedLocked()
	}
	return c.refuseLocked()
}

// streamWaitingLocked says the open stream message waits for nothing but
// a credit to leave; c.mu is held.
func (c *Conn) streamWaitingLocked() bool {
	s := &c.stream
	return s.buf != nil && !s.filling && !s.leaving && c.err == nil
}

// holdAt is the credits at or below which the open stream message is held
// for more writes although a credit is free: when the peer owes half its
// receives or more, rounded up, if the peer reads as a stream. Its reader
// then releases each message before it waits for the next, so the credits
// come back once it has caught up, and the held message leaves with them.
// A peer that reads messages (a msg Conn's application) may hold some for
// good while it waits for the next, which a held message would never
// become: facing it, the stream holds nothing a credit would let go.
func holdAt(peer hello) int {
	if peer.streamReader {
		return peer.recvDepth / 2
	}
	return dataReserve
}

// holdingLocked says the open stream message, not full, keeps taking
// writes although a credit is free (holdAt): the peer's reader is behind,
// and the peer's credit rule returns its receives in one credit message
// once it has read them (creditState.due), which lets the message leave.
// Before Close's goodbye or CloseWrite's end of data nothing is held back
// for more. c.mu is held.
func (c *Conn) holdingLocked() bool {
	return c.credits <= c.holdAt && c.stream.n < c.maxInline && !c.closing && !c.writeClosed.Load()
}

// streamEmptyLocked says no stream bytes wait to be queued; c.mu is held.
func (c *Conn) streamEmptyLocked() bool { return c.stream.buf == nil && !c.stream.leaving }

// takeStreamLocked takes the open stream message to post, if it can leave
// now: a credit is free beyond those kept back (dataReserve), and the
// message is not held for more bytes (holdingLocked) unless full says a
// write waits for its room; c.mu is held. The caller posts it with
// postStream.
func (c *Conn) takeStreamLocked(full bool) (outgoing, bool) {
	if !c.streamWaitingLocked() || !c.mayTalk || c.credits <= dataReserve {
		return outgoing{}, false
	}
	if !full && c.holdingLocked() {
		return outgoing{}, false
	}
	s := &c.stream
	h := Header{Type: TypeData, Length: uint32(s.n)}
	c.takeCreditLocked(&h)
	h.Encode(s.buf.Bytes())
	m := outgoing{b: s.buf, h: h}
	s.buf, s.n, s.leaving = nil, 0, true
	return m, true
}

// postStream posts the stream message takeStreamLocked took, then
// whatever was appended to the next one meanwhile, if it may leave too.
// The error is the first refusal (which also ends the connection).
func (c *Conn) postStream(m outgoing) error {
	err := c.post(m)
	for {
		c.mu.Lock()
		c.stream.leaving = false
		ok := false
		if err == nil {
			m, ok = c.takeStreamLocked(false)
		}
		if !ok {
			c.streamMovedLocked()
			c.mu.Unlock()
			return err
		}
		c.mu.Unlock()
		err = c.post(m)
	}
}

// flushStream waits until the open stream message has left, ctx ends or
// the connection does.
func (c *Conn) flushStream(ctx context.Context) error {
	c.mu.Lock()
	for !c.streamEmptyLocked() {
		if c.err != nil {
			err := c.endedLocked()
			c.mu.Unlock()
			return err
		}
		if _, err := c.moveStreamLocked(ctx); err != nil {
			return err
		}
	}
	c.mu.Unlock()
	return nil
}

// makeRoomLocked moves on the open stream message that a write's bytes do
// not fit in, as moveStreamLocked does, and counts the write's first wait
// for it in Stats.CreditWaits (waited: this write waited already). c.mu
// is held on entry, and on return when the error is nil.
func (c *Conn) makeRoomLocked(ctx context.Context, waited *bool) error {
	w, err := c.moveStreamLocked(ctx)
	if err != nil {
		return err
	}
	if w && !*waited {
		*waited = true
		c.stats.CreditWaits++
	}
	return nil
}

// moveStreamLocked posts the open stream message as soon as a credit lets
// it leave, never holding it for more bytes (a write needs its room, or
// the goodbye waits), waiting for a change that may let it (waited); c.mu
// is held on entry, and on return when the error is nil.
func (c *Conn) moveStreamLocked(ctx context.Context) (waited bool, err error) {
	if m, ok := c.takeStreamLocked(true); ok {
		c.mu.Unlock()
		if err := c.postStream(m); err != nil {
			return false, err
		}
		c.mu.Lock()
		return false, nil
	}
	return true, c.streamWaitLocked(ctx)
}

// dropStream gives the open stream message's buffer back, once no write
// copies into it; the connection has ended.
func (c *Conn) dropStream() {
	c.mu.Lock()
	for c.stream.filling {
		c.stream.watched = true
		ch := c.changes()
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
	b := c.stream.buf
	c.stream.buf, c.stream.n = nil, 0
	c.mu.Unlock()
	if b != nil {
		c.sendPool.Put(b)
	}
}
