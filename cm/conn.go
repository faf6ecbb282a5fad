package cm

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/cmevent"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Errors of an established connection's end, seen in endpoint.Err.
// ErrDeviceRemoved also ends a Listener bound to the device: its Accept
// returns it.
var (
	ErrPeerDisconnected = fmt.Errorf("cm: the peer disconnected: %w", endpoint.ErrClosed)
	ErrDeviceRemoved    = fmt.Errorf("cm: the RDMA device was removed: %w", endpoint.ErrClosed)
)

// RejectError is a connect request the peer rejected. It matches
// syscall.ECONNREFUSED.
type RejectError struct {
	// Reason is the IB CM reject reason on InfiniBand and RoCE (8,
	// invalid service ID: nobody listens on that port). On iWARP it is
	// the kernel's status, a negative errno: soft-iWARP reports a peer's
	// reject, and a connection the accepting side dropped during the
	// handshake, as -ECONNRESET.
	Reason      int
	PrivateData []byte // what the peer's Reject sent, if anything
}

// Error says the connection was refused and why: for reason 8, that
// nobody listens on that port; otherwise the reason, and the peer's
// private data if it sent any.
func (e *RejectError) Error() string {
	if e.Reason == rejectNoListener {
		return "cm: connection refused: nobody listens on that port (IB CM reject reason 8, invalid service ID)"
	}
	why := fmt.Sprintf("IB CM reject reason %d", e.Reason)
	if e.Reason < 0 {
		why = fmt.Sprintf("iWARP status %d, %v", e.Reason, syscall.Errno(-e.Reason))
	}
	data := bytes.TrimRight(e.PrivateData, "\x00") // the CM pads it with zeros
	if len(data) == 0 {
		return fmt.Sprintf("cm: connection refused by the peer (%s)", why)
	}
	return fmt.Sprintf("cm: connection refused by the peer (%s, private data %q)", why, data)
}

// rejectNoListener is the IB CM's reject reason when no listener has the
// service ID, that is the port.
const rejectNoListener = 8

// Unwrap makes the error match syscall.ECONNREFUSED.
func (e *RejectError) Unwrap() error { return syscall.ECONNREFUSED }

// Is makes an iWARP reject with status -ECONNRESET match
// syscall.ECONNRESET as well: soft-iWARP reports a handshake the peer gave
// up that way, and cannot tell it from a reject.
func (e *RejectError) Is(target error) bool {
	return target == syscall.ECONNRESET && e.Reason == -int(syscall.ECONNRESET)
}

// expect waits on c for the event that ends one step of connection setup.
func expect(ctx context.Context, q *cmevent.Queue, want verbs.EventType, step string) (*verbs.Event, error) {
	ev, err := q.Next(ctx)
	if err != nil {
		return nil, fmt.Errorf("cm: %s: %w", step, err)
	}
	if ev.Type == want {
		return ev.Event, nil
	}
	defer ev.Ack()
	return nil, eventError(ev.Event, step)
}

// eventError is the error a failure event stands for.
func eventError(ev *verbs.Event, step string) error {
	switch ev.Type {
	case verbs.EventRejected:
		return &RejectError{Reason: ev.Status, PrivateData: ev.PrivateData}
	case verbs.EventConnectError:
		if ev.Status == -int(syscall.EINVAL) {
			// librdmacm got the peer's answer, but the kernel refused to
			// complete the handshake: the peer had given it up (its
			// reject came first). A TCP peer that closes an accepted
			// connection resets it.
			return fmt.Errorf("cm: %s: the peer gave up the handshake after answering (%v: %v): %w", step, ev.Type, syscall.EINVAL, syscall.ECONNRESET)
		}
		fallthrough
	case verbs.EventAddrError, verbs.EventRouteError, verbs.EventUnreachable:
		errno := syscall.Errno(-ev.Status)
		if ev.Status >= 0 {
			errno = syscall.EHOSTUNREACH
		}
		if ev.Type == verbs.EventUnreachable && errno == syscall.ETIMEDOUT {
			errno = syscall.ETIMEDOUT
		}
		return fmt.Errorf("cm: %s: %v: %w", step, ev.Type, errno)
	case verbs.EventDisconnected:
		return ErrPeerDisconnected
	}
	return fmt.Errorf("cm: %s: unexpected event %v (status %d)", step, ev.Type, ev.Status)
}

