package msg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
)

// ErrClosed is matched by every error of a connection that ended, whoever
// ended it (it is endpoint.ErrClosed). Only the errors that this side's
// Close caused match net.ErrClosed too, as a closed net.Conn's do: a peer
// that left gives ErrPeerClosed, ErrPeerSilent or cm.ErrPeerDisconnected,
// which code written for net must not take for its own Close.
var ErrClosed = endpoint.ErrClosed

// ErrPeerSilent ends a connection whose peer sent nothing, not even a
// keepalive, for longer than the keepalive timeout while it could have: the
// peer or the link is gone. The connection's error matches it and ErrClosed.
var ErrPeerSilent = errors.New("msg: the peer is silent")

// ErrPeerClosed ends a connection the peer closed in order (its Close said
// goodbye). Recv and RecvMessage return io.EOF for it, once every message
// sent before the goodbye was read; Send and Err return it, and it matches
// ErrClosed. A peer that crashed or left without a goodbye ends the
// connection with another error instead.
var ErrPeerClosed = fmt.Errorf("msg: the peer closed the connection: %w", ErrClosed)

// ErrWriteClosed refuses a message sent after CloseWrite. The connection is
// still up: this side reads on, and credits and keepalives still flow.
var ErrWriteClosed = errors.New("msg: the write side is closed")

// goodbyeTimeout bounds how long Close waits for what its goodbye needs
// from the peer's application: credits, for the goodbye and for the bytes
// the stream holds back. An application that holds every message it was
// sent must not hold Close for longer.
const goodbyeTimeout = time.Second

// deliveryTimeout bounds how long Close waits, in all, for its goodbye and
// the messages before it to leave once they are posted, and on iWARP for
// the proof that the peer holds them (awaitDelivery). That is the two
// devices' work alone, which no application holds up: it is slow only on
// a loaded machine or link, where a shorter bound would drop the goodbye
// and turn an orderly close into what looks like a crash, and runs out
// only against a peer that stopped answering altogether. It is the
// endpoint's default close timeout, its own bound on waiting for the
// device.
const deliveryTimeout = 5 * time.Second

// goodbyeBounds are how long a Close waits for its goodbye: peer for the
// steps that need the peer's application (goodbyeTimeout), total for all
// of it, the device's steps too. Both are from the start of the Close.
type goodbyeBounds struct{ peer, total time.Duration }

func errorf(format string, a ...any) error { return fmt.Errorf("msg: "+format, a...) }

// Message is a received message. Its Payload lives in registered memory
// that keeps one of the connection's receives (a credit of the peer's) until
// Release: release every message, and soon.
type Message struct {
	Type    Type
	ID      uint64
	Payload []byte

	c        *Conn
	mem      arrival
	released atomic.Bool
}

// Release gives the message's memory back; the peer gets the credit.
// Idempotent; a nil or zero Message has nothing to give back.
func (m *Message) Release() {
	if m == nil || m.c == nil {
		return
	}
	if m.released.CompareAndSwap(false, true) {
		m.c.release(m.mem)
	}
}

// arrival is a message as the inbox holds it: what a Message shows, and
// the memory it keeps. The library's own readers (Client, Server) take
// these as they are, and release them themselves, so that a call
// allocates no Message.
type arrival struct {
	typ     Type
	id      uint64
	payload []byte
	buf     *bufpool.Buffer // a receive buffer, reposted on release
	region  *bufpool.Region // or a rendezvous region, freed on release
	// handed: a request a Server's router left for its connection's
	// goroutine to run itself (serveConn).
	handed bool
}

// release gives r's memory back, once; the peer gets the credit.
func (c *Conn) release(r arrival) {
	if r.buf != nil {
		c.repostAs(r.buf, true)
		return
	}
	c.rv.put(r.region, bufpool.RemoteWrite)
	c.grant(true)
}

// Conn is a message connection: Send and Recv, with credit-based flow
// control and rendezvous for large messages. Safe for concurrent use.
type Conn struct {
	ep        *endpoint.Endpoint
	o         options
	recvPool  *bufpool.Pool
	sendPool  *bufpool.Pool
	out       outbox // sends waiting for a doorbell
	maxInline int    // payload bytes that fit both sides' buffers
	// peerMaxMessage is the largest message the peer receives (its
	// hello): Send refuses larger ones.
	peerMaxMessage int
	grantAt        int // toGrant that triggers a credit message
	holdAt         int // credits at or below which the open stream message is held (holdAt)
	// keepaliveEvery: a keepalive goes when nothing was sent for this
	// long (0: never); checkEvery: the control loop's tick (0: none).
	keepaliveEvery, checkEvery time.Duration

	mu      sync.Mutex
	credits int           // messages this side may send
	toGrant int           // receives reposted and not yet announced
	dones   []uint64      // rendezvous ids to confirm
	changed chan struct{} // closed (and replaced) on a change of the above, if watched
	watched bool          // a waiter took changed since it was made
	err     error         // why the connection ended
	rvSend  map[uint64]*pendingRendezvous
	nextRV  uint64
	rv      *regionCache // rendezvous regions, both directions

	// Of toGrant, those of messages of data the application released
	// (the rest are control messages' receives, reposted as they came).
	toGrantReleased int
	// The peer's room for messages of data (see Header.Released): its
	// receive depth, how many it released in all (its latest header's
	// Released), and how many this side sent; and this side's count for
	// its own headers.
	peerDepth                            int
	peerReleased, dataSent, dataReleased uint32
	creditWaiters                        int  // sends of data waiting for a credit
	peerWantsCredit, askedForCredit      bool // the peer's latest message, this side's, said FlagWantsCredit

	// For keepalives: when this side last sent and heard, and how many
	// credits it granted and messages it received in all (the peer's
	// credits are recvDepth + granted - receivedTotal).
	lastSend, lastRecv     time.Time
	lastCheck              time.Time // the control loop's last silence check
	granted, receivedTotal int
	reading                int  // this side's RDMA READs and atomics on the peer's memory in flight
	closing                bool // Close said goodbye, or Abort is closing: no message may follow
	// confirming: the control loop took a confirmation from dones and
	// has not queued it yet. confirmFirst: Close's goodbye waits for
	// the confirmations owed, and until it goes the control loop sends
	// them though closing is set (and nothing else).
	confirming, confirmFirst bool
	// Half-close (CloseWrite): messages are refused from writeClosed on;
	// the control loop sends the TypeCloseWrite owed (eofOwed) once no
	// send that took a credit before it is still on its way to the queue
	// (posting), so that it follows every message that was let through.
	// posting rises only under mu, before writeClosed is set; it falls
	// without mu, so that a send takes the lock once.
	writeClosed atomic.Bool // set under mu; read without it too
	eofOwed     bool
	posting     atomic.Int32
	stream      streamState // the byte stream's open message (stream.go)
	// The dialer speaks first, as iWARP requires of the active side: it
	// greets (greet, a credit message) as soon as the connection is up,
	// and the accepting side sends nothing until it has heard it (mayTalk).
	greet, mayTalk bool
	dialer         bool // this side dialed (breaks ties: see creditState.due)
	peerClosed     bool // the peer said goodbye
	stats          Stats

	oneSidedSlots chan struct{} // one per one-sided operation in flight (maxOneSided)

	inbox chan arrival
	// router sees each arrival before the inbox (setRouter); nil: none.
	router atomic.Pointer[func(arrival) routing]
	// The peer's half-close: handle holds its TypeCloseWrite (heldEOF) while
	// rendezvous reads announced before it are in flight (rvReads), then
	// puts it in the inbox after their messages; the first RecvMessage to
	// take it closes eof, and every RecvMessage after returns io.EOF.
	rvReads     int      // handle's own
	heldEOF     *arrival // handle's own
	eof         chan struct{}
	eofOnce     sync.Once
	done        chan struct{}
	handlerDone chan struct{} // the endpoint's last completion was handled (ended)
	// recvEnded is closed once every message that arrived is in the inbox:
	// a receive came back failed (the receive queue completes in order,
	// so none after it arrived) and no rendezvous read is in flight, or
	// the endpoint has ended. A reader of an ended connection waits for
	// this, not for handlerDone, which waits out the endpoint's close
	// timeout if the device never flushes some work request.
	recvEnded   chan struct{}
	recvEndOnce sync.Once
	recvFlushed bool // handle's own
	ctrlDone    chan struct{}
	// ctrlWake wakes the control loop when it has something to send
	// (wakeControl). While it owes nothing, it waits on this alone, not
	// on changed: most changes (every arriving message's credits) would
	// wake it for nothing.
	ctrlWake  chan struct{}
	closeOnce sync.Once
	closeErr  error
	epClosing sync.WaitGroup // the endpoint's Close, started by closeEndpointLocked
	epClose   bool           // it was started (under mu)
	// delivered: the completion of awaitDelivery's read, when it gave up
	// waiting; Close's own, after the goodbye.
	delivered chan endpoint.Completion
}

