package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// ErrListenerClosed is returned by Accept after Close. It matches net.ErrClosed.
var ErrListenerClosed = fmt.Errorf("cm: listener closed: %w", net.ErrClosed)

// Listener accepts RDMA connections on one address.
type Listener struct {
	id   *verbs.CMID
	ch   *channel
	o    options
	addr net.Addr

	srq       *endpoint.SRQ
	reqs      chan *Request
	closing   chan struct{}
	loopDone  chan struct{}
	closeOnce sync.Once
}

// Listen binds to addr ("host:port"; an empty host or 0.0.0.0 listens on
// every RDMA-capable address) and listens. ctx is checked before binding.
func Listen(ctx context.Context, addr string, opts ...Option) (*Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := newOptions(opts)
	if len(o.privateData) > verbs.MaxAcceptPrivateData {
		return nil, fmt.Errorf("cm: listen %s: %d bytes of accept private data, at most %d fit",
			addr, len(o.privateData), verbs.MaxAcceptPrivateData)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	ai, err := verbs.GetAddrInfo(host, port, true)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	defer ai.Free()
	// As librdmacm's rdma_server.c: rdma_create_ep binds a passive id;
	// it then moves to an event channel of ours for rdma_listen.
	id, err := verbs.CreateEP(ai)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	ch, err := newChannel()
	if err == nil {
		if err = id.Migrate(ch.ch); err != nil {
			ch.destroy()
		}
	}
	if err == nil {
		if err = id.Listen(o.backlog); err != nil {
			id.DestroyEP()
			ch.destroy()
			return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
		}
	} else {
		id.DestroyEP()
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	l := &Listener{id: id, ch: ch, o: o, addr: id.LocalAddr(), reqs: make(chan *Request, o.backlog),
		closing: make(chan struct{}), loopDone: make(chan struct{})}
	if o.srqDepth > 0 {
		dev := id.Context()
		if dev == nil {
			id.DestroyEP()
			ch.destroy()
			return nil, fmt.Errorf("cm: listen %s: a shared receive queue needs the address of one RDMA device, not a wildcard", addr)
		}
		maxSGE := o.ep.MaxSGE
		if maxSGE <= 0 {
			maxSGE = 1
		}
		pd := o.ep.PD
		if pd == nil {
			pd, err = bufpool.NewPD(dev)
		} else {
			pd.Acquire()
		}
		if err == nil {
			l.srq, err = endpoint.NewSRQ(pd, o.srqDepth, maxSGE)
			pd.Release() // the SRQ holds its own reference
		}
		if err != nil {
			id.DestroyEP()
			ch.destroy()
			return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
		}
		l.o.ep.SRQ = l.srq
	}
	go l.run()
	return l, nil
}

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
	ch          *channel
	o           options
	respRes     int
	initDepth   int
	PrivateData []byte   // what the dialer sent (WithPrivateData)
	RemoteAddr  net.Addr // the dialer's address
	LocalAddr   net.Addr
}

// run reads the listening channel. Each connect request's new id is moved
// to an event channel of its own at once, so the request (and later its
// connection) never depends on the listener staying open.
func (l *Listener) run() {
	defer close(l.loopDone)
	for {
		ev, err := l.ch.next(context.Background())
		if err != nil {
			select {
			case <-l.closing:
				return
			default:
			}
			l.o.logger.Debug().Err(err).Msg("listener: reading CM events")
			continue
		}
		if ev.Type != verbs.EventConnectRequest {
			l.o.logger.Debug().Stringer("event", ev.Type).Msg("listener: ignored event")
			ev.Ack()
			continue
		}
		req := &Request{id: ev.ID, o: l.o, PrivateData: ev.PrivateData,
			respRes: ev.InitiatorDepth, initDepth: ev.ResponderResources,
			RemoteAddr: ev.ID.RemoteAddr(), LocalAddr: ev.ID.LocalAddr()}
		ev.Ack()
		if req.ch, err = newChannel(); err == nil {
			err = req.id.Migrate(req.ch.ch)
			if err != nil {
				req.ch.destroy()
				req.ch = nil
			}
		}
		if err != nil {
			l.o.logger.Error().Err(err).Msg("listener: cannot take a connect request; rejecting it")
			req.id.Reject(nil)
			req.id.Destroy()
			continue
		}
		select {
		case l.reqs <- req:
		default:
			l.o.logger.Warn().Msg("listener: backlog full; rejecting a connect request")
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
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept waits for the next connect request and accepts it with the
// listener's options (plus opts).
func (l *Listener) Accept(ctx context.Context, opts ...Option) (*endpoint.Endpoint, error) {
	// Options no request could be accepted with are the caller's error:
	// checked here, they would reject every dialer while Accept waited on.
	if _, err := acceptOptions(l.o, opts); err != nil {
		return nil, err
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
		// The dialer gave up or the handshake failed: that is the dialer's
		// error, not the listener's; wait for the next one.
		l.o.logger.Debug().Err(err).Msg("listener: accept failed")
	}
}

// acceptOptions is base with opts applied, or the reason no connection can
// be accepted with them.
func acceptOptions(base options, opts []Option) (options, error) {
	o := base
	for _, f := range opts {
		f(&o)
	}
	o.ep.Logger = o.logger
	if len(o.privateData) > verbs.MaxAcceptPrivateData {
		return o, fmt.Errorf("cm: accept: %d bytes of private data, at most %d fit",
			len(o.privateData), verbs.MaxAcceptPrivateData)
	}
	if err := o.validate(); err != nil {
		return o, fmt.Errorf("cm: accept: %w", err)
	}
	return o, nil
}

// Accept creates the connection's QP, accepts, and waits until the
// connection is established or ctx ends. The connection counts as
// established when the CM says so or when a receive posted by WithSetup
// completes, whichever comes first: the dialer's RTU, the handshake's last
// message, may be lost, and the kernel CM would learn of the connection
// only when it resends its REP 4.1 s later.
func (r *Request) Accept(ctx context.Context, opts ...Option) (*endpoint.Endpoint, error) {
	o, err := acceptOptions(r.o, opts)
	if err != nil {
		r.Reject(nil)
		return nil, fmt.Errorf("%w (the request was rejected)", err)
	}
	c := newConn(r.id, r.ch, o.logger)
	ep, owner, err := endpoint.New(r.id, o.ep, c.close)
	if err != nil {
		r.Reject(nil)
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	c.owner = owner
	go c.run()
	dev, err := r.id.Context().QueryDevice()
	if err == nil && o.ackTimeout > 0 {
		err = r.id.SetAckTimeout(uint8(o.ackTimeout))
	}
	if err == nil && o.setup != nil {
		err = o.setup(ep)
	}
	if err != nil {
		r.id.Reject(nil) // the dialer learns at once; ep.Close below frees the id
	} else {
		// Never more than the dialer offered: it issues at most its
		// initiator depth of reads and answers at most its responder
		// resources of ours.
		resp, init := o.readDepths(dev)
		err = r.id.Accept(verbs.ConnParam{PrivateData: o.privateData,
			ResponderResources: min(resp, r.respRes), InitiatorDepth: min(init, r.initDepth),
			RNRRetryCount: o.rnrRetryCount})
	}
	if err == nil {
		_, err = c.waitEstablished(ctx, owner.Received())
	}
	if err != nil {
		ep.CloseAndDrain(nil)
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	setRNRTimer(r.id, o.rnrTimer, o.logger)
	return ep, nil
}

// Reject refuses the request; the dialer's error carries privateData (at
// most 148 bytes).
func (r *Request) Reject(privateData []byte) error {
	err := r.id.Reject(privateData)
	return errors.Join(err, r.id.Destroy(), func() error { r.ch.destroy(); return nil }())
}

// Close stops listening and rejects the requests not yet accepted.
// Connections already accepted are not affected. Idempotent.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closing)
		l.ch.wait.Close()
		<-l.loopDone
		for {
			select {
			case req := <-l.reqs:
				req.Reject(nil)
				continue
			default:
			}
			break
		}
		l.id.DestroyEP()
		l.ch.ch.Destroy()
	})
	return nil
}
