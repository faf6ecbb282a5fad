package msg

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
)

// outbox combines the connection's sends into doorbells. A message is
// queued; the goroutine that queues one while no other is posting becomes
// the poster: it posts everything queued, in order, with one PostBatch
// (one doorbell, a system call on Soft-RoCE), and again for whatever was
// queued meanwhile, until the queue is empty. Concurrent senders (RPC
// callers, a server's handlers, credit and keepalive messages) so share
// doorbells without a goroutine of their own, and a lone sender posts at
// once, as before.
//
// Messages leave in the order they were queued. A message queued is as
// good as posted: a sender that is not the poster returns at once, and if
// the device then refuses its message, the connection ends (the message
// cannot be taken back from a caller told it was sent).
type outbox struct {
	mu      sync.Mutex
	queued  []outgoing
	spare   []outgoing // the poster's last batch, kept for its capacity
	posting bool       // a goroutine is posting; it empties queued before it stops
	// shared: the last poster posted more than its own message. readied:
	// goroutines made ready to send soon (an RPC caller handed its
	// response, a server's handler started) that have not sent yet. Either
	// means senders are concurrent: the next poster yields first (post).
	shared  bool
	readied atomic.Int32
	reqs    []endpoint.Request
	// unsignaled counts the messages posted unsignaled since the last
	// signaled one; the poster's.
	unsignaled int
}

// outgoing is a message to post: its send buffer, whose first
// HeaderSize bytes hold h encoded, then h.Length bytes of payload. A
// probe (a keepalive) is posted signaled, and its completion times the
// keepalive's round trip. A last message (the goodbye) is posted
// signaled too, so that every message before it comes back.
type outgoing struct {
	b     *bufpool.Buffer
	h     Header
	probe bool
	last  bool
}

// post queues m and posts the queue if no other goroutine is posting it.
// The error is the device's refusal of this very message, when this
// goroutine posted it; the credit and grants it carried are then given
// back, as for every refused message.
func (c *Conn) post(m outgoing) error {
	q := &c.out
	q.mu.Lock()
	q.queued = append(q.queued, m)
	if q.posting {
		q.mu.Unlock()
		return nil
	}
	q.posting = true
	yield := c.o.polls || q.shared || q.readied.Load() > 0
	q.mu.Unlock()
	// While senders are concurrent, let the goroutines that are ready to
	// run (callers just handed their responses, handlers just done) queue
	// their messages behind this one first: they then share its doorbell.
	// With busy or hybrid polling, always: spinning goroutines may hold
	// every P, and this yield is where the goroutines they crowd out (the
	// completion goroutine, the control loop) get to run. Otherwise a lone
	// sender (a stream's writer, a single caller) does not yield:
	// runtime.Gosched wakes an idle thread to look for work, which would
	// cost a thread wake-up per message and move the sender to it.
	if yield {
		runtime.Gosched()
	}
	q.mu.Lock()
	var own error
	posted := 0
	for first := true; len(q.queued) > 0; first = false {
		batch := q.queued
		q.queued = q.spare[:0]
		q.mu.Unlock()
		refused, err := c.postBatch(batch)
		if first && refused == 0 { // this goroutine's message is the first of the first batch
			own = err
		}
		posted += len(batch)
		clear(batch) // drop the buffers' references
		q.mu.Lock()
		q.spare = batch[:0]
	}
	q.posting, q.shared = false, posted > 1
	q.mu.Unlock()
	return own
}

// signalEvery is how many messages may be posted in a row unsignaled: a
// quarter of the send buffers, so that a sender waiting for one always
// has a signaled completion coming that brings buffers back.
func (c *Conn) signalEvery() int { return max(1, c.o.recvDepth/4) }