// conn is an established connection's CM side: its id, its queue of the
// process's CM event channel and the goroutine that takes its events for
// as long as the endpoint lives.
type conn struct {
	id  *verbs.CMID
	q   *cmevent.Queue
	ctl *seam.Control
	log zerolog.Logger

	stopOnce sync.Once
	stopping chan struct{}
	loopDone chan struct{}
	// setup receives the outcome of the handshake: nil and the peer's
	// private data on ESTABLISHED, or the failure.
	setup chan setupResult
}

type setupResult struct {
	err         error
	privateData []byte
}

func newConn(id *verbs.CMID, q *cmevent.Queue, log zerolog.Logger) *conn {
	return &conn{id: id, q: q, log: log, stopping: make(chan struct{}), loopDone: make(chan struct{}),
		setup: make(chan setupResult, 1)}
}

// start creates the endpoint on c's id and starts reading its events.
// Once a logger is set, the connection's lines (the CM's and the
// endpoint's) name its addresses: a process has many connections.
func (c *conn) start(cfg seam.EndpointConfig) (*endpoint.Endpoint, error) {
	if c.log.GetLevel() != zerolog.Disabled {
		c.log = c.log.With().Stringer("local", cfg.LocalAddr).Stringer("remote", cfg.RemoteAddr).Logger()
		cfg.Logger = c.log
	}
	ep, ctl, err := seam.NewEndpoint(c.id, cfg, c.close)
	if err != nil {
		return nil, err
	}
	c.ctl = ctl
	go c.run()
	return ep.(*endpoint.Endpoint), nil
}

// prepare applies what must be set before the connection is requested or
// accepted, and runs the caller's setup.
func (c *conn) prepare(ep *endpoint.Endpoint, o connOptions, hs handshake) error {
	if o.ackTimeout > 0 {
		if err := c.id.SetAckTimeout(ackExponent(o.ackTimeout)); err != nil {
			return err
		}
	}
	if hs.setup != nil {
		return hs.setup(ep)
	}
	return nil
}

// waitEstablished waits for the handshake's outcome (run must be running).
// received (accepting side; nil when dialing) closes when the QP has
// received: the dialer is connected, and if its RTU was lost the kernel CM
// would resend its REP (and so learn of the connection) only after 4.1 s,
// or never when every RTU is lost. rdma_notify says so at once, as
// librdmacm's documentation asks.
func (c *conn) waitEstablished(ctx context.Context, received <-chan struct{}) ([]byte, error) {
	for {
		select {
		case r := <-c.setup:
			return r.privateData, r.err
		case <-received:
			received = nil
			if err := c.id.NotifyEstablished(); err != nil {
				// Most likely ESTABLISHED came first and is on its way.
				c.log.Debug().Err(err).Msg("notifying the CM of a received message")
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// run reads the connection's CM events until close stops it.
func (c *conn) run() {
	defer close(c.loopDone)
	established := false
	for {
		ev, err := c.q.Next(context.Background())
		if err != nil {
			select {
			case <-c.stopping:
				return
			default:
			}
			c.log.Error().Err(err).Msg("reading CM events; the connection is ended")
			c.ctl.PeerGone(fmt.Errorf("cm: reading events: %w", err))
			<-c.stopping
			return
		}
		c.log.Debug().Stringer("event", ev.Type).Int("status", ev.Status).Msg("cm event")
		switch ev.Type {
		case verbs.EventEstablished:
			if !established {
				established = true
				c.setup <- setupResult{privateData: ev.PrivateData}
			}
		case verbs.EventRejected, verbs.EventUnreachable, verbs.EventConnectError, verbs.EventDisconnected:
			err := eventError(ev.Event, "connecting")
			if !established {
				established = true // nothing more to report to setup
				c.setup <- setupResult{err: err}
			}
			c.ctl.PeerGone(err)
		case verbs.EventDeviceRemoval:
			c.ctl.PeerGone(ErrDeviceRemoved)
		case verbs.EventAddrChange:
			c.log.Warn().Msg("the local address changed under an established connection")
		}
		ev.Ack()
	}
}

// close stops the event goroutine and destroys the id, then closes its
// queue. It runs as the endpoint's onClose, after the QP and CQ are gone.
func (c *conn) close() error {
	c.stopOnce.Do(func() { close(c.stopping) })
	c.q.StopWaiting()
	<-c.loopDone
	return c.q.Close(c.id.Destroy)
}
