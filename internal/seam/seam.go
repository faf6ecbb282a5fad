// Package seam holds what the public packages share with each other but
// must not export: the reference-counted protection domain behind
// bufpool.PD, and the constructors package cm calls to build endpoints and
// shared receive queues.
//
// A public type cannot hand its internals to a sibling package without an
// exported method that applications could call too. So each public package
// that owns a type registers, in its init, the functions its siblings need
// (the variables below); a sibling calls them through this package, which
// applications cannot import. Public types cross as `any` and are asserted
// by the package that owns them.
package seam

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// LocalFailure marks a failure of this side's own part in accepting a
// connection (making its endpoint, registering and posting its buffers in
// the setup step), not the dialer's: cm's and msg's listeners, which go
// on to the next request either way, warn of it instead of logging it as
// a failed handshake. Its text is the failure's own, and errors.Is and
// errors.As see through it.
type LocalFailure struct{ Err error }

func (f LocalFailure) Error() string { return f.Err.Error() }
func (f LocalFailure) Unwrap() error { return f.Err }

// Domain is a protection domain with a reference count: it is freed when
// the last endpoint, pool, region and shared receive queue using it let go,
// in any order.
type Domain struct {
	pd  *verbs.PD
	dev uintptr // the device context it belongs to

	mu   sync.Mutex
	refs int
}

// NewDomain allocates a protection domain on dev with one reference.
func NewDomain(dev *verbs.Context) (*Domain, error) {
	if dev == nil {
		return nil, fmt.Errorf("no RDMA device context: %w", verbs.ErrNoDevice)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	return &Domain{pd: pd, dev: dev.Key(), refs: 1}, nil
}

// ErrFreed is Acquire's error for a domain whose last reference is gone.
var ErrFreed = errors.New("the protection domain is freed: every endpoint, pool and region using it is closed")

// Acquire takes one more reference, unless the domain is already freed.
func (d *Domain) Acquire() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		return ErrFreed
	}
	d.refs++
	return nil
}

// Release drops one reference; the last frees the PD.
func (d *Domain) Release() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refs--
	if d.refs != 0 {
		return nil
	}
	return d.pd.Dealloc()
}

// OnDevice reports whether the domain belongs to the device context dev.
func (d *Domain) OnDevice(dev *verbs.Context) bool { return d.dev == dev.Key() }

// PD is the verbs protection domain.
func (d *Domain) PD() *verbs.PD { return d.pd }

// Registered by package bufpool.
var (
	// WrapPD returns a *bufpool.PD for d: a view, which takes no reference.
	WrapPD func(d *Domain) any
	// DomainOf returns the Domain of a *bufpool.PD (nil for a nil or
	// closed one).
	DomainOf func(pd any) *Domain
	// BufferSGE names [off, off+n) of a *bufpool.Buffer for a work
	// request, with the domain its memory is registered in; an error if
	// the buffer is not the caller's to post (back in its pool, or of a
	// closed region) or the range is outside it.
	BufferSGE func(buf any, off, n int) (verbs.SGE, *Domain, error)
	// SegmentSGE is BufferSGE for a *bufpool.Segment.
	SegmentSGE func(seg any) (verbs.SGE, *Domain, error)
	// Posted counts a *bufpool.Buffer in (+1) or out of (-1) a posted work
	// request, so that its pool refuses it back while the device owns it.
	Posted func(buf any, delta int32)
	// PutBack returns a *bufpool.Buffer to its pool, if it has one and is
	// out of it; a buffer already back is left alone.
	PutBack func(buf any)
)

