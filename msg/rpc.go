package msg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
)

// Handler serves one call: method and request in, response or error out.
// Handlers run concurrently: the connection's serving goroutine runs a
// call itself when it is free, and a call that arrives while it is busy
// gets a goroutine of its own. req is a copy the handler may keep, and the
// response is the handler's no more once returned. ctx ends when the
// connection does; PeerAddr(ctx) is the caller's address. An error
// reaches the caller as a *RemoteError with its text and Code (the one it
// wraps, or CodeUnknown); a panic is recovered, logged, and reaches the
// caller with CodeInternal. A handler may answer with a response it lends
// from registered memory instead (Respond). A Mux dispatches by method.
type Handler func(ctx context.Context, method string, req []byte) ([]byte, error)

// ErrShutdown is returned by Serve after Shutdown.
var ErrShutdown = errors.New("msg: server shut down")

// A request's payload: method length u8, method, then the caller's bytes.
// requestHead writes the part before the caller's bytes into buf.
func requestHead(buf *[256]byte, method string) ([]byte, error) {
	if len(method) == 0 || len(method) > 255 {
		return nil, errorf("method name of %d bytes: 1 to 255", len(method))
	}
	buf[0] = byte(len(method))
	return buf[:1+copy(buf[1:], method)], nil
}

// decodeRequest splits a request's payload into its method's name and the
// caller's bytes; both are p's.
func decodeRequest(p []byte) (method, req []byte, err error) {
	if len(p) < 1 || p[0] == 0 || len(p) < 1+int(p[0]) {
		return nil, nil, fmt.Errorf("%w: request without a method", ErrMalformed)
	}
	end := 1 + int(p[0]) // in int: a 255-byte method's 1+p[0] wraps to 0 in byte arithmetic
	return p[1:end], p[end:], nil
}

// maxMethodNames bounds the names a Server keeps (methodNames): a server
// has a handful of methods, and callers that send ever new names must
// not make it grow without end.
const maxMethodNames = 256

// methodNames turns a request's method name into the string its handler
// gets, without an allocation for a name seen before: each call would
// otherwise allocate one. Lookups take no lock (the map is replaced, never
// changed); the first maxMethodNames names are kept, later ones are made
// anew for each call.
type methodNames struct {
	mu    sync.Mutex // held to add a name
	known atomic.Pointer[map[string]string]
}

// name is b as a string, the same string for the same kept name.
func (n *methodNames) name(b []byte) string {
	if known := n.known.Load(); known != nil {
		if s, ok := (*known)[string(b)]; ok { // the conversion in an index does not allocate
			return s
		}
	}
	s := string(b)
	n.mu.Lock()
	defer n.mu.Unlock()
	old := n.known.Load()
	if old == nil {
		old = &map[string]string{}
	}
	if kept, ok := (*old)[s]; ok { // added since the lookup above
		return kept
	}
	if len(*old) < maxMethodNames {
		grown := maps.Clone(*old)
		grown[s] = s
		n.known.Store(&grown)
	}
	return s
}

// Client calls a Server over one Conn; many calls run at once, told apart
// by request id. Safe for concurrent use.
type Client struct {
	c        *Conn
	mu       sync.Mutex
	nextID   uint64
	pending  map[uint64]chan arrival
	loopDone chan struct{}
	polling  atomic.Bool   // a caller drives the endpoint (call)
	waiting  atomic.Int32  // callers waiting for their responses
	turn     chan struct{} // the polling, offered to a waiting caller (1 deep)
}

// made says whether cl is a Client NewClient made on a connection.
func (cl *Client) made() bool { return cl != nil && cl.c != nil }

var errClientNotMade = invalid("a Client not made by NewClient or DialClient on a connection")

// NewClient makes a Client that owns c. With a nil or zero c (not made
// by Dial or Accept) the Client serves nothing: its calls and Close fail
// with an error matching endpoint.ErrInvalid.
func NewClient(c *Conn) *Client {
	if c == nil || c.ep == nil {
		return &Client{}
	}
	cl := &Client{c: c, pending: map[uint64]chan arrival{}, loopDone: make(chan struct{}), turn: make(chan struct{}, 1)}
	c.setRouter(cl.route)
	go cl.run()
	return cl
}

// DialClient dials a Server at addr.
func DialClient(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	c, err := Dial(ctx, addr, opts...)
	if err != nil {
		return nil, err
	}
	return NewClient(c), nil
}

