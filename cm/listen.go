package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/cmevent"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// ErrListenerClosed is returned by Accept after Close. It matches net.ErrClosed.
var ErrListenerClosed = fmt.Errorf("cm: listener closed: %w", net.ErrClosed)

// Listener accepts RDMA connections on one address.
type Listener struct {
	id   *verbs.CMID
	q    *cmevent.Queue
	o    listenOptions
	addr net.Addr

	srq       *endpoint.SRQ
	reqs      chan *Request
	closing   chan struct{}
	loopDone  chan struct{}
	failed    chan struct{} // closed, with failErr set, when events stop
	failErr   error
	closeOnce sync.Once
	closeErr  error
}

// Listen binds to addr ("host:port"; an empty host or 0.0.0.0 listens on
// every RDMA-capable IPv4 address, where net's ":port" would take IPv6
// too; [::] on every address, though on soft-iWARP only IPv6 ones) and
// listens. ctx is checked before binding.
// A loopback address (127.0.0.1, ::1, localhost) is refused with an error
// matching syscall.EADDRNOTAVAIL: no RDMA device has one, and rdma_cm
// would take it for a wildcard on RoCE and InfiniBand, where peers
// anywhere could connect, and keep it on iWARP, where none could.
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
	ai, err := verbs.GetAddrInfo(host, port, true, verbs.PortSpaceTCP)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	defer ai.Free()
	// As librdmacm's rdma_server.c: rdma_create_ep binds a passive id;
	// it then moves to the process's event channel for rdma_listen.
	id, err := verbs.CreateEP(ai)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	if id.OnLoopback() {
		id.DestroyEP()
		return nil, fmt.Errorf("cm: listen %s: %w", addr, errLoopbackListen)
	}
	q, err := cmevent.NewQueue()
	if err != nil {
		id.DestroyEP()
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	fail := func(err error) (*Listener, error) {
		q.Close(destroyEP(id))
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	if err := q.Adopt(id); err != nil {
		return fail(err)
	}
	if err := id.Listen(o.backlog); err != nil {
		return fail(err)
	}
	l := &Listener{id: id, q: q, o: o, addr: id.LocalAddr(), reqs: make(chan *Request, o.backlog),
		closing: make(chan struct{}), loopDone: make(chan struct{}), failed: make(chan struct{})}
	if o.srqDepth > 0 {
		dev := id.Context()
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
	go l.run()
	return l, nil
}

// errLoopbackListen is Listen's refusal of a loopback address: a program
// listens there to be reachable from its own host only, which rdma_cm
// cannot give (see Listen).
var errLoopbackListen = fmt.Errorf("a loopback address has no RDMA device (a listener there takes dials from other hosts, or from none): listen on the address of an RDMA-capable interface: %w", syscall.EADDRNOTAVAIL)

// SRQ is the listener's shared receive queue (WithSharedReceiveQueue), or
// nil. Post receives to it; destroy it after the listener and every
// endpoint it accepted are closed.
func (l *Listener) SRQ() *endpoint.SRQ { return l.srq }

// Addr is the bound address (with the port chosen, if port 0 was asked).
func (l *Listener) Addr() net.Addr { return l.addr }

// Request is a connect request waiting to be accepted or rejected. Exactly
// one of Accept and Reject must be called.
type Request struct {
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
func (r *Request) PrivateData() []byte { return r.privateData }

// RemoteAddr is the dialer's address.
func (r *Request) RemoteAddr() net.Addr { return r.remoteAddr }

// LocalAddr is the address the request arrived at.
func (r *Request) LocalAddr() net.Addr { return r.localAddr }

// run takes the listener's events. Each connect request's new id comes
// with a queue of its own, so the request (and later its connection)
// never depends on the listener staying open.
func (l *Listener) run() {
	defer close(l.loopDone)
	for {
		ev, err := l.q.Next(context.Background())
		if err != nil {
			select {
			case <-l.closing:
				return
			default:
			}
			// The process's CM event channel failed: no request can
			// arrive any more, and Accept says so.
			l.o.conn.logger.Error().Err(err).Msg("listener: reading CM events")
			l.failErr = fmt.Errorf("cm: accept: %w", err)
			close(l.failed)
			<-l.closing
			return
		}
		if ev.Type != verbs.EventConnectRequest {
			l.o.conn.logger.Debug().Stringer("event", ev.Type).Msg("listener: ignored event")
			ev.Ack()
			continue
		}
		req := &Request{id: ev.ID, q: ev.Queue, o: l.o.conn, privateData: ev.PrivateData,
			respRes: ev.InitiatorDepth, initDepth: ev.ResponderResources,
			remoteAddr: ev.ID.RemoteAddr(), localAddr: ev.ID.LocalAddr()}
		ev.Ack()
		select {
		case l.reqs <- req:
		default:
			l.o.conn.logger.Warn().Stringer("remote", req.remoteAddr).Msg("listener: backlog full; rejecting a connect request")
			req.Reject(nil)
		}
	}
}

// AcceptRequest waits for the next connect request.
func (l *Listener) AcceptRequest(ctx context.Context) (*Request, error) {
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
// Accept returns once the connection is established, so one loop of
// Accepts sets connections up one after another; to set many up at once,
// call Accept from several goroutines, or take each Request from
// AcceptRequest and accept it in a goroutine of its own.
func (l *Listener) Accept(ctx context.Context, opts ...AcceptOption) (*endpoint.Endpoint, error) {
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
		if err == nil || ctx.Err() != nil {
			return ep, err
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
	o, err := newAcceptOptions(r.o, opts)
	if err != nil {
		r.Reject(nil)
		return nil, fmt.Errorf("cm: accept: %w (the request was rejected)", err)
	}
	c := newConn(r.id, r.q, o.conn.logger)
	cfg := o.conn.ep
	cfg.LocalAddr, cfg.RemoteAddr = r.localAddr, r.remoteAddr
	ep, err := c.start(cfg)
	if err != nil {
		r.Reject(nil)
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	c.ctl.Established(r.privateData)
	dev, err := r.id.Context().QueryDevice()
	if err == nil {
		err = c.prepare(ep, o.conn, o.hs)
	}
	if err != nil {
		r.id.Reject(nil) // the dialer learns at once; abandon below frees the id
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
	l.closeOnce.Do(func() {
		close(l.closing)
		l.q.StopWaiting()
		var errs []error
		<-l.loopDone
		for {
			select {
			case req := <-l.reqs:
				errs = append(errs, req.Reject(nil))
				continue
			default:
			}
			break
		}
		errs = append(errs, l.q.Close(destroyEP(l.id)))
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}
