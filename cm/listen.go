package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/cmevent"
	"github.com/go-rdma/rdmacm/internal/lookup"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
	"github.com/rs/zerolog"
)

// ErrListenerClosed is returned by Accept after Close. It matches net.ErrClosed.
var ErrListenerClosed = fmt.Errorf("cm: listener closed: %w", net.ErrClosed)

// Listener accepts RDMA connections on one address.
type Listener struct {
	ids  []passiveID // one, or [::] and 0.0.0.0 for both families (Listen)
	o    listenOptions
	addr net.Addr

	srq       *endpoint.SRQ
	reqs      chan *Request
	closing   chan struct{}
	loops     sync.WaitGroup // one run per id
	failed    chan struct{}  // closed, with failErr set, when no request can come (fail)
	failOnce  sync.Once
	failErr   error
	closeOnce sync.Once
	closeErr  error
}

// passiveID is a listening id and its share of the process's CM event
// channel.
type passiveID struct {
	id *verbs.CMID
	q  *cmevent.Queue
}

// Listen binds to addr ("host:port") and listens. An empty host or [::]
// listens on every RDMA-capable address of both families, as net's
// ":port" does, and Addr then gives [::] (or, where the kernel has no
// IPv6, 0.0.0.0: IPv4 alone); 0.0.0.0 listens on every IPv4 one. A name
// is looked up with net's resolver, and, as net's Listen does, one of its
// addresses taken, IPv4 if it has one. A port in use fails with an error
// matching syscall.EADDRINUSE. ctx bounds the lookup.
// A loopback address (127.0.0.1, ::1, localhost) is refused with an error
// matching syscall.EADDRNOTAVAIL: no RDMA device has one, and rdma_cm
// would take it for a wildcard on RoCE and InfiniBand, where peers
// anywhere could connect, and keep it on iWARP, where none could. Options
// no connection could hold are refused with an error matching
// endpoint.ErrInvalid: on one device's address, what that device cannot
// hold; on a wildcard, what none of the host's devices can (Accept
// refuses what only the device a request arrives on cannot).
func Listen(ctx context.Context, addr string, opts ...ListenOption) (*Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o, err := newListenOptions(opts)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	ids, err := bindPassive(ctx, host, port)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	l := &Listener{o: o, reqs: make(chan *Request, o.backlog),
		closing: make(chan struct{}), failed: make(chan struct{})}
	fail := func(err error) (*Listener, error) {
		for _, id := range ids { // those not yet on a queue
			id.DestroyEP()
		}
		l.destroyIDs()
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	if ids[0].OnLoopback() {
		return fail(errLoopbackListen)
	}
	// As librdmacm's rdma_server.c: rdma_create_ep binds a passive id;
	// it then moves to the process's event channel for rdma_listen.
	for len(ids) > 0 {
		id := ids[0]
		q, err := cmevent.NewQueue()
		if err != nil {
			return fail(err)
		}
		ids = ids[1:]
		if err := q.Adopt(id); err != nil {
			q.Close(destroyEP(id))
			return fail(err)
		}
		// The kernel's backlog bounds only the requests whose events the
		// listener has not read, and it drops, not rejects, those past
		// it: the dialer's CM sends its request again seconds later. The
		// listener reads at once and bounds what waits for Accept
		// itself (rejecting the rest), so the kernel's is its largest.
		if err := id.Listen(maxBacklog); err != nil {
			q.Close(destroyEP(id))
			// The IPv6 half of a listener on both families, where the
			// kernel has no IPv6 (soft-iWARP listens on kernel sockets):
			// as net does, listen on IPv4 alone.
			if errors.Is(err, syscall.EAFNOSUPPORT) && len(ids) > 0 {
				continue
			}
			return fail(err)
		}
		l.ids = append(l.ids, passiveID{id, q})
	}
	l.addr = l.ids[0].id.LocalAddr()
	if o.srqDepth > 0 {
		dev := l.ids[0].id.Context()
		if dev == nil {
			return fail(errors.New("a shared receive queue needs the address of one RDMA device, not a wildcard"))
		}
		srq, err := seam.NewSRQ(dev, o.conn.ep.PD, o.srqDepth, max(o.conn.ep.MaxSGE, 1))
		if err != nil {
			return fail(err)
		}
		l.srq = srq.(*endpoint.SRQ)
		l.o.conn.ep.SRQ = l.srq
	}
	// What no connection could hold is refused now: bound to one device,
	// what that device cannot hold; on a wildcard, what none of the
	// devices can. Accept refuses what only the device a request comes on
	// cannot.
	devs := []*verbs.Context{l.ids[0].id.Context()}
	if devs[0] == nil {
		devs = verbs.Devices()
	}
	if err := fitsSomeDevice(devs, l.o.conn.ep); err != nil {
		if l.srq != nil {
			l.srq.Destroy() // nothing was posted to it yet
		}
		return fail(err)
	}
	for _, p := range l.ids {
		l.loops.Add(1)
		go l.run(p.q)
	}
	return l, nil
}

// fitsSomeDevice returns nil if one of devs (or none being known) could
// hold connections made with cfg, and otherwise the first device's
// refusal, which names the option.
func fitsSomeDevice(devs []*verbs.Context, cfg seam.EndpointConfig) error {
	var first error
	for _, dev := range devs {
		err := seam.CheckLimits(dev, cfg)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// bindPassive binds the ids a listener on host and port needs: one, or,
// for a host that names every address of both families, one on [::] that
// takes IPv6 only and one on 0.0.0.0 at the same port. rdma_cm's own [::]
// cannot stand for both: soft-iWARP's takes IPv6 dials only.
func bindPassive(ctx context.Context, host, port string) ([]*verbs.CMID, error) {
	if !bothFamilies(host) {
		host, err := lookup.PreferIPv4(ctx, host)
		if err != nil {
			return nil, err
		}
		id, err := bindEP(host, port)
		if err != nil {
			return nil, err
		}
		return []*verbs.CMID{id}, nil
	}
	for tries := 1; ; tries++ {
		id6, err := bindEP("::", port)
		if err != nil {
			return nil, err
		}
		if err := id6.SetAFOnly(); err != nil {
			id6.DestroyEP()
			return nil, err
		}
		bound := strconv.Itoa(id6.LocalAddr().(*net.TCPAddr).Port)
		id4, err := bindEP("0.0.0.0", bound)
		if err == nil {
			return []*verbs.CMID{id6, id4}, nil
		}
		id6.DestroyEP()
		// The port chosen for [::] may be taken for IPv4: choose again.
		if !anyPort(port) || !errors.Is(err, syscall.EADDRINUSE) || tries == maxPortTries {
			return nil, err
		}
	}
}

// bothFamilies says whether host names every address of both families:
// no host, or the IPv6 wildcard.
func bothFamilies(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.To4() == nil && ip.IsUnspecified()
}

// maxPortTries bounds how often bindPassive chooses a port for both
// families.
const maxPortTries = 16

// bindEP binds a passive id to host and port. The id has no event channel
// yet. rdma_cm refuses a port shared with a wildcard with EADDRNOTAVAIL, as
// it refuses an address no device has: binding host alone tells the two
// apart, and a port in use is reported as net reports it.
func bindEP(host, port string) (*verbs.CMID, error) {
	id, err := createEP(host, port)
	if !errors.Is(err, syscall.EADDRNOTAVAIL) || anyPort(port) {
		return id, err
	}
	if probe, perr := createEP(host, "0"); perr == nil {
		probe.DestroyEP()
		return nil, fmt.Errorf("rdma_create_ep: port %s is in use: %w", port, syscall.EADDRINUSE)
	}
	return nil, err
}

// createEP binds a passive id to host and port (rdma_create_ep).
func createEP(host, port string) (*verbs.CMID, error) {
	ai, err := verbs.GetAddrInfo(host, port, true, verbs.PortSpaceTCP)
	if err != nil {
		return nil, err
	}
	defer ai.Free()
	return verbs.CreateEP(ai)
}

// anyPort says whether port asks for any free port.
func anyPort(port string) bool {
	n, err := strconv.Atoi(port)
	return port == "" || err == nil && n == 0
}

// errLoopbackListen is Listen's refusal of a loopback address: a program
// listens there to be reachable from its own host only, which rdma_cm
// cannot give (see Listen).
var errLoopbackListen = fmt.Errorf("a loopback address has no RDMA device (a listener there takes dials from other hosts, or from none): listen on the address of an RDMA-capable interface: %w", syscall.EADDRNOTAVAIL)

// SRQ is the listener's shared receive queue (WithSharedReceiveQueue), or
// nil. Post receives to it; destroy it after the listener and every
// endpoint it accepted are closed.
func (l *Listener) SRQ() *endpoint.SRQ {
	if !l.made() {
		return nil
	}
	return l.srq
}

// made says whether l was made by Listen. A nil or zero Listener's calls
// fail with errListenerNotMade and its Addr and SRQ are nil, instead of
// panicking or, for its Accepts, waiting for ever.
func (l *Listener) made() bool { return l != nil && l.closing != nil }

var errListenerNotMade = fmt.Errorf("%w: a Listener not made by Listen", endpoint.ErrInvalid)

// Addr is the bound address (with the port chosen, if port 0 was asked).
func (l *Listener) Addr() net.Addr {
	if !l.made() {
		return nil
	}
	return l.addr
}

// Request is a connect request waiting to be accepted or rejected. Exactly
// one of Accept and Reject must be called; a second call, or a call on a
// nil or zero Request, fails with an error matching endpoint.ErrInvalid.
// A Request dropped without either is rejected once the garbage collector
// finds it unreachable, as an os.File dropped open is closed, so that its
// id is freed; until then its dialer waits.
type Request struct {
	answered    atomic.Bool     // Accept or Reject was called
	unanswered  runtime.Cleanup // rejects a Request dropped unanswered
	id          *verbs.CMID
	q           *cmevent.Queue
	o           connOptions // the listener's
	respRes     int
	initDepth   int
	privateData []byte
	remoteAddr  net.Addr
	localAddr   net.Addr
}

// PrivateData is what the dialer sent with its connect request
// (WithPrivateData), padded by the CM with zeros.
func (r *Request) PrivateData() []byte {
	if r == nil {
		return nil
	}
	return r.privateData
}

// RemoteAddr is the dialer's address.
func (r *Request) RemoteAddr() net.Addr {
	if r == nil {
		return nil
	}
	return r.remoteAddr
}

// LocalAddr is the address the request arrived at.
func (r *Request) LocalAddr() net.Addr {
	if r == nil {
		return nil
	}
	return r.localAddr
}

// answer claims r for the one Accept or Reject it may have. The request's
// id belongs to that call from then on (to the connection, or freed), so
// a second call must not reach it.
func (r *Request) answer() error {
	if r == nil || r.id == nil {
		return fmt.Errorf("%w: a Request not made by AcceptRequest", endpoint.ErrInvalid)
	}
	if r.answered.Swap(true) {
		return fmt.Errorf("%w: the Request was accepted or rejected already", endpoint.ErrInvalid)
	}
	r.unanswered.Stop()
	return nil
}

// droppedRequest is what rejecting a Request dropped unanswered needs:
// its id and queue, and nothing that keeps the Request itself reachable.
type droppedRequest struct {
	id  *verbs.CMID
	q   *cmevent.Queue
	log zerolog.Logger
}

// rejectDropped rejects a Request the garbage collector found unanswered
// and frees its id (Request's contract). It runs on the runtime's cleanup
// goroutine, so it only logs what fails.
func rejectDropped(d droppedRequest) {
	d.log.Warn().Stringer("remote", d.id.RemoteAddr()).Msg("listener: a Request was dropped without Accept or Reject; rejecting it")
	r := Request{id: d.id, q: d.q}
	if err := r.reject(nil); err != nil {
		d.log.Error().Err(err).Msg("listener: rejecting a dropped Request")
	}
}

// run takes the events of one of the listener's ids. Each connect
// request's new id comes with a queue of its own, so the request (and
// later its connection) never depends on the listener staying open.
func (l *Listener) run(q *cmevent.Queue) {
	defer l.loops.Done()
	for {
		ev, err := q.Next(context.Background())
		if err != nil {
			select {
			case <-l.closing:
				return
			default:
			}
			// The process's CM event channel failed: no request can
			// arrive any more, and Accept says so.
			l.o.conn.logger.Error().Err(err).Msg("listener: reading CM events")
			l.fail(err)
			<-l.closing
			return
		}
		if ev.Type == verbs.EventDeviceRemoval {
			// The id was bound to that device (a wildcard's is not):
			// no request can arrive any more, and Accept says so
			// instead of waiting for ever.
			ev.Ack()
			l.o.conn.logger.Error().Msg("listener: the RDMA device was removed; it accepts no more connections")
			l.fail(ErrDeviceRemoved)
			continue
		}
		if ev.Type != verbs.EventConnectRequest {
			l.o.conn.logger.Debug().Stringer("event", ev.Type).Msg("listener: ignored event")
			ev.Ack()
			continue
		}
		req := &Request{id: ev.ID, q: ev.Queue, o: l.o.conn, privateData: ev.PrivateData,
			respRes: ev.InitiatorDepth, initDepth: ev.ResponderResources,
			remoteAddr: ev.ID.RemoteAddr(), localAddr: ev.ID.LocalAddr()}
		req.unanswered = runtime.AddCleanup(req, rejectDropped,
			droppedRequest{id: ev.ID, q: ev.Queue, log: l.o.conn.logger})
		ev.Ack()
		select {
		case l.reqs <- req:
		default:
			l.o.conn.logger.Warn().Stringer("remote", req.remoteAddr).Msg("listener: backlog full; rejecting a connect request")
			req.Reject(nil)
		}
	}
}

// fail makes Accept and AcceptRequest return err, wrapped, from now on:
// the listener can take no more requests.
func (l *Listener) fail(err error) {
	l.failOnce.Do(func() {
		l.failErr = fmt.Errorf("cm: accept: %w", err)
		close(l.failed)
	})
}

// AcceptRequest waits for the next connect request. It fails as Accept
// does once no request can arrive (the device removed).
func (l *Listener) AcceptRequest(ctx context.Context) (*Request, error) {
	if !l.made() {
		return nil, errListenerNotMade
	}
	select {
	case <-l.closing:
		return nil, ErrListenerClosed
	default:
	}
	select {
	case req := <-l.reqs:
		return req, nil
	case <-l.closing:
		return nil, ErrListenerClosed
	case <-l.failed:
		return nil, l.failErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept waits for the next connect request and accepts it with the
// listener's options plus opts. A request whose handshake then fails is
// the dialer's problem, not the listener's: Accept waits for the next one.
// So it does when this side cannot make the connection's endpoint or run
// its setup step (WithSetup; out of device memory, say), rejecting the
// request and warning the listener's logger (WithLogger).
// Options beyond what the device holds are the caller's: Accept rejects
// the request and returns an error matching endpoint.ErrInvalid.
// Once the listener's device is removed, Accept returns an error matching
// ErrDeviceRemoved: no request can arrive any more. A listener on every
// address is bound to no device, and a removal does not end it: the
// kernel drops only its listen on the device removed. (The removal itself
// completes only once the process exits: librdmacm holds the devices it
// opened until then.)
// Accept returns once the connection is established, so one loop of
// Accepts sets connections up one after another; to set many up at once,
// call Accept from several goroutines, or take each Request from
// AcceptRequest and accept it in a goroutine of its own.
func (l *Listener) Accept(ctx context.Context, opts ...AcceptOption) (*endpoint.Endpoint, error) {
	if !l.made() {
		return nil, errListenerNotMade
	}
	// Options no request could be accepted with are the caller's error:
	// checked here, they would reject every dialer while Accept waited on.
	if _, err := newAcceptOptions(l.o.conn, opts); err != nil {
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	for {
		req, err := l.AcceptRequest(ctx)
		if err != nil {
			return nil, err
		}
		ep, err := req.Accept(ctx, opts...)
		// ErrInvalid is the options again, beyond what the device holds:
		// they would reject every request that followed.
		if err == nil || ctx.Err() != nil || errors.Is(err, endpoint.ErrInvalid) {
			return ep, err
		}
		if errors.As(err, new(seam.LocalFailure)) {
			l.o.conn.logger.Warn().Err(err).Stringer("remote", req.RemoteAddr()).Msg("listener: could not set a connection up; its request was rejected")
			continue
		}
		l.o.conn.logger.Debug().Err(err).Stringer("remote", req.RemoteAddr()).Msg("listener: accept failed")
	}
}

// Accept creates the connection's QP, accepts, and waits until the
// connection is established or ctx ends. The connection counts as
// established when the CM says so or when a receive posted by WithSetup
// completes, whichever comes first (docs/DESIGN.md: a lost RTU).
//
// On iWARP the dialer speaks first: post nothing on the accepted endpoint
// (no send, write or read) before the dialer's first message has arrived.
// Sooner, it can reach the dialer's kernel before that has read the
// handshake's reply, which then ends the dialer's connection (rdma_connect's
// event reports a connect error). Closing the accepted endpoint that soon
// can end it the same way: the dialer's Dial then fails with an error
// matching syscall.ECONNRESET, where a TCP dialer would connect and read
// EOF. Package msg keeps this rule for its users.
func (r *Request) Accept(ctx context.Context, opts ...AcceptOption) (*endpoint.Endpoint, error) {
	if err := r.answer(); err != nil {
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	o, err := newAcceptOptions(r.o, opts)
	if err != nil {
		r.reject(nil)
		return nil, fmt.Errorf("cm: accept: %w (the request was rejected)", err)
	}
	c := newConn(r.id, r.q, o.conn.logger)
	cfg := o.conn.ep
	cfg.LocalAddr, cfg.RemoteAddr = r.localAddr, r.remoteAddr
	ep, err := c.start(cfg)
	if err != nil {
		r.reject(nil)
		return nil, fmt.Errorf("cm: accept: %w", seam.LocalFailure{Err: err})
	}
	c.ctl.Established(r.privateData)
	dev, err := r.id.Context().QueryDevice()
	if err == nil {
		err = c.prepare(ep, o.conn, o.hs)
	}
	if err != nil {
		r.id.Reject(nil) // the dialer learns at once; abandon below frees the id
		err = seam.LocalFailure{Err: err}
	} else {
		// Never more than the dialer offered: it issues at most its
		// initiator depth of reads and answers at most its responder
		// resources of ours.
		resp, init := o.conn.readDepths(dev)
		err = r.id.Accept(verbs.ConnParam{PrivateData: o.hs.privateData,
			ResponderResources: min(resp, r.respRes), InitiatorDepth: min(init, r.initDepth),
			RNRRetryCount: o.conn.rnrRetryCount})
	}
	if err == nil {
		_, err = c.waitEstablished(ctx, c.ctl.Received)
		if errors.Is(err, ErrPeerDisconnected) {
			// The dialer disconnected before this side heard that the
			// handshake ended (its RTU was lost, say). A dialer
			// disconnects only a connection it had established, so
			// this one was up: as a TCP listener does, hand it over,
			// already ended (Done, Err), rather than drop it and wait
			// for a dialer that has gone.
			return ep, nil
		}
	}
	if err != nil {
		ep.CloseAndDrain(nil) // puts back what WithSetup posted
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	setRNRTimer(r.id, o.conn.rnrTimer, c.log)
	return ep, nil
}

// Reject refuses the request; the dialer's error carries privateData (at
// most 148 bytes).
func (r *Request) Reject(privateData []byte) error {
	if err := r.answer(); err != nil {
		return fmt.Errorf("cm: reject: %w", err)
	}
	return r.reject(privateData)
}

// reject is Reject, for the call that answered r.
func (r *Request) reject(privateData []byte) error {
	err := r.id.Reject(privateData)
	return errors.Join(err, r.q.Close(r.id.Destroy))
}

// destroyEP is id.DestroyEP in the shape Queue.Close takes.
func destroyEP(id *verbs.CMID) func() error {
	return func() error { id.DestroyEP(); return nil }
}

// Close stops listening and rejects the requests not yet accepted.
// Connections already accepted are not affected. Idempotent: every call
// returns the first one's result.
func (l *Listener) Close() error {
	if !l.made() {
		return errListenerNotMade
	}
	l.closeOnce.Do(func() {
		close(l.closing)
		for _, p := range l.ids {
			p.q.StopWaiting()
		}
		var errs []error
		l.loops.Wait()
		for {
			select {
			case req := <-l.reqs:
				errs = append(errs, req.Reject(nil))
				continue
			default:
			}
			break
		}
		errs = append(errs, l.destroyIDs())
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// destroyIDs closes each id's queue and destroys the id.
func (l *Listener) destroyIDs() error {
	var errs []error
	for _, p := range l.ids {
		errs = append(errs, p.q.Close(destroyEP(p.id)))
	}
	return errors.Join(errs...)
}