func (cl *Client) run() {
	defer close(cl.loopDone)
	ctx := contextUntil(cl.c.Done())
	for {
		// Responses are routed where they are handled; this goroutine
		// only waits for the rest (the server's half-close, or what
		// arrived before the Client was made), and does not poll: the
		// caller waiting for a response does (call).
		m, err := cl.c.awaitArrival(ctx)
		if err != nil {
			if err == io.EOF { // the server half-closed: no response will come
				cl.c.fail(fmt.Errorf("msg: the server sends no more responses: %w", ErrPeerClosed))
			}
			return
		}
		if cl.route(m) == toInbox {
			cl.c.fail(fmt.Errorf("%w: a client received a %v message", ErrMalformed, m.typ))
			cl.c.release(m)
			return
		}
	}
}

// route hands a response to its caller, and leaves any other message to
// the inbox. The connection's completion handler calls it for every arrival
// (setRouter), and run for those that arrived before the Client was made.
// It never blocks.
func (cl *Client) route(m arrival) routing {
	if m.typ != TypeResponse && m.typ != TypeError {
		return toInbox
	}
	cl.mu.Lock()
	ch, ok := cl.pending[m.id]
	delete(cl.pending, m.id)
	if ok {
		// Under mu, so that a caller that gives up (and forgets its id
		// under mu) either finds the response in ch or is never sent
		// it. ch has room for its one response. The caller is likely to
		// call again: readied until it takes the response.
		cl.c.out.readied.Add(1)
		ch <- m
	}
	cl.mu.Unlock()
	if !ok { // the caller gave up
		cl.c.release(m)
	}
	return routed
}

// Call sends a request and waits for its response, until ctx ends (the
// late response is then dropped). A request larger than MaxInline is sent
// as Send sends it: once offered, Call returns only after the server has
// read it, even if ctx ended meanwhile. A handler's error is a
// *RemoteError, which errors.Is matches to its Code. A request larger than
// the server receives fails at once with an error matching ErrTooLarge; a
// response larger than this client receives (WithMaxRecvSize on
// DialClient) fails the call with CodeResourceExhausted.
func (cl *Client) Call(ctx context.Context, method string, req []byte) ([]byte, error) {
	return cl.call(ctx, method, req, nil, 0)
}

// CallRegion is Call with the request's bytes, the first n of region,
// lent as Conn.SendRegion lends them: above MaxInline the server reads
// them straight from region, without a copy on this side, and the method
// goes with the offer. region is checked as SendRegion checks it, before
// anything is sent. Its bytes must not change until CallRegion returns;
// once offered, they are waited for past ctx's end, until the server has
// read them (or the connection ended), and then the response is waited
// for within ctx.
func (cl *Client) CallRegion(ctx context.Context, method string, region *bufpool.Region, n int) ([]byte, error) {
	if region == nil {
		return nil, errNilRegion
	}
	return cl.call(ctx, method, nil, region, n)
}

// call sends a request as call id, the method's head before its bytes:
// req's (Call), or the first n of region's, lent (CallRegion; region not
// nil). It calls the send directly, not through a function value, and
// takes req and region apart, not in one struct, so that neither the head
// nor the caller's req has to leave the stack: a call allocates nothing of
// its own but the response's copy.
func (cl *Client) call(ctx context.Context, method string, req []byte, region *bufpool.Region, n int) ([]byte, error) {
	if !cl.made() {
		return nil, errClientNotMade
	}
	var buf [256]byte
	head, err := requestHead(&buf, method)
	if err != nil {
		return nil, err
	}
	ch := replyChans.Get().(chan arrival)
	cl.mu.Lock()
	cl.nextID++
	id := cl.nextID
	cl.pending[id] = ch
	cl.mu.Unlock()
	forget := func() {
		cl.mu.Lock()
		delete(cl.pending, id)
		cl.mu.Unlock()
	}
	// giveUp forgets the call and gives back a response route sent before
	// that (its receive or rendezvous region, and the server's credit).
	// Even a send that failed as the connection ended may have been
	// answered: a request sent by rendezvous is sent once the server
	// confirms it read it, and the server may answer first.
	giveUp := func() {
		forget()
		select {
		case m := <-ch:
			cl.c.out.readied.Add(-1)
			cl.c.release(m)
		default:
		}
	}
	if region != nil {
		err = cl.c.sendLent(ctx, TypeRequest, id, head, region, n)
	} else {
		err = cl.c.send(ctx, TypeRequest, id, head, req)
	}
	if err != nil {
		giveUp()
		return nil, err
	}
	// One waiting caller at a time drives the endpoint itself (polling),
	// so that the completion it waits for is handled in its goroutine,
	// with no hand-off; it routes the other callers' responses on its
	// way. Once it has its own, it hands the polling on to a caller still
	// waiting (turn), which then polls for its own.
	cl.waiting.Add(1)
	defer cl.waiting.Add(-1)
	mayPoll := true
	for {
		if mayPoll && cl.polling.CompareAndSwap(false, true) {
			m, ok := driveFor(cl.c, ctx, ch)
			cl.polling.Store(false)
			cl.handOn()
			if ok {
				replyChans.Put(ch)
				return cl.response(method, m)
			}
			mayPoll = false // ctx ended, or the endpoint is closing: the select says which
		}
		select {
		case m := <-ch:
			replyChans.Put(ch) // route sent its one response: it is empty and nobody else's
			return cl.response(method, m)
		case <-cl.turn:
			if !mayPoll {
				cl.handOn()
			}
		case <-ctx.Done():
			giveUp() // a response that came as ctx ended goes back
			return nil, ctx.Err()
		case <-cl.c.Done():
			<-cl.loopDone // every response that arrived has been routed
			forget()
			select { // it may have arrived just before the end
			case m := <-ch:
				return cl.response(method, m)
			default:
			}
			return nil, cl.c.endedErr()
		}
	}
}