type pendingRendezvous struct {
	region *bufpool.Region
	// lent: the caller's region (SendRegion), given back to nobody: the
	// caller owns it again once done closes.
	lent bool
	done chan struct{}
}

// giveBack returns a rendezvous region taken from the cache to it, once
// the peer cannot read it any more.
func (c *Conn) giveBack(p *pendingRendezvous) {
	if !p.lent {
		c.rv.put(p.region, bufpool.RemoteRead)
	}
}

// rendezvousRead is the context of an RDMA READ pulling a large message.
type rendezvousRead struct {
	info   rendezvousInfo
	hdr    Header
	region *bufpool.Region
	size   int // the message: the offer's head, then what the READ brings
}

// sendToken marks send completions of the connection's own buffers.
type sendToken struct{}

// probeToken marks the send completion of a keepalive, posted signaled at
// posted: the time to its completion is the keepalive's round trip.
type probeToken struct{ posted time.Time }

// newConn makes the Conn of ep, whose completions b takes.
func newConn(ep *endpoint.Endpoint, b *binder, o options, recvPool *bufpool.Pool, peer hello, dialer bool) (*Conn, error) {
	// A message fits the peer's receive buffers and this side's own size,
	// so that what a connection pins is this side's choice (recvDepth
	// buffers of bufSize each way) whatever the peer announced.
	sendSize := min(o.bufSize, peer.bufSize)
	sendPool, err := bufpool.New(ep.PD(), bufpool.Size(sendSize), bufpool.Count(o.recvDepth))
	if err != nil {
		return nil, err
	}
	every := keepaliveEvery(o.keepalive, peer.silence)
	c := &Conn{ep: ep, o: o, recvPool: recvPool, sendPool: sendPool,
		keepaliveEvery: every, checkEvery: o.checkEvery(every),
		maxInline: sendSize - HeaderSize, peerMaxMessage: peer.maxMessage, grantAt: o.recvDepth / 2,
		holdAt:  holdAt(peer),
		credits: peer.recvDepth, peerDepth: peer.recvDepth, changed: make(chan struct{}), ctrlWake: make(chan struct{}, 1), rvSend: map[uint64]*pendingRendezvous{},
		rv:    newRegionCache(ep.PD(), o.rvBudget),
		inbox: make(chan arrival, o.recvDepth), eof: make(chan struct{}), done: make(chan struct{}),
		oneSidedSlots: make(chan struct{}, maxOneSided), greet: dialer, mayTalk: dialer, dialer: dialer,
		lastRecv: time.Now(), lastSend: time.Now(),
		handlerDone: make(chan struct{}), recvEnded: make(chan struct{}), ctrlDone: make(chan struct{})}
	b.attach(c)
	go c.controlLoop()
	return c, nil
}

// postReceives is the cm setup step: the receives are posted before the
// connection is, so the peer's first credits are real. The pool it makes
// is stored in *pool; if the connection then fails, the posted buffers
// come back to the connection's binder b (the endpoint's handler), and
// abandon puts them back and closes the pool.
//
// cm.Dial runs it once for each endpoint it tries: on iWARP it dials
// again from another local port when the first one is taken, after
// closing the endpoint it tried. What that endpoint left with b (its
// flushed receives, its end) and its pool are freed first, so that the
// new endpoint starts b afresh.
func postReceives(o options, b *binder, pool **bufpool.Pool) func(*endpoint.Endpoint) error {
	return func(ep *endpoint.Endpoint) error {
		if *pool != nil {
			abandon(b, *pool)
			b.renew()
			*pool = nil
		}
		p, err := bufpool.New(ep.PD(), bufpool.Size(o.bufSize), bufpool.Count(o.recvDepth))
		if err != nil {
			return err
		}
		*pool = p
		for range o.recvDepth {
			b, _ := p.TryGet()
			if err := ep.PostRecv(nil, b); err != nil {
				p.Put(b)
				return err
			}
		}
		return nil
	}
}

// abandon frees what a connection that was never made holds (cm gave up,
// or the handshake failed after it): the buffers that came back to b go
// back to their pool, and so do those that come back later, and the
// receive pool postReceives made closes, freeing its memory once the last
// buffer is back. cm closes the endpoint before Dial or Accept returns,
// except after an iWARP connect it abandoned in the kernel, which it
// closes when the kernel returns.
func abandon(b *binder, pool *bufpool.Pool) {
	b.discard()
	if pool != nil {
		pool.Close()
	}
}

// connOptions are the cm options of every msg connection: WithLogger's
// logger, so that the connection's own events (its port going down, say)
// reach it too, then the caller's (a logger of their own for the
// connection wins), then msg's own.
func (o options) connOptions() []cm.Option {
	opts := make([]cm.Option, 0, len(o.cmOpts)+4)
	opts = append(opts, cm.WithLogger(o.logger))
	opts = append(opts, o.cmOpts...)
	// Every send takes a send buffer (recvDepth of them), every rendezvous
	// a read (at most recvDepth at once), and one-sided operations at most
	// maxOneSided, two work requests each (an iWARP write and the READ
	// that proves it placed): the send queue holds them all.
	return append(opts, cm.WithRecvDepth(o.recvDepth), cm.WithSendDepth(2*o.recvDepth+1+2*maxOneSided),
		cm.WithRNRRetry(0)) // credits make RNR impossible; if it happened, it would be an error
}

// handledBy is the cm option that gives one connection's completions to b.
func handledBy(b *binder) cm.Option {
	return seam.WithHandler(b.handle, b.end).(cm.Option)
}