// EndpointConfig sizes and tunes an endpoint; package cm fills it from its
// options. The zero value is usable.
type EndpointConfig struct {
	SendDepth int // send queue slots (default 128)
	RecvDepth int // receive queue slots (default 128)
	MaxSGE    int // scatter/gather entries per work request (default 4)
	MaxInline int // inline bytes asked of the QP (default 64; the device may grant more)
	// SignalEvery: an unsignaled send is forced signaled after this many
	// unsignaled ones in a row, so their slots come back (default SendDepth/4).
	SignalEvery int
	Poll        int           // an endpoint.PollMode
	Spin        time.Duration // hybrid polling's spin (default 50µs)
	// CloseTimeout bounds how long Close waits for flushed completions
	// before it destroys the QP anyway, and how long undelivered
	// completions wait for a reader after Close (default 5s).
	CloseTimeout time.Duration
	Logger       zerolog.Logger
	// SRQ, if set, is an *endpoint.SRQ that receives for this endpoint.
	SRQ any
	// PD, if set, is a *bufpool.PD the endpoint shares (it takes a
	// reference); otherwise the endpoint gets a protection domain of its own.
	PD any
	// LocalAddr and RemoteAddr are the connection's addresses.
	LocalAddr, RemoteAddr net.Addr
	// Handler, if set, is a func(endpoint.Completion) that takes every
	// completion in place of Completions (those for a request's Notify
	// still go there), and HandlerEnd runs once after the last (see
	// endpoint's handler mode). Its owner then puts back the buffers of a
	// connection that fails: cm's CloseAndDrain finds none in the channel.
	Handler    any
	HandlerEnd func()
}

// Control is what package cm keeps to drive an endpoint's connection state.
type Control struct {
	// PeerGone tells the endpoint its connection ended (DISCONNECTED,
	// device removal, ...): the QP moves to the error state so pending
	// work flushes back with errors, and Done closes.
	PeerGone func(cause error)
	// Received is closed when the first receive completes without error:
	// the peer is connected and sending.
	Received <-chan struct{}
	// Established records the private data the peer sent with its
	// connect request or its accept.
	Established func(privateData []byte)
}

// Registered by package cm.
var (
	// ConnOptions applies a []cm.Option to the defaults and returns the
	// endpoint configuration they make and whether one set the RNR retry
	// count, or the first invalid one's error: for package msg, which owns
	// some of them.
	ConnOptions func(opts any) (cfg EndpointConfig, rnrRetrySet bool, err error)
	// WithHandler returns a cm.Option that sets EndpointConfig.Handler
	// and HandlerEnd: for package msg, whose connections take their
	// completions in whichever goroutine polls.
	WithHandler func(handler any, end func()) any
	// WithFamily returns a cm.Option that makes Dial try only the
	// addresses of one family ("tcp4" or "tcp6"): for package rdmanet,
	// whose Dialer takes a network as net's does.
	WithFamily func(network string) any
)

// Registered by package msg.
var (
	// WriteStream writes p, at most the *msg.Conn's MaxInline bytes, to
	// its byte stream: consecutive writes may share a message, and it
	// returns once p is posted or held for the next credit. Callers
	// serialize their writes.
	WriteStream func(c any, ctx context.Context, p []byte) error
	// FillStream takes a send buffer, calls fill with its payload (at
	// most MaxInline bytes) and no lock held, and writes the bytes fill
	// says it put there to the stream as WriteStream writes p, without
	// copying them where it can. fill may block: the connection may end
	// meanwhile, and its bytes are then dropped. Callers serialize it
	// with their writes.
	FillStream func(c any, ctx context.Context, fill func(p []byte) int) error
	// CloseWithin is the *msg.Conn's Close with a goodbye bounded by d
	// instead of a second: the bytes the stream holds for the peer's
	// credits, the goodbye and the messages before it must leave within
	// d, or they are dropped as Close drops them after its second. d > 0.
	CloseWithin func(c any, d time.Duration) error
	// ReadStream is the *msg.Conn's RecvMessage into m, a *msg.Message
	// the caller reuses for each message once it has released the last:
	// a reader that holds one message at a time allocates none.
	ReadStream func(c any, ctx context.Context, m any) error
	// StreamReader is a msg.Option for Dial and Listen: the application
	// reads each connection as a byte stream, releasing every message it
	// receives before it waits for the next, and tells its peers so.
	StreamReader any
)