// handOn offers the polling to a caller still waiting, if there is one
// (besides the caller that hands it on).
func (cl *Client) handOn() {
	if cl.waiting.Load() > 1 {
		select {
		case cl.turn <- struct{}{}:
		default: // one is on offer already
		}
	}
}

// replyChans are the channels on which run hands each caller its
// response, reused so that a call allocates none. Only a channel that
// delivered its response goes back: one whose call gave up may still get
// a late send from run.
var replyChans = sync.Pool{New: func() any { return make(chan arrival, 1) }}

// response turns a reply into Call's result (a copy) and releases it.
func (cl *Client) response(method string, m arrival) ([]byte, error) {
	cl.c.out.readied.Add(-1) // route readied this caller; it runs
	defer cl.c.release(m)
	if m.typ == TypeError {
		return nil, decodeError(method, m.payload)
	}
	return append([]byte(nil), m.payload...), nil
}

// conn is the client's connection: nil for a Client not made on one,
// whose accessors then answer as a nil Conn's do.
func (cl *Client) conn() *Conn {
	if cl == nil {
		return nil
	}
	return cl.c
}

// PD is the protection domain of the client's connection: register the
// regions CallRegion lends in it.
func (cl *Client) PD() *bufpool.PD { return cl.conn().PD() }

// LocalAddr is this side's address of the client's connection.
func (cl *Client) LocalAddr() net.Addr { return cl.conn().LocalAddr() }

// RemoteAddr is the server's address.
func (cl *Client) RemoteAddr() net.Addr { return cl.conn().RemoteAddr() }

// Close closes the connection; calls in flight return errors.
func (cl *Client) Close() error {
	if !cl.made() {
		return errClientNotMade
	}
	err := cl.c.Close()
	<-cl.loopDone
	return err
}

// Server serves calls with a Handler on every connection a Listener accepts.
type Server struct {
	h Handler

	mu       sync.Mutex
	l        *Listener
	conns    map[*Conn]struct{}
	shutdown bool
	active   int            // handlers running
	calls    uint64         // calls answered, with a response or an error
	errors   uint64         // of those, with an error
	idle     chan struct{}  // closed when active drops to 0; nil while nobody waits
	connWG   sync.WaitGroup // connection goroutines (Add only before Shutdown's Wait: under mu, while !shutdown)
	methods  methodNames
}

// NewServer makes a Server that answers with h.
func NewServer(h Handler) *Server {
	return &Server{h: h, conns: map[*Conn]struct{}{}}
}