// Dial connects to a msg Listener at addr, "host:port" as cm.Dial takes
// it: each address of a name is tried in turn.
func Dial(ctx context.Context, addr string, opts ...Option) (*Conn, error) {
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	var pool *bufpool.Pool
	b := new(binder)
	dialOpts := []cm.DialOption{cm.WithSetup(postReceives(o, b, &pool)),
		cm.WithPrivateData(o.hello().encode())}
	for _, opt := range o.connOptions() {
		dialOpts = append(dialOpts, opt)
	}
	dialOpts = append(dialOpts, handledBy(b))
	ep, err := cm.Dial(ctx, addr, dialOpts...)
	if err != nil {
		abandon(b, pool)
		return nil, err
	}
	peer, err := parseHello(ep.PrivateData())
	if err == nil {
		var c *Conn
		if c, err = newConn(ep, b, o, pool, peer, true); err == nil {
			return c, nil
		}
	}
	ep.Close()
	abandon(b, pool)
	return nil, err
}

// Listener accepts msg connections. Like a TCP listener's kernel, it
// sets connections up as their requests arrive, each handshake in a
// goroutine of its own, and Accept hands out those that are ready: a plain
// loop of Accepts (Server.Serve, net/http over rdmanet) does not set
// connections up one after another.
type Listener struct {
	l *cm.Listener
	o options

	ctx    context.Context // the handshakes'; ends with Close
	cancel context.CancelFunc
	// slots bounds the connections being set up or waiting for Accept
	// (acceptAhead); further requests wait in the CM listener's backlog.
	slots  chan struct{}
	ready  chan accepted
	closed chan struct{}
	// failed is closed, with failErr set, when the CM listener can take
	// no more requests (its device removed): Accept returns failErr.
	failed     chan struct{}
	failErr    error
	handshakes sync.WaitGroup // the accept loop and every handshake
	closeOnce  sync.Once
	closeErr   error
}

// accepted is a connection set up for Accept, or the failure that keeps
// any from being set up: options the device cannot hold (handshake).
type accepted struct {
	c   *Conn
	err error
}

// acceptAhead is how many connections a Listener sets up, or holds set up,
// before Accept takes them.
const acceptAhead = 64

// handshakeTimeout bounds one connection's set-up on the listening side,
// so that a dialer that vanishes mid-handshake does not hold a slot for as
// long as the CM retries.
const handshakeTimeout = 30 * time.Second

// handshakeGrace bounds how long Listener.Close waits for the handshakes in
// progress to finish. The listening side's handshake normally ends within
// milliseconds of the dialer's; one whose dialer's answer was lost would
// wait for the CM to resend its reply, seconds later, and is cut short.
const handshakeGrace = time.Second

// Listen listens on addr for msg connections. addr is "host:port" as
// cm.Listen takes it: a wildcard host listens on the RDMA-capable
// addresses cm.Listen names, and a loopback address is refused.
func Listen(ctx context.Context, addr string, opts ...Option) (*Listener, error) {
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	listenOpts := make([]cm.ListenOption, 0, len(o.cmOpts))
	for _, opt := range o.connOptions() {
		listenOpts = append(listenOpts, opt)
	}
	cl, err := cm.Listen(ctx, addr, listenOpts...)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	l := &Listener{l: cl, o: o, ctx: lctx, cancel: cancel, slots: make(chan struct{}, acceptAhead),
		ready: make(chan accepted, acceptAhead), closed: make(chan struct{}), failed: make(chan struct{})}
	l.handshakes.Go(l.acceptLoop)
	return l, nil
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr {
	if !l.made() {
		return nil
	}
	return l.l.Addr()
}

// made says whether l was made by Listen. A nil or zero Listener's Accept
// and Close fail with errListenerNotMade and its Addr is nil, instead of
// panicking or waiting for ever.
func (l *Listener) made() bool { return l != nil && l.l != nil }

var errListenerNotMade = invalid("a Listener not made by Listen")

// Close stops listening and closes the connections set up that Accept had
// not taken, with a goodbye, so that their dialers read io.EOF; a blocked
// Accept returns an error matching net.ErrClosed. Requests not yet taken
// up are rejected (their Dial fails). A handshake in progress is given up
// to a second to finish first, and its connection closed the same way:
// its dialer's Dial may have returned already. Accepted connections are
// not affected. Idempotent.
func (l *Listener) Close() error {
	if !l.made() {
		return errListenerNotMade
	}
	l.closeOnce.Do(func() {
		close(l.closed)
		l.closeErr = l.l.Close() // the accept loop ends: no handshake starts
		// A dialer hears that the handshake ended before this side does:
		// its Dial returns once the CM's reply reaches it, this side's
		// handshake when the dialer's answer to that arrives. Cutting the
		// handshake short in between would end a connection the dialer
		// already holds, with an error where it should read io.EOF.
		grace := time.AfterFunc(handshakeGrace, l.cancel)
		l.handshakes.Wait()
		grace.Stop()
		l.cancel()
		l.closeReady()
	})
	return l.closeErr
}

// closeReady closes the connections set up that Accept had not taken.
func (l *Listener) closeReady() {
	for {
		select {
		case a := <-l.ready:
			if a.c != nil {
				a.c.Close()
			}
		default:
			return
		}
	}
}

// Accept waits for the next msg connection, set up already or as soon as
// one is. Connect requests that are not from a msg peer are rejected, and
// handshakes that fail are the dialer's business: neither reaches Accept.
// Nor does a connection this side's device could not make (out of memory,
// say): its dialer is refused, or its connection ends, and the failure
// goes to the listener's logger as a warning.
// Options beyond what the device holds reject the request and reach
// Accept as an error matching endpoint.ErrInvalid.
// Once no request can arrive any more (the listener's device removed: an
// error matching cm.ErrDeviceRemoved), Accept returns that error after
// the connections set up before.
// After Close it returns an error matching net.ErrClosed.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	if !l.made() {
		return nil, errListenerNotMade
	}
	select {
	case <-l.closed:
		return nil, cm.ErrListenerClosed
	default:
	}
	select {
	case a := <-l.ready:
		<-l.slots
		return a.c, a.err
	case <-l.failed:
		select {
		case a := <-l.ready: // set up before the failure: still served
			<-l.slots
			return a.c, a.err
		default:
			return nil, l.failErr
		}
	case <-l.closed:
		return nil, cm.ErrListenerClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// acceptLoop takes connect requests while a slot is free and sets each up
// in a goroutine of its own, until Close.
func (l *Listener) acceptLoop() {
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return
		}
		req, err := l.l.AcceptRequest(l.ctx)
		if err != nil {
			select {
			case <-l.closed:
			default:
				// Not Close: no request can arrive any more (the
				// device was removed, or the process's CM event
				// channel failed). Accept says so instead of waiting
				// for ever.
				l.failErr = err
				close(l.failed)
			}
			return
		}
		l.handshakes.Go(func() {
			c, err := l.handshake(req)
			if c == nil && err == nil {
				<-l.slots
				return
			}
			l.ready <- accepted{c, err} // never blocks: a slot is held
		})
	}
}