// postBatch posts batch with one PostBatch. It returns the index of the
// first message the endpoint refused (len(batch) if none) and why; every
// refused message is undone. A refusal other than the endpoint's end ends
// the connection (senders were told those messages were sent), and why it
// ended is then the error.
func (c *Conn) postBatch(batch []outgoing) (int, error) {
	reqs := c.out.reqs[:0]
	unsignaled := c.out.unsignaled
	for _, m := range batch {
		r := endpoint.Request{Op: endpoint.OpSend, Context: sendToken{}, Buffer: m.b,
			Length: HeaderSize + int(m.h.Length), Flags: endpoint.Unsignaled}
		switch {
		case m.probe:
			r.Context, r.Flags, unsignaled = probeToken{posted: time.Now()}, 0, 0
		case m.last:
			r.Flags, unsignaled = 0, 0
		default:
			unsignaled++
		}
		reqs = append(reqs, r)
	}
	// Most sends are unsignaled: a signaled one wakes the completion path
	// for nothing but its buffer (the peer's answer wakes it anyway). One
	// in signalEvery is signaled, and its completion brings back the
	// buffers of those before it, so that fewer than signalEvery buffers
	// wait for a completion that is not coming; the pool holds four times
	// as many (the endpoint signals more often where its queue needs it).
	if unsignaled >= c.signalEvery() {
		reqs[len(reqs)-1].Flags, unsignaled = 0, 0
	}
	err := c.ep.PostBatch(reqs)
	clear(reqs)
	c.out.reqs = reqs[:0]
	if err == nil {
		c.out.unsignaled = unsignaled
		return len(batch), nil
	}
	refused := 0
	if pe, ok := errors.AsType[*endpoint.PostError](err); ok {
		refused = pe.Index
	}
	c.mu.Lock()
	for _, m := range batch[refused:] {
		c.sendPool.Put(m.b)
		c.countSent(&m.h, ^uint64(0))
		c.credits++
		c.toGrant += int(m.h.Credits)
		c.granted -= int(m.h.Credits)
	}
	c.signal()
	c.mu.Unlock()
	if errors.Is(err, endpoint.ErrClosed) {
		// The endpoint has ended, or msg is closing it after a flush:
		// the connection's error, else the endpoint's reason, says why.
		c.mu.Lock()
		if c.err == nil && c.ep.Err() != nil {
			c.mu.Unlock()
			c.awaitArrivals()
			c.mu.Lock()
		}
		if c.err != nil {
			err = c.endedLocked()
		} else if epErr := c.ep.Err(); epErr != nil {
			err = epErr
		}
		c.mu.Unlock()
		return refused, err
	}
	c.fail(c.refusalError(len(batch), err))
	return refused, c.endedErr()
}

// awaitArrivals waits, once the endpoint has ended under a post it
// refused, until every message that arrived before the end is handled
// (recvEnded), which fails the connection with why it ended: the peer's
// goodbye (ErrPeerClosed) if it came. The peer disconnects right after its
// goodbye, and the endpoint hears of that, and refuses posts, before the
// goodbye's completion is handled whenever the completion goroutine is
// behind; the sender must still learn of an orderly close. The endpoint's
// close is started, so that the wait ends even where no receive is posted
// for the device to flush (the application holds every message): the
// handler's end (ended) says it then. Not for the completion handler,
// which that wait would stop.
func (c *Conn) awaitArrivals() {
	c.mu.Lock()
	c.closeEndpointLocked()
	c.mu.Unlock()
	<-c.recvEnded
}

// refusalError is why a post the device refused ends the connection: the
// endpoint's reason if it has one or gets one within the endpoint's grace,
// else the refusal. A device may refuse posts as the connection ends under
// them: siw refuses a doorbell with ENOTCONN while the peer's close moves
// its queue pair to the error state, and the sender must then learn of the
// peer's leaving, as it would from the flush. When the endpoint has a
// reason, the messages that arrived before the end are handled first
// (awaitArrivals): the connection has then ended, with the peer's goodbye
// if it came, and fail keeps that.
func (c *Conn) refusalError(n int, err error) error {
	if reason, _ := c.endCause(); reason != nil {
		c.awaitArrivals()
		return reason
	}
	return fmt.Errorf("msg: posting %d messages: %w", n, err)
}