// Serve accepts connections on l and serves them until Shutdown (then it
// returns ErrShutdown) or l fails. Serve owns l. A Server with no Handler
// (nil, zero, or NewServer(nil)) serves nothing: Serve fails at once with
// an error matching endpoint.ErrInvalid.
func (s *Server) Serve(ctx context.Context, l *Listener) error {
	if s == nil || s.h == nil {
		l.Close() // Serve owns l; a nil or zero l refuses this too
		return invalid("a Server without a Handler (make one with NewServer(h), h not nil)")
	}
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		l.Close()
		return ErrShutdown
	}
	s.l = l
	s.mu.Unlock()
	for {
		c, err := l.Accept(ctx)
		if err != nil {
			s.mu.Lock()
			down := s.shutdown
			s.mu.Unlock()
			if down {
				return ErrShutdown
			}
			return err
		}
		s.mu.Lock()
		if s.shutdown {
			s.mu.Unlock()
			c.Close()
			return ErrShutdown
		}
		s.conns[c] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// serveConn serves c's calls. While this goroutine waits for a request,
// it holds a token (waiting): the router gives the first request to come
// back to it through the inbox (handed), and it runs the handler and sends
// the response itself, so a lone caller's request is answered with no
// goroutine started and no hand-off, by the goroutine that polled for it.
// It takes the token again only once that request is in its hands. Every
// other request starts its handler in a goroutine of its own: from the
// router (setRouter) while the token is out, or from this loop when it
// arrived before the router was set; so one connection's calls still run
// concurrently, and none waits behind another. The loop ends the
// connection on anything but a request, or when it ends.
func (s *Server) serveConn(c *Conn) {
	defer s.connWG.Done()
	ctx := context.WithValue(contextUntil(c.Done()), peerKey{}, c.RemoteAddr())
	var waiting atomic.Bool // the token is out: the next request is this goroutine's
	c.setRouter(func(m arrival) routing {
		if m.typ != TypeRequest {
			return toInbox
		}
		if waiting.CompareAndSwap(true, false) {
			return toInboxHanded
		}
		if err := s.start(ctx, c, m, true); err != nil {
			c.fail(err)
		}
		return routed
	})
	out := false // a token was given and its request has not come back yet
	for {
		if !out {
			waiting.Store(true)
			out = true
		}
		m, err := c.recv(ctx)
		if err != nil {
			break
		}
		if m.typ != TypeRequest {
			c.release(m)
			c.fail(fmt.Errorf("%w: a server received a %v message", ErrMalformed, m.typ))
			break
		}
		if m.handed {
			out = false
		}
		if err := s.start(ctx, c, m, !m.handed); err != nil {
			c.fail(err)
		}
	}
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

// start runs the handler of request m with a copy of the request (m is
// released, so that its credit goes back at once) and sends the response:
// in a goroutine of its own when concurrent (then start never blocks),
// otherwise in this goroutine.
func (s *Server) start(ctx context.Context, c *Conn, m arrival, concurrent bool) error {
	name, req, err := decodeRequest(m.payload)
	if err != nil {
		c.release(m)
		return err
	}
	k := &serverCall{Context: ctx, s: s, c: c, id: m.id, method: s.methods.name(name)}
	if n := len(req); n > 0 && n <= len(k.small) {
		k.req = k.small[:n:n]
		copy(k.req, req)
	} else {
		k.req = append([]byte(nil), req...)
	}
	c.release(m)
	s.callStarts()
	c.out.readied.Add(1) // until its response is on its way
	if concurrent {
		go k.answer()
	} else {
		k.answer()
	}
	return nil
}

// serverCall is one call a Server answers. It is its handler's context:
// the connection's (which ends with it and carries PeerAddr) and the call
// itself, for Respond and CallPD. One allocation holds both, and the copy
// of a small request: the handler may keep req, which keeps the call.
type serverCall struct {
	context.Context
	s      *Server
	c      *Conn
	id     uint64
	method string
	req    []byte
	small  [smallRequest]byte // req's bytes, when they fit
	// state is callOpen while the handler may still Respond, then
	// callResponded (Respond took the answer) or callReturned (what the
	// handler returns is sent).
	state atomic.Int32
}

// smallRequest is the largest request copied into its serverCall rather
// than an allocation of its own.
const smallRequest = 64

const (
	callOpen int32 = iota
	callResponded
	callReturned
)

type callKey struct{}

// Value finds the call for Respond and CallPD, and the connection's
// values (PeerAddr) through the context it wraps.
func (k *serverCall) Value(key any) any {
	if key == (callKey{}) {
		return k
	}
	return k.Context.Value(key)
}

// answer runs the handler and sends what it returns, unless it answered
// with Respond.
func (k *serverCall) answer() {
	failed := false
	defer func() { k.s.callEnds(failed) }()
	resp, herr := k.s.call(k, k.c, k.method, k.req)
	if !k.state.CompareAndSwap(callOpen, callReturned) {
		return // Respond sent the answer
	}
	typ := TypeResponse
	if herr != nil {
		typ, resp, failed = TypeError, encodeError(herr), true
	}
	k.c.out.readied.Add(-1)
	// Fails only when the connection has ended, or when the caller would
	// not take so large a response: then it learns why instead.
	if err := k.c.send(k, typ, k.id, nil, resp); errors.Is(err, ErrTooLarge) {
		failed = true
		k.c.send(k, TypeError, k.id, nil, encodeError(fmt.Errorf("a %d-byte response, more than the caller receives: %w", len(resp), CodeResourceExhausted)))
	}
}

// call runs the handler. A handler that panics fails its call (the caller
// gets a *RemoteError) and is logged; the server serves on, as net/http's
// does.
func (s *Server) call(ctx context.Context, c *Conn, method string, req []byte) (resp []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.o.logger.Error().Str("method", method).Interface("panic", p).
				Str("stack", string(debug.Stack())).Msg("msg: handler panicked")
			resp, err = nil, fmt.Errorf("the handler panicked: %v: %w", p, CodeInternal)
		}
	}()
	return s.h(ctx, method, req)
}