// handshake sets one connection up. It returns nil and nil when the
// request or its handshake failed (on the dialer's account, on this side's
// device, or because Close cut it short), and an error only for options
// the device cannot hold, which Accept reports.
func (l *Listener) handshake(req *cm.Request) (*Conn, error) {
	peer, err := parseHello(req.PrivateData())
	if err != nil {
		req.Reject([]byte("msg: no hello"))
		l.o.logger.Warn().Err(err).Stringer("peer", req.RemoteAddr()).Msg("msg: rejected a connect request")
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(l.ctx, handshakeTimeout)
	defer cancel()
	var pool *bufpool.Pool
	b := new(binder)
	ep, err := req.Accept(ctx, cm.WithSetup(postReceives(l.o, b, &pool)),
		cm.WithPrivateData(l.o.hello().encode()), handledBy(b))
	if err != nil {
		abandon(b, pool)
		if errors.Is(err, endpoint.ErrInvalid) {
			// The options, beyond what the device holds: this side's
			// error, and every request after would fail the same way.
			return nil, err
		}
		if errors.As(err, new(seam.LocalFailure)) {
			// Making the connection's device objects, or registering
			// and posting its receives, failed: this side's trouble,
			// not the dialer's.
			l.o.logger.Warn().Err(err).Stringer("peer", req.RemoteAddr()).Msg("msg: could not set a connection up; its request was rejected")
		} else {
			l.o.logger.Debug().Err(err).Stringer("peer", req.RemoteAddr()).Msg("msg: accept failed")
		}
		return nil, nil
	}
	c, err := newConn(ep, b, l.o, pool, peer, false)
	if err != nil {
		// This side's failure too (its send buffers' memory), and this
		// connection's alone: it ends, and Accept waits on, so that a
		// server's accept loop (net/http's over rdmanet) goes on serving.
		// The warning comes once the connection is freed, so that what
		// it says is true when a reader of the log sees it.
		ep.Close()
		abandon(b, pool)
		l.o.logger.Warn().Err(err).Stringer("peer", req.RemoteAddr()).Msg("msg: could not set an accepted connection up; it was closed")
		return nil, nil
	}
	return c, nil
}

// made says whether c was made by Dial or Accept. A nil or zero Conn is
// one that ended before it began: its calls fail with errConnNotMade, Done
// is closed, and its other accessors give zero values, instead of
// panicking or waiting for ever.
func (c *Conn) made() bool { return c != nil && c.ep != nil }

var errConnNotMade = invalid("a Conn not made by Dial or Accept")

// errConnNeverMade is an unmade Conn's Err: like every ended
// connection's, it matches ErrClosed.
var errConnNeverMade = seam.Ended(errConnNotMade, ErrClosed)

// LocalAddr is this side's address of the connection.
func (c *Conn) LocalAddr() net.Addr {
	if !c.made() {
		return nil
	}
	return c.ep.LocalAddr()
}

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr {
	if !c.made() {
		return nil
	}
	return c.ep.RemoteAddr()
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} {
	if !c.made() {
		return seam.Closed
	}
	return c.done
}

// Err says why the connection ended (nil while it is up).
func (c *Conn) Err() error {
	if !c.made() {
		return errConnNeverMade
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// MaxInline is the largest payload sent in one message, what fits both
// this side's buffer size and the peer's; larger ones go by rendezvous.
func (c *Conn) MaxInline() int {
	if !c.made() {
		return 0
	}
	return c.maxInline
}

// signal wakes everything waiting on a change; c.mu is held. With no
// waiter, the channel stays as it is: most changes (a credit, a send
// buffer back) have nobody waiting, and a new channel each would cost an
// allocation per message.
func (c *Conn) signal() {
	if c.watched {
		close(c.changed)
		c.changed = make(chan struct{})
		c.watched = false
	}
}

// wakeControl wakes the control loop to look at what it owes; it never
// blocks, and a wake-up sent while it runs is kept for its next wait.
func (c *Conn) wakeControl() {
	select {
	case c.ctrlWake <- struct{}{}:
	default:
	}
}

// changes is the channel the next signal closes; c.mu is held.
func (c *Conn) changes() <-chan struct{} {
	c.watched = true
	return c.changed
}

// closeEndpointLocked starts the endpoint's close, once, without waiting
// for it: closing waits for the goroutine that polls the CQ, which may be
// the caller (handle). Conn.Close waits for it. The endpoint ends with the
// connection's error, or errEndUnexplained before there is one, and so
// does every work request it flushes: the endpoint's own Close would make
// them match net.ErrClosed, which only the application's Close may cause.
// c.mu is held.
func (c *Conn) closeEndpointLocked() {
	if !c.epClose {
		c.epClose = true
		cause := c.err
		if cause == nil {
			cause = errEndUnexplained
		}
		c.epClosing.Go(func() { seam.CloseEndpoint(c.ep, cause) })
	}
}

// errEndUnexplained ends a connection that this side did not close and
// whose end nothing explained in time: its queue pair failed (the device
// flushed a send), and the CM did not say why within the endpoint's grace.
// msg then closes the endpoint with it, to flush the receives.
var errEndUnexplained = fmt.Errorf("msg: the connection ended, its queue pair failed, and the CM gave no reason: %w", ErrClosed)

// fail ends the connection with err (the first error wins) and closes the
// endpoint: posted work flushes back to handle, which frees it.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	first := c.err == nil
	if first {
		// It matches ErrClosed whatever ended it (a malformed message,
		// a refused post), as every error of an ended connection does.
		c.err = seam.Ended(err, ErrClosed)
		close(c.done)
		c.signal()
		c.wakeControl()
		// Posted work flushes back to handle. The endpoint's Close is
		// started here, not waited for: it waits, up to its close
		// timeout, for the device to flush every work request, and
		// fail runs on callers' goroutines (a sender whose post the
		// device refused), which must learn of the end at once.
		// Conn.Close waits for it; started under mu, so that the
		// fail Close makes comes after it.
		c.closeEndpointLocked()
	}
	c.mu.Unlock()
	if first {
		c.o.logger.Debug().Err(err).Msg("msg: connection ends")
	}
}

// Close ends the connection: pending and later calls return an error
// matching ErrClosed and net.ErrClosed, as a closed net.Conn's do, even when
// the peer had ended the connection first (Err still says why it ended), and
// everything is freed once messages already handed out are released. It
// first says goodbye and lets the messages sent so far leave, so that the
// peer reads them all and then io.EOF. The goodbye goes on a credit that
// messages of data never take, so a peer whose application holds every
// message it was sent still gets it. Bytes the stream holds back
// (rdmanet's writes) go before it and need a credit of data: Close waits at
// most a second for one, and if the peer holds every message that long, it
// sees an error instead. What needs only the devices, the goodbye and the
// messages before it leaving once they are posted, may take up to five
// seconds, against a peer that stopped answering. Idempotent: every call
// returns the first one's result.
func (c *Conn) Close() error {
	return c.close(goodbyeBounds{peer: goodbyeTimeout, total: deliveryTimeout})
}

// Abort ends the connection as Close does, but without the goodbye: what
// is not yet sent (the stream's held bytes too) is dropped, and the peer's
// calls fail with an error, its endpoint's (the peer disconnected), and
// never io.EOF, as after a TCP reset. It is how a sender says that what it
// sent is cut short, so that the peer cannot take it for the whole. Close
// and Abort are idempotent together: the first call decides, and every
// call returns its result.
func (c *Conn) Abort() error { return c.close(goodbyeBounds{}) }

// close is Close with a goodbye within bounds, or Abort's without one when
// its total is not positive.
func (c *Conn) close(within goodbyeBounds) error {
	if !c.made() {
		return errConnNotMade
	}
	c.closeOnce.Do(func() {
		if within.total > 0 {
			c.sayGoodbye(within)
		} else {
			c.mu.Lock()
			c.closing = true // sends that start now fail with ErrClosed
			c.mu.Unlock()
		}
		c.mu.Lock()
		peerFirst := c.peerClosed
		c.mu.Unlock()
		if peerFirst {
			// The peer's goodbye came before this Close, though the
			// connection's end may not have been handled yet (its
			// disconnect follows the goodbye): Err says the peer's.
			c.fail(ErrPeerClosed)
		}
		c.fail(seam.ErrClosedHere)
		errs := []error{c.ep.Close()}
		if c.delivered != nil { // awaitDelivery gave up: the read's buffer comes back flushed
			c.sendPool.Put((<-c.delivered).Buffer)
		}
		c.epClosing.Wait()
		<-c.handlerDone
		<-c.ctrlDone
		// Messages nobody took: give their memory back.
		for {
			select {
			case r := <-c.inbox:
				c.release(r)
				continue
			default:
			}
			break
		}
		c.mu.Lock()
		for id, p := range c.rvSend {
			if !p.lent {
				p.region.Close()
			}
			delete(c.rvSend, id)
		}
		c.mu.Unlock()
		c.rv.close()
		c.dropStream()
		errs = append(errs, c.recvPool.Close(), c.sendPool.Close())
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// sayGoodbye sends the TypeClose message, after the confirmations owed for
// rendezvous messages read, and waits for every message posted so far to
// leave. It gives up without a credit and a buffer within within.peer
// (held stream bytes wait for a credit of data, and the peer holds every
// message it was sent), and stops waiting for the messages to leave at
// within.total. Sends that start afterwards fail with ErrClosed.
func (c *Conn) sayGoodbye(within goodbyeBounds) {
	all, cancel := context.WithTimeout(context.Background(), within.total)
	defer cancel()
	// The steps up to the goodbye's post wait for the peer's credits;
	// those after it need only the devices.
	ctx, cancelPeer := context.WithTimeout(all, within.peer)
	defer cancelPeer()
	c.mu.Lock()
	c.closing = true
	c.confirmFirst = true
	c.mu.Unlock()
	if c.flushStream(ctx) != nil { // the stream's held bytes go before the goodbye
		return
	}
	// The confirmations of messages read go before it: each is the
	// peer's Send of that message returning nil, and after the goodbye
	// that Send would fail as if the message were lost.
	if c.waitFor(ctx, c.confirmedLocked) != nil {
		return
	}
	c.mu.Unlock()
	b, err := c.sendBuffer(ctx)
	if err != nil {
		return
	}
	if c.waitFor(ctx, func() bool { return c.mayTalk && c.credits >= 1 && !c.confirming }) != nil {
		c.sendPool.Put(b)
		return
	}
	c.confirmFirst = false // a read that ends from now on is of a message nobody took
	h := Header{Type: TypeClose}
	c.takeCreditLocked(&h)
	c.mu.Unlock()
	h.Encode(b.Bytes())
	if c.post(outgoing{b: b, h: h, last: true}) != nil {
		return
	}
	if c.flush(all) == nil && seam.SendsCompleteLocally(c.ep) {
		c.awaitPeerDisconnect(ctx, all)
	}
}

// awaitPeerDisconnect waits, on iWARP, for the peer to disconnect, which it
// does on reading the goodbye, or for its own goodbye (both closed at
// once), within peer; failing that it proves delivery (awaitDelivery)
// within all. A send's completion there says only that TCP took the
// bytes, and siw resets the connection when it closes its socket with
// bytes from the peer unread: those the peer sent before it read the
// goodbye (a credit, say) would be, were this side to disconnect first.
// The peer sends nothing after reading the goodbye, and what it sent
// before arrives ahead of its disconnect.
func (c *Conn) awaitPeerDisconnect(peer, all context.Context) {
	switch c.waitFor(peer, func() bool { return c.peerClosed }) {
	case nil:
		c.mu.Unlock()
	case peer.Err():
		c.awaitDelivery(all)
	}
}

// confirmedLocked says no confirmation the goodbye waits for is left:
// every one owed is queued, or the control loop may not send it (the
// credit rules keep its last credit for messages that grant the peer
// some) while the goodbye could go, and it is better lost than the
// goodbye. c.mu is held.
func (c *Conn) confirmedLocked() bool {
	blocked := c.credits >= 1 && !(creditState{credits: c.credits, toGrant: c.toGrant}).mayControl()
	return len(c.dones) == 0 && !c.confirming || blocked
}

// awaitDelivery waits, within ctx, until the peer holds every message
// posted so far, where a send's completion does not say so (iWARP: TCP
// took the bytes). An RDMA READ is answered only after the peer processed
// every message before it, so a zero-length one proves delivery. Without
// it, the disconnect after the goodbye may lose what TCP still holds:
// siw resets the connection when it closes its socket with bytes from
// the peer (credits, say) unread. Close takes the read's buffer back.
func (c *Conn) awaitDelivery(ctx context.Context) {
	b, err := c.sendBuffer(ctx)
	if err != nil {
		return
	}
	done := make(chan endpoint.Completion, 1)
	if err := c.ep.PostBatch([]endpoint.Request{{Op: endpoint.OpRead, Buffer: b, Notify: done}}); err != nil {
		c.sendPool.Put(b)
		return
	}
	c.delivered = done
	seam.Kick(c.ep) // the answer comes as a completion nobody else waits for
	defer seam.KickDone(c.ep)
	select {
	case comp := <-done:
		c.delivered = nil
		c.sendPool.Put(comp.Buffer)
	case <-ctx.Done():
	}
}

// repost gives a control message's receive buffer back to the device and
// counts the credit.
func (c *Conn) repost(b *bufpool.Buffer) { c.repostAs(b, false) }

// repostAs reposts b and counts the credit; released: b held a message
// of data the application released.
func (c *Conn) repostAs(b *bufpool.Buffer, released bool) {
	if err := c.ep.PostRecv(nil, b); err != nil {
		c.recvPool.Put(b) // the connection is over
		return
	}
	c.grant(released)
}

// grant counts a receive given back to the peer; released: a message of
// data the application released (Header.Released counts it).
func (c *Conn) grant(released bool) {
	c.mu.Lock()
	c.toGrant++
	if released {
		c.toGrantReleased++
		c.dataReleased++
	}
	// The first credit to grant also lets the control loop spend its last
	// one (creditState.mayControl), on a message it may owe. After the
	// peer's goodbye, and before this side's Close (whose goodbye may wait
	// for confirmations), the loop owes it nothing (controlLoop): no
	// wake-up.
	silenced := c.peerClosed && !c.closing
	if !silenced && (c.creditStateLocked(c.eofWaitingLocked()).due() || c.credits == 1 && c.toGrant == 1) {
		c.wakeControl()
	}
	c.mu.Unlock()
}

// Send sends payload as one message, waiting for a credit and a buffer
// (honouring ctx). A credit comes back when the peer releases a message it
// received: a peer that stops reading, or keeps messages from RecvMessage
// without releasing them, makes Send wait, and then fail when ctx ends
// with an error saying so. Larger than MaxInline, it goes by rendezvous: Send
// returns once the peer has read it. ctx then bounds the wait for a credit
// to offer it; once offered, the message will arrive, so Send waits for
// the peer's read (which starts as the offer arrives) or the connection's
// end, whatever ctx does. A Send that fails with ctx's error sent nothing,
// and the next Send's message comes after this one's. A message larger
// than the peer receives (its WithMaxRecvSize) fails at once with an error
// matching ErrTooLarge.
func (c *Conn) Send(ctx context.Context, payload []byte) error {
	if !c.made() {
		return errConnNotMade
	}
	return c.send(ctx, TypeData, 0, nil, payload)
}

// Recv returns the next message's payload, copied; the message is released.
// It returns io.EOF once the peer closed in order and every message it sent
// was read.
func (c *Conn) Recv(ctx context.Context) ([]byte, error) {
	if !c.made() {
		return nil, errConnNotMade
	}
	r, err := c.recv(ctx) // no Message: the copy is all the caller keeps
	if err != nil {
		return nil, err
	}
	defer c.release(r)
	return append([]byte(nil), r.payload...), nil
}

// RecvMessage returns the next message without copying it; Release it.
// After the connection ended, messages that had arrived are still returned,
// then its error: io.EOF when the peer closed in order (ErrPeerClosed).
// After the peer's CloseWrite, every message it sent before is returned,
// then io.EOF, while the connection stays up for this side's sends.
func (c *Conn) RecvMessage(ctx context.Context) (*Message, error) {
	if !c.made() {
		return nil, errConnNotMade
	}
	m := new(Message)
	if err := c.recvInto(ctx, m); err != nil {
		return nil, err
	}
	return m, nil
}

// recvInto is RecvMessage into m, whose last message, if any, is
// released: m then holds the next one, unreleased. A reader that holds
// one message at a time can reuse one Message (rdmanet's does).
func (c *Conn) recvInto(ctx context.Context, m *Message) error {
	r, err := c.recv(ctx)
	if err != nil {
		return err
	}
	m.Type, m.ID, m.Payload, m.c, m.mem = r.typ, r.id, r.payload, c, r
	m.released.Store(false)
	return nil
}

// recv is RecvMessage without the Message: the caller releases r.
//
// While the inbox is empty, recv drives the endpoint itself: the next
// completion is polled for (or slept on) and handled in this goroutine,
// so a message reaches its reader without a goroutine hand-off, and the
// endpoint's completion goroutine stands aside meanwhile. Once the
// endpoint is closing, recv waits for what is left instead.
func (c *Conn) recv(ctx context.Context) (arrival, error) {
	var r arrival
	var rerr error
	err := c.driveUntil(ctx, func() (ok bool) {
		r, ok, rerr = c.ready()
		return ok
	})
	if err == nil {
		return r, rerr
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return arrival{}, ctxErr
	}
	return c.awaitArrival(ctx)
}

// driveUntil drives the endpoint in this goroutine, handling what comes,
// until done says so (nil), or until ctx ends or the endpoint is closing
// (Progress's error). done is asked before each wait, after the progress
// mark is taken: what is handled after that look ends the wait.
func (c *Conn) driveUntil(ctx context.Context, done func() bool) error {
	for {
		mark := seam.ProgressMark(c.ep)
		if done() {
			return nil
		}
		if err := seam.Progress(c.ep, ctx, mark); err != nil {
			return err
		}
	}
}

// driveFor drives c's endpoint in this goroutine until ch has a value (ok),
// or until ctx ends or the endpoint is closing: a caller waiting for what
// a completion sends it (an RPC response, a one-sided operation's
// completion) takes it without a goroutine hand-off. ch is never closed.
func driveFor[T any](c *Conn, ctx context.Context, ch <-chan T) (v T, ok bool) {
	c.driveUntil(ctx, func() bool {
		select {
		case v, ok = <-ch:
		default:
		}
		return ok
	})
	return v, ok
}

// awaitArrival is recv without driving the endpoint: it waits for what
// another goroutine handles (the completion goroutine, or a caller that
// polls).
func (c *Conn) awaitArrival(ctx context.Context) (arrival, error) {
	select {
	case r := <-c.inbox:
		return c.taken(r)
	case <-c.eof:
		return arrival{}, c.endOfData()
	case <-ctx.Done():
		return arrival{}, ctx.Err()
	case <-c.done:
		<-c.recvEnded // messages that arrived before the end are all in the inbox now
		if r, ok, err := c.ready(); ok {
			return r, err
		}
		if err := c.endForReader(); !errors.Is(err, ErrPeerClosed) {
			return arrival{}, err
		}
		return arrival{}, io.EOF
	}
}

// endForReader is why the connection ended, as recv reports it once every
// arrival is in the inbox: ErrPeerClosed when the peer said goodbye and
// this side did not close, whatever ended the connection here first. The
// peer disconnects right after its goodbye, and a message this side posts
// meanwhile (a credit) may be refused by a queue pair the peer is tearing
// down before the goodbye's completion is handled; the reader still has
// every message the peer sent, so the end is orderly for it.
func (c *Conn) endForReader() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peerClosed && !c.closing {
		return ErrPeerClosed
	}
	return c.endedLocked()
}

// ready is what recv returns without waiting (ok): the next message in
// the inbox, or io.EOF after the peer's CloseWrite. The two looks are
// apart, each a non-blocking receive, which takes no lock on a channel
// found empty (a select over both locks both, and recv asks before every
// wait); nothing arrives behind the CloseWrite that closes eof.
func (c *Conn) ready() (r arrival, ok bool, err error) {
	select {
	case r := <-c.inbox:
		r, err = c.taken(r)
		return r, true, err
	default:
	}
	select {
	case <-c.eof:
		return arrival{}, true, c.endOfData()
	default:
		return arrival{}, false, nil
	}
}

// endOfData is a read's error once the peer's data has ended (CloseWrite):
// io.EOF, unless this side's Close has begun.
func (c *Conn) endOfData() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calledAfterCloseLocked(io.EOF)
}

// taken returns r, taken from the inbox, to recv's caller; the peer's
// TypeCloseWrite is io.EOF instead, for this call and every later one.
func (c *Conn) taken(r arrival) (arrival, error) {
	if r.typ != TypeCloseWrite {
		return r, nil
	}
	c.release(r)
	c.eofOnce.Do(func() {
		close(c.eof)
		seam.Wake(c.ep) // other readers, driving the endpoint, look at eof
	})
	return arrival{}, io.EOF
}

// CloseWrite half-closes the connection: the peer reads every message sent
// before it, then io.EOF, and later Sends fail with ErrWriteClosed. This
// side still receives, and the connection stays up until Close (or the
// peer's Close). It does not wait for the peer; if no credit is free, the
// end of data leaves with the next one. Idempotent; after the connection
// ended it returns the connection's error.
func (c *Conn) CloseWrite() error {
	if !c.made() {
		return errConnNotMade
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.endedLocked()
	}
	if !c.writeClosed.Swap(true) {
		c.eofOwed = true
		c.wakeControl()
	}
	return nil
}

// waitFor waits until ready (called with c.mu held) holds, or the
// connection ends, or ctx does. It returns with c.mu held on success.
func (c *Conn) waitFor(ctx context.Context, ready func() bool) error {
	c.mu.Lock()
	for {
		if c.err != nil {
			err := c.endedLocked()
			c.mu.Unlock()
			return err
		}
		if ready() {
			return nil
		}
		if err := c.awaitChangeLocked(ctx); err != nil {
			return err
		}
	}
}

// awaitChangeLocked waits for the next change (signal), the connection's
// end or ctx's; c.mu is held on entry, and on return when the error is
// nil.
func (c *Conn) awaitChangeLocked(ctx context.Context) error {
	ch := c.changes()
	c.mu.Unlock()
	seam.Kick(c.ep) // what this waits for comes with a completion nobody may be polling for
	defer seam.KickDone(c.ep)
	select {
	case <-ch:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	return nil
}

// sendBuffer takes a send buffer, waiting until one is free, ctx ends or
// the connection ends. Buffers come back with send completions, and when
// the connection fails the device may take until the endpoint's close
// timeout to flush them; a sender must learn of the failure at once, as
// every other waiter does, not then.
func (c *Conn) sendBuffer(ctx context.Context) (*bufpool.Buffer, error) {
	if b, ok := c.sendPool.TryGet(); ok {
		return b, nil
	}
	wait := ctx
	if done := ctx.Done(); done == nil || done == c.done { // a server's handler: no goroutine to merge them
		wait = contextUntil(c.done)
	} else {
		var cancel context.CancelFunc
		wait, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(contextUntil(c.done), cancel)
		defer stop()
	}
	seam.Kick(c.ep) // buffers come back with send completions
	b, err := c.sendPool.Get(wait)
	seam.KickDone(c.ep)
	switch {
	case err == nil:
		return b, nil
	case c.Err() != nil:
		return nil, c.endedErr()
	case errors.Is(err, bufpool.ErrClosed): // Close closed the pool
		return nil, seam.ErrClosedHere
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	return nil, err
}

// send sends one message of type typ whose payload is head then payload
// (two parts, so that a caller need not join them in a buffer of its own);
// control messages (credit, done) go through the control loop.
func (c *Conn) send(ctx context.Context, typ Type, id uint64, head, payload []byte) error {
	if c.writeClosed.Load() { // even after the connection ended, as a socket's EPIPE
		return ErrWriteClosed
	}
	if len(head)+len(payload) > c.maxInline {
		return c.sendRendezvous(ctx, typ, id, head, payload)
	}
	// The credit first, then the buffer: a sender waiting for a credit
	// must not hold a buffer, or senders waiting on both sides could hold
	// every buffer there is, and neither side's control loop could send
	// the credits that would let them go. The last credits stay back for
	// the control loop (dataReserve), so that two peers that both wait to
	// send can always tell each other they may.
	waited := false
	err := c.waitFor(ctx, func() bool {
		ok := c.mayTalk && c.credits > dataReserve
		if !ok && c.mayTalk && !waited {
			waited = true
			c.stats.CreditWaits++
			c.creditWaiters++
			c.wakeControl() // it may ask the peer for the credits it holds
		}
		return ok
	})
	if waited {
		if err != nil {
			c.mu.Lock()
		}
		c.creditWaiters--
		c.wakeControl() // what it owes may have waited for this send
		if err != nil {
			c.mu.Unlock()
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			return err
		}
		c.mu.Lock()
		heard := c.mayTalk
		c.mu.Unlock()
		if !heard {
			return fmt.Errorf("msg: the dialer has not spoken yet, and the accepting side never speaks first (iWARP forbids it): %w", err)
		}
		return fmt.Errorf("msg: no credit to send: the peer holds every message it was sent (it reads slowly, or took messages with RecvMessage without Release): %w", err)
	}
	if err := c.refuseLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	c.credits-- // this message's, held while it waits for a buffer
	c.posting.Add(1)
	c.mu.Unlock()
	err = c.sendMessage(ctx, typ, id, head, payload)
	if c.posting.Add(-1) == 0 && c.writeClosed.Load() {
		c.wakeControl() // it may send the end of data now
	}
	return err
}

// refuseLocked is why no message may be sent now: Close said goodbye, or
// CloseWrite was called; c.mu is held.
func (c *Conn) refuseLocked() error {
	switch {
	case c.closing:
		return seam.ErrClosedHere
	case c.writeClosed.Load():
		return ErrWriteClosed
	}
	return nil
}

// endedLocked is what a call on the ended connection (c.err set) returns:
// why it ended (Err), or, once this side's Close has begun, the error
// net's conns give after Close (calledAfterCloseLocked). c.mu is held.
func (c *Conn) endedLocked() error { return c.calledAfterCloseLocked(c.err) }

// endedErr is endedLocked for a caller that does not hold c.mu.
func (c *Conn) endedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endedLocked()
}

// calledAfterCloseLocked is err, the end of a call the connection's end
// failed, unless this side's Close has begun: then it is the error that
// matches net.ErrClosed, whoever ended the connection first, as net's
// conns answer every call after Close. c.mu is held.
func (c *Conn) calledAfterCloseLocked(err error) error {
	if c.closing {
		return seam.ErrClosedHere
	}
	return err
}

// sendMessage sends one message with the credit send took for it: it takes
// a send buffer, fills it and posts it, or gives the credit back.
func (c *Conn) sendMessage(ctx context.Context, typ Type, id uint64, head, payload []byte) error {
	b, err := c.sendBuffer(ctx)
	if err == nil {
		c.mu.Lock()
		if err = c.refuseLocked(); err != nil {
			c.mu.Unlock()
			c.sendPool.Put(b)
		}
	}
	if err != nil {
		c.mu.Lock()
		c.credits++
		c.signal()
		c.mu.Unlock()
		return err
	}
	h := Header{Type: typ, ID: id, Length: uint32(len(head) + len(payload))}
	if typ == TypeRendezvous {
		h.Flags = FlagRendezvous
	}
	c.stampLocked(&h)
	c.mu.Unlock()
	h.Encode(b.Bytes())
	copy(b.Bytes()[HeaderSize+copy(b.Bytes()[HeaderSize:], head):], payload)
	return c.post(outgoing{b: b, h: h})
}

// flush waits until every message posted so far has left this side (its
// send completed), or ctx ends. The last message posted must be signaled
// (outgoing.last): unsignaled sends after it would never come back.
func (c *Conn) flush(ctx context.Context) error {
	err := c.waitFor(ctx, func() bool { return c.sendPool.Stats().Out == 0 })
	if err == nil {
		c.mu.Unlock()
	}
	return err
}

// takeCreditLocked spends a credit on h, puts the credits owed to the
// peer in it and counts it sent; c.mu is held. post undoes it all when the
// endpoint refuses the message.
func (c *Conn) takeCreditLocked(h *Header) {
	c.credits--
	c.stampLocked(h)
}

// stampLocked puts the credits owed to the peer in h, which holds a credit
// already taken, and counts it sent; c.mu is held.
func (c *Conn) stampLocked(h *Header) {
	c.countSent(h, 1) // first: the peer's room for data counts h
	h.Credits = uint32(c.toGrant)
	h.Released = c.dataReleased
	c.granted += c.toGrant
	c.toGrant, c.toGrantReleased = 0, 0
	c.askedForCredit = c.creditStateLocked(c.eofWaitingLocked()).wantsCredit()
	if c.askedForCredit {
		h.Flags |= FlagWantsCredit
		c.stats.CreditAsksSent++ // countSent undoes it with the rest
	}
	c.lastSend = time.Now()
}

// countSent adds n (1, or -1 to undo) to the counts of messages sent like
// h; c.mu is held.
func (c *Conn) countSent(h *Header, n uint64) {
	c.stats.MessagesSent += n
	if h.Type == TypeCredit {
		c.stats.CreditMessagesSent += n
	}
	if h.Type.isData() {
		c.dataSent += uint32(n)
	}
	if h.Flags&FlagWantsCredit != 0 {
		c.stats.CreditAsksSent += n
	}
}

// maxRendezvous is the largest message: one RDMA READ moves at most 2 GiB.
const maxRendezvous = 1 << 31

// ErrTooLarge refuses a message larger than the peer receives
// (WithMaxRecvSize), or than one RDMA READ moves. Nothing was sent, and
// the connection goes on.
var ErrTooLarge = errors.New("msg: message too large")

// checkRendezvousSize refuses a message of size bytes that the peer would
// not receive.
func (c *Conn) checkRendezvousSize(size int) error {
	if size > c.peerMaxMessage {
		return fmt.Errorf("%w: %d bytes, more than the %d the peer receives", ErrTooLarge, size, c.peerMaxMessage)
	}
	return nil
}

// SendRegion sends the first n bytes of region as one message, as Send
// does, and above MaxInline without copying them: the peer reads them
// straight from region (RDMA READ). region must be registered in the
// connection's protection domain (bufpool.NewRegion(c.PD(), size,
// bufpool.RemoteRead)); anything else is refused before a byte is sent,
// with an error matching endpoint.ErrInvalid (a nil region, one the peer
// may not read, one in another domain), bufpool.ErrClosed (a closed
// region) or bufpool.ErrRange (n outside it).
//
// The bytes must not change until SendRegion returns. ctx bounds the wait
// for a credit to offer them; once they are offered, the peer may be
// reading them, so SendRegion then waits for the peer's read, which it
// starts as the offer arrives, or for the connection's end, whatever ctx
// does. region stays the caller's: SendRegion never closes it.
func (c *Conn) SendRegion(ctx context.Context, region *bufpool.Region, n int) error {
	if !c.made() {
		return errConnNotMade
	}
	return c.sendLent(ctx, TypeData, 0, nil, region, n)
}

// errNilRegion refuses to send from a region that is not there.
var errNilRegion = fmt.Errorf("msg: sending from a nil region: %w", endpoint.ErrInvalid)

// sendLent sends head, then the first n bytes of region, as one message
// of type typ, checking region as SendRegion says. Above MaxInline the
// peer reads the n bytes from region itself and head travels in the
// offer; where the offer cannot hold head (buffers smaller than a method
// name), region's bytes are copied as Send copies them.
func (c *Conn) sendLent(ctx context.Context, typ Type, id uint64, head []byte, region *bufpool.Region, n int) error {
	if region == nil {
		return errNilRegion
	}
	_, domain, err := seam.BufferSGE(region.Buffer(), 0, n) // closed, or n out of range
	if err != nil {
		return errorf("sending from a region: %w", err)
	}
	if len(head)+n <= c.maxInline {
		return c.send(ctx, typ, id, head, region.Bytes()[:n])
	}
	if region.Access()&bufpool.RemoteRead == 0 {
		return fmt.Errorf("msg: sending from a region the peer may not read (register it with bufpool.RemoteRead): %w", endpoint.ErrInvalid)
	}
	if domain != seam.DomainOf(c.PD()) {
		return fmt.Errorf("msg: sending from a region registered in another protection domain than the connection's (Conn.PD): %w", endpoint.ErrInvalid)
	}
	if c.writeClosed.Load() {
		return ErrWriteClosed
	}
	if err := c.checkRendezvousSize(len(head) + n); err != nil {
		return err
	}
	if n == 0 || rendezvousInfoSize+len(head) > c.maxInline {
		return c.sendRendezvous(ctx, typ, id, head, region.Bytes()[:n])
	}
	return c.offerRendezvous(ctx, typ, id, head, &pendingRendezvous{region: region, lent: true, done: make(chan struct{})}, n)
}

// sendRendezvous puts head and payload in a region the peer may read and
// offers it; the region goes back to the cache when the peer says it has
// read it (or is freed when the connection ends), even if ctx gives up
// first.
func (c *Conn) sendRendezvous(ctx context.Context, typ Type, id uint64, head, payload []byte) error {
	size := len(head) + len(payload)
	if err := c.checkRendezvousSize(size); err != nil {
		return err
	}
	region, err := c.rv.get(size, bufpool.RemoteRead)
	if err != nil {
		return err
	}
	copy(region.Bytes()[copy(region.Bytes(), head):], payload)
	return c.offerRendezvous(ctx, typ, id, nil, &pendingRendezvous{region: region, done: make(chan struct{})}, size)
}

// offerRendezvous sends the description of the first size bytes of
// p.region, after head, and waits for the peer's read. ctx bounds the
// wait for a credit to send the offer; once offered, the message arrives
// whatever ctx does, so offerRendezvous waits for the read or the
// connection's end: returning ctx's error then would report as failed a
// message the peer gets, after messages sent later.
func (c *Conn) offerRendezvous(ctx context.Context, typ Type, id uint64, head []byte, p *pendingRendezvous, size int) error {
	region := p.region
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		if !p.lent {
			region.Close()
		}
		return c.endedErr()
	}
	c.nextRV++
	rv := c.nextRV
	c.rvSend[rv] = p
	c.mu.Unlock()

	remote := region.Remote()
	info := rendezvousInfo{Type: typ, RVID: rv, Addr: remote.Addr, RKey: remote.RKey, Length: uint32(size), Head: head}
	var body [rendezvousInfoSize + maxRendezvousHead]byte
	info.encode(body[:])
	if err := c.send(ctx, TypeRendezvous, id, nil, body[:info.size()]); err != nil {
		c.mu.Lock()
		if _, ok := c.rvSend[rv]; ok { // never offered: nobody will read it
			delete(c.rvSend, rv)
			c.giveBack(p)
		}
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	c.stats.RendezvousSent++
	c.stats.RendezvousBytesSent += uint64(len(head) + size)
	c.mu.Unlock()
	select {
	case <-p.done:
		return nil
	case <-c.done:
		// The peer may have confirmed the read just before the end:
		// once every message that came before it is handled, p.done
		// says so.
		<-c.recvEnded
		select {
		case <-p.done:
			return nil
		default:
		}
		if p.lent {
			<-c.ep.Done() // the QP no longer answers the peer's reads
		}
		return c.endedErr()
	}
}