// Registered by package endpoint.
var (
	// NewEndpoint creates the completion channel, CQ and RC QP on id
	// (which has a resolved route, or comes from a connect request) and
	// returns the *endpoint.Endpoint. onClose runs once after the QP, CQ
	// and channel are destroyed (package cm destroys the id there).
	NewEndpoint func(id *verbs.CMID, cfg EndpointConfig, onClose func() error) (any, *Control, error)
	// ProgressMark is where a handler-mode *endpoint.Endpoint's progress
	// stands: take it before looking at what the handler produces, and
	// pass it to Progress, so that what is handled between the look and
	// the call is not waited for in vain.
	ProgressMark func(ep any) uint64
	// Progress drives a handler-mode *endpoint.Endpoint from the
	// caller's goroutine: it polls (and, as the endpoint's polling mode
	// says, spins or sleeps) until a completion was handled since mark
	// (by this call or another), or Wake was called. It returns ctx's
	// error when ctx ends first, and an error matching ErrClosed once the
	// endpoint is closing (its completions are then handled without it).
	Progress func(ep any, ctx context.Context, mark uint64) error
	// Wake makes every Progress in flight on ep return.
	Wake func(ep any)
	// Kick makes ep's completion goroutine poll now even if callers of
	// Progress were seen lately: for a goroutine about to wait for a
	// completion it will not drive itself. Until the matching KickDone,
	// the completion goroutine polls in the endpoint's mode (spinning, for
	// busy and hybrid polling) for that waiter; with no such waiter it
	// sleeps on the completion channel, whatever the mode, since a
	// handler-mode endpoint's spinning is done by its callers of Progress.
	Kick func(ep any)
	// KickDone ends the wait a Kick began.
	KickDone func(ep any)
	// SendsCompleteLocally says whether a send's completion on ep only
	// means that the transport took it (iWARP: TCP has the bytes), not
	// that the peer has it (InfiniBand and RoCE: the peer acknowledged).
	SendsCompleteLocally func(ep any) bool
	// AwaitEnd waits until ep's connection has ended (its Done), for at
	// most as long as the CM's report may lag a failure the device showed
	// first: for a caller that saw a work request fail, or a post refused,
	// as the connection ended, and wants the reason (the peer left, ...).
	AwaitEnd func(ep any)
	// ErrClosedHere is endpoint.ErrClosed as this side's Close causes
	// it: it matches net.ErrClosed too, which the end of a connection
	// the peer caused does not.
	ErrClosedHere error
	// CloseEndpoint is ep's Close, but cause (which matches
	// endpoint.ErrClosed) is why it ended (Err) and every error the close
	// causes: flushed work, refused posts. Package msg closes the endpoint
	// of a connection that failed with the connection's error, so that
	// only the application's Close reads as net.ErrClosed.
	CloseEndpoint func(ep any, cause error) error
	// CheckLimits refuses, with endpoint.ErrInvalid naming the option, a
	// configuration dev cannot hold (what NewEndpoint would refuse on
	// dev, but the inline size, which only a QP's creation tells).
	CheckLimits func(dev *verbs.Context, cfg EndpointConfig) error
	// NewSRQ creates an *endpoint.SRQ of depth receives on dev, in pd (a
	// *bufpool.PD) or, when pd is nil, in a protection domain of its own.
	NewSRQ func(dev *verbs.Context, pd any, depth, maxSGE int) (any, error)
	// WhileLocalFault is cause, why a queue pair on port of dev, bound
	// to local, failed, also matching endpoint.ErrPortDown and naming the
	// port when the port is not active now, or endpoint.ErrAddressGone
	// and naming the address when no interface has it now.
	WhileLocalFault func(dev *verbs.Context, port int, local net.Addr, cause error) error
	// EndpointWhileLocalFault is WhileLocalFault for the connection of
	// ep, an *endpoint.Endpoint: package msg's for a failure the endpoint
	// did not see (the peer gone silent).
	EndpointWhileLocalFault func(ep any, cause error) error
)