// Respond answers the call whose handler got ctx (or a context made from
// it) with the first n bytes of region, lent as Conn.SendRegion lends
// them: above the connection's MaxInline the caller reads them straight
// from region, with no copy on this side. region must be registered for
// remote read in the protection domain of the call's connection
// (CallPD); a region Respond refuses is refused with SendRegion's errors
// before anything is sent, and the call is still the handler's to
// answer. ctx bounds the wait for a credit to offer them, as SendRegion's
// does; once offered, Respond returns when the caller's side has read the
// bytes, or the connection has ended: region is then the handler's again.
//
// A call is answered once: after a Respond that succeeded, what the
// handler returns is not sent, and another Respond fails with an error
// matching endpoint.ErrInvalid, as does a ctx that is not a handler's.
// Respond must return before the handler does, as net/http's
// ResponseWriter must not be used after ServeHTTP returns.
func Respond(ctx context.Context, region *bufpool.Region, n int) error {
	k, _ := ctx.Value(callKey{}).(*serverCall)
	if k == nil {
		return fmt.Errorf("msg: Respond: ctx is not a handler's: %w", endpoint.ErrInvalid)
	}
	if !k.state.CompareAndSwap(callOpen, callResponded) {
		return fmt.Errorf("msg: Respond: the call was answered already: %w", endpoint.ErrInvalid)
	}
	k.c.out.readied.Add(-1)
	if err := k.c.sendLent(ctx, TypeResponse, k.id, nil, region, n); err != nil {
		// Nothing reached the caller (or the connection has ended, and
		// nothing will): the handler still answers.
		k.c.out.readied.Add(1)
		k.state.Store(callOpen)
		return err
	}
	return nil
}

// CallPD is the protection domain of the connection that the call whose
// handler got ctx came on: register the regions Respond lends in it (or
// share one domain among the server's connections with cm.WithPD). Nil
// for a ctx that is not a handler's.
func CallPD(ctx context.Context) *bufpool.PD {
	if k, _ := ctx.Value(callKey{}).(*serverCall); k != nil {
		return k.c.PD()
	}
	return nil
}

// callStarts and callEnds count running handlers, callEnds also the calls
// answered, failed ones apart. (Not a WaitGroup: calls still arrive while
// Shutdown waits, and a WaitGroup's Add must not race with its Wait.)
func (s *Server) callStarts() {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
}

func (s *Server) callEnds(failed bool) {
	s.mu.Lock()
	s.calls++
	if failed {
		s.errors++
	}
	s.active--
	if s.active == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
	s.mu.Unlock()
}

// waitIdle waits until no handler runs, or ctx ends.
func (s *Server) waitIdle(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.active == 0 {
			s.mu.Unlock()
			return nil
		}
		if s.idle == nil {
			s.idle = make(chan struct{})
		}
		idle := s.idle
		s.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Shutdown stops accepting, lets the calls in flight finish (until ctx
// ends), then closes every connection. Calls arriving meanwhile are still
// served. It returns ctx's error if calls were cut short. A nil Server's
// fails with an error matching endpoint.ErrInvalid.
func (s *Server) Shutdown(ctx context.Context) error {
	if s == nil {
		return invalid("a nil Server")
	}
	s.mu.Lock()
	s.shutdown = true
	l := s.l
	s.mu.Unlock()
	if l != nil {
		l.Close()
	}
	err := s.waitIdle(ctx)
	s.mu.Lock()
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close() // its goodbye lets the responses posted so far leave first
	}
	s.connWG.Wait()
	s.waitIdle(context.Background()) // handlers see their ctx end with the connection
	return err
}
