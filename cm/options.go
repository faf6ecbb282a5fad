package cm

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// The option kinds; the package documentation says which call takes which.
// A nil option of any kind is ignored, as an option left unset.
type (
	// DialOption configures Dial.
	DialOption interface{ applyDial(*dialOptions) }
	// ListenOption configures Listen.
	ListenOption interface{ applyListen(*listenOptions) }
	// AcceptOption configures Listener.Accept and Request.Accept.
	AcceptOption interface{ applyAccept(*acceptOptions) }
)

// Option configures a connection: it is accepted by Dial, by Listen (for
// every connection the listener accepts) and by Accept.
type Option func(*connOptions)

func (f Option) applyDial(o *dialOptions)     { f.apply(&o.conn) }
func (f Option) applyListen(o *listenOptions) { f.apply(&o.conn) }
func (f Option) applyAccept(o *acceptOptions) { f.apply(&o.conn) }

func (f Option) apply(o *connOptions) {
	if f != nil {
		f(o)
	}
}

// HandshakeOption configures one connection's handshake: it is accepted by
// Dial and Accept.
type HandshakeOption func(*handshake)

func (f HandshakeOption) applyDial(o *dialOptions)     { f.apply(&o.hs) }
func (f HandshakeOption) applyAccept(o *acceptOptions) { f.apply(&o.hs) }

func (f HandshakeOption) apply(o *handshake) {
	if f != nil {
		f(o)
	}
}

// dialOnly and listenOnly are never nil: only this package makes them.
type dialOnly func(*dialOptions)

func (f dialOnly) applyDial(o *dialOptions) { f(o) }

type listenOnly func(*listenOptions)

func (f listenOnly) applyListen(o *listenOptions) { f(o) }

type connOptions struct {
	ep            seam.EndpointConfig
	retryCount    int
	rnrRetryCount int
	rnrRetrySet   bool // by WithRNRRetry
	logger        zerolog.Logger
	ackTimeout    time.Duration // 0: the CM's default
	rnrTimer      time.Duration
	readDepth     int
	family        string // "tcp4" or "tcp6": Dial's addresses of that family only (seam.WithFamily)
	err           error  // the first invalid argument
}

type handshake struct {
	privateData []byte
	setup       func(*endpoint.Endpoint) error
}

type dialOptions struct {
	conn           connOptions
	hs             handshake
	resolveTimeout time.Duration
}

type listenOptions struct {
	conn     connOptions
	backlog  int
	srqDepth int
	err      error
}

type acceptOptions struct {
	conn connOptions
	hs   handshake
}

// defaultReadDepth and maxReadDepth bound WithReadDepth (the CM carries
// the depths in one byte each).
const (
	defaultReadDepth = 16
	maxReadDepth     = 255
)

func init() {
	seam.ConnOptions = func(opts any) (seam.EndpointConfig, bool, error) {
		o := defaultConn()
		for _, f := range opts.([]Option) {
			f.apply(&o)
		}
		// finish completes o.ep: it must run before o.ep is read, an
		// order a single return statement does not fix.
		err := o.finish()
		return o.ep, o.rnrRetrySet, err
	}
	seam.WithHandler = func(handler any, end func()) any {
		return Option(func(o *connOptions) { o.ep.Handler, o.ep.HandlerEnd = handler, end })
	}
	seam.WithFamily = func(network string) any {
		return Option(func(o *connOptions) { o.family = network })
	}
}

func defaultConn() connOptions {
	return connOptions{retryCount: 7, rnrRetryCount: defaultRNRRetry,
		rnrTimer: defaultRNRTimer, readDepth: defaultReadDepth, logger: zerolog.Nop()}
}

// The defaults bound a send the peer has no receive for: resent 6 times,
// at least 20.48 ms apart, it fails after a little over 120 ms (with
// endpoint.StatusRNRRetryExc, ending the connection) instead of stalling
// the queue for ever, as retry count 7 would. The bound is far above a
// receiver's scheduling hiccups, so a peer that reposts its receives as
// it goes never meets it.
const (
	defaultRNRRetry = 6
	defaultRNRTimer = 20480 * time.Microsecond
)

func newDialOptions(opts []DialOption) (dialOptions, error) {
	o := dialOptions{conn: defaultConn(), resolveTimeout: 2 * time.Second}
	for _, f := range opts {
		if f != nil {
			f.applyDial(&o)
		}
	}
	if len(o.hs.privateData) > verbs.MaxConnPrivateData {
		return o, invalid("%d bytes of private data, a connect request carries at most %d", len(o.hs.privateData), verbs.MaxConnPrivateData)
	}
	return o, o.conn.finish()
}

func newListenOptions(opts []ListenOption) (listenOptions, error) {
	o := listenOptions{conn: defaultConn(), backlog: defaultBacklog}
	for _, f := range opts {
		if f != nil {
			f.applyListen(&o)
		}
	}
	if o.err != nil {
		return o, o.err
	}
	return o, o.conn.finish()
}

// newAcceptOptions is a listener's connection options with opts added.
func newAcceptOptions(base connOptions, opts []AcceptOption) (acceptOptions, error) {
	o := acceptOptions{conn: base}
	for _, f := range opts {
		if f != nil {
			f.applyAccept(&o)
		}
	}
	if len(o.hs.privateData) > verbs.MaxAcceptPrivateData {
		return o, invalid("%d bytes of private data, an accept carries at most %d", len(o.hs.privateData), verbs.MaxAcceptPrivateData)
	}
	return o, o.conn.finish()
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", endpoint.ErrInvalid, fmt.Sprintf(format, a...))
}

// refuse records an option's invalid argument (the first one wins).
func (o *connOptions) refuse(format string, a ...any) {
	if o.err == nil {
		o.err = invalid(format, a...)
	}
}

// finish checks what the options cannot check alone.
func (o *connOptions) finish() error {
	o.ep.Logger = o.logger
	return o.err
}

// readDepths are the responder resources and initiator depth to ask for:
// WithReadDepth's, capped at what the device allows.
func (o connOptions) readDepths(dev verbs.DeviceAttr) (resp, init int) {
	return min(o.readDepth, dev.MaxQPRdAtom), min(o.readDepth, dev.MaxQPInitRdAtom)
}

// WithQueueDepth sets both the send and the receive queue depth (default
// 128). Depths, SGEs and the inline size are bounded by the device: one
// beyond it fails Dial, Listen on one device's address (but for the inline
// size, which only creating a QP tells) and Accept with an error matching
// endpoint.ErrInvalid that names the option.
func WithQueueDepth(n int) Option {
	return count("queue depth", n, func(o *connOptions) { o.ep.SendDepth, o.ep.RecvDepth = n, n })
}

// WithSendDepth sets the send queue depth (default 128).
func WithSendDepth(n int) Option {
	return count("send queue depth", n, func(o *connOptions) { o.ep.SendDepth = n })
}

// WithRecvDepth sets the receive queue depth (default 128).
func WithRecvDepth(n int) Option {
	return count("receive queue depth", n, func(o *connOptions) { o.ep.RecvDepth = n })
}

// WithMaxSGE sets the scatter/gather entries per work request (default 4).
func WithMaxSGE(n int) Option {
	return count("scatter/gather entries", n, func(o *connOptions) { o.ep.MaxSGE = n })
}

// count is an option that sets a count of at least 1.
func count(what string, n int, set func(*connOptions)) Option {
	return func(o *connOptions) {
		if n < 1 {
			o.refuse("%s %d, want at least 1", what, n)
		}
		set(o)
	}
}

// WithInline sets the inline size asked of the QP (default 64 bytes; 0
// turns inline off). The device may grant more (Endpoint.MaxInline), and
// refuses more than it can inline.
func WithInline(n int) Option {
	return func(o *connOptions) {
		if n < 0 {
			o.refuse("inline size %d", n)
		}
		o.ep.MaxInline = n
		if n == 0 {
			o.ep.MaxInline = -1 // explicitly none, not the default
		}
	}
}

// WithPolling sets how completions are waited for (default
// endpoint.PollEvent); spin is how long endpoint.PollHybrid polls after
// the last completion before it sleeps (default 50µs), and must be 0 for
// the other modes.
func WithPolling(mode endpoint.PollMode, spin time.Duration) Option {
	return func(o *connOptions) {
		switch {
		case mode != endpoint.PollEvent && mode != endpoint.PollBusy && mode != endpoint.PollHybrid:
			o.refuse("poll mode %d", mode)
		case spin < 0 || spin > 0 && mode != endpoint.PollHybrid:
			o.refuse("spin %v with poll mode %d (a spin is hybrid polling's)", spin, mode)
		}
		o.ep.Poll, o.ep.Spin = int(mode), spin
	}
}

// WithLogger logs through l (the library is silent by default). A
// connection's lines carry its addresses, as the fields local and remote.
func WithLogger(l zerolog.Logger) Option { return func(o *connOptions) { o.logger = l } }

// WithCloseTimeout bounds how long an endpoint's Close waits for the device
// to flush posted work, and how long completions left after Close wait for
// a reader of Completions (default 5s).
func WithCloseTimeout(d time.Duration) Option {
	return func(o *connOptions) {
		if d <= 0 {
			o.refuse("close timeout %v", d)
		}
		o.ep.CloseTimeout = d
	}
}

// WithRNRRetry sets how often the QP resends a message the peer had no
// receive posted for (0-7, default 6; after the last the send fails with
// endpoint.StatusRNRRetryExc and the connection ends). 7 retries for ever,
// as perftest and rping do: a peer that never posts a receive then stalls
// the sender's queue. 0 makes any RNR an error at once: a protocol that
// counts credits uses it to prove it never overruns the peer.
func WithRNRRetry(n int) Option {
	return func(o *connOptions) {
		if n < 0 || n > 7 {
			o.refuse("RNR retry count %d, want 0-7", n)
		}
		o.rnrRetryCount, o.rnrRetrySet = n, true
	}
}

// WithRNRTimer sets how long a peer whose message found no receive posted
// here waits before sending it again (the QP's minimum RNR NAK timer,
// rounded up to the next InfiniBand step; at most 655 ms; default
// 20.48 ms, which with the default retry count bounds a send the peer
// never posts a receive for at a little over 120 ms). perftest and rc_pingpong use
// 0.64 ms, for the quickest recovery. See docs/DESIGN.md for why the
// kernel CM's 655 ms default is not kept.
func WithRNRTimer(d time.Duration) Option {
	return func(o *connOptions) {
		if d < 0 || d > maxRNRTimer {
			o.refuse("RNR timer %v, want 0-%v", d, maxRNRTimer)
		}
		o.rnrTimer = d
	}
}

// WithReadDepth sets how many RDMA reads and atomics may be in flight on the
// connection in each direction: the reads and atomics this side issues
// (initiator depth) and those of the peer it answers at once (responder
// resources). The default is 16; n must be 1-255, and the device's limits
// and, when accepting, what the dialer asked for cap it. More beyond the
// cap wait in the send queue.
func WithReadDepth(n int) Option {
	return func(o *connOptions) {
		if n < 1 || n > maxReadDepth {
			o.refuse("read depth %d (WithReadDepth), want 1-%d", n, maxReadDepth)
		}
		o.readDepth = n
	}
}

// WithPD makes the connection share pd (another endpoint's PD()), so that
// pools and regions on it serve both. By default every connection has a
// protection domain of its own, and its peer can reach nothing else. A PD
// its opener has closed (bufpool.PD.Close) makes no more connections: a
// listener given it then fails each Accept with ErrInvalid and refuses the
// dialer.
func WithPD(pd *bufpool.PD) Option {
	return func(o *connOptions) {
		if pd == nil {
			o.refuse("nil protection domain")
		}
		o.ep.PD = pd
	}
}

// WithAckTimeout sets the QP's local ack timeout: how long it waits for the
// peer to acknowledge before it resends (rounded up to the next step of
// 4.096 µs * 2^n, n 1-31; by default the CM chooses). With the retry count
// (7) it bounds how long a peer that stopped answering (crashed host, cut
// link) takes to fail the connection: about 8 times d. Only traffic
// notices: an idle connection to a dead host stays up until it sends.
func WithAckTimeout(d time.Duration) Option {
	return func(o *connOptions) {
		if d <= 0 || d > maxAckTimeout {
			o.refuse("ack timeout %v, want up to %v", d, maxAckTimeout)
		}
		o.ackTimeout = d
	}
}

// WithPrivateData sends b with the handshake: with the connect request
// (Dial, at most 56 bytes) or with the accept (Accept, at most 196 bytes).
// The peer reads it with Endpoint.PrivateData.
func WithPrivateData(b []byte) HandshakeOption {
	return func(o *handshake) { o.privateData = b }
}

// WithSetup runs f on the new endpoint after its QP exists and before the
// connection is requested or accepted: the place to post receives, so that
// nothing the peer sends at once finds none. If f fails, or the connection
// then does, Dial or Accept closes the endpoint, puts every buffer posted
// on it back in its pool, and returns the error. Dial runs f on every
// endpoint it tries: on iWARP, when the local port rdma_cm picked already
// has a TCP connection to the address, Dial closes that endpoint (its
// buffers back in their pools, as above) and tries again from another
// port with a new endpoint, and f runs again on it; anything f made for
// the closed one (a pool, say) is f's to free.
func WithSetup(f func(*endpoint.Endpoint) error) HandshakeOption {
	return func(o *handshake) { o.setup = f }
}

// WithResolveTimeout bounds address and route resolution (default 2s; a
// ctx deadline that is sooner wins).
func WithResolveTimeout(d time.Duration) DialOption {
	return dialOnly(func(o *dialOptions) {
		if d <= 0 {
			o.conn.refuse("resolve timeout %v, want more than 0", d)
		}
		o.resolveTimeout = d
	})
}

// defaultBacklog is how many requests wait for Accept by default: a burst
// of dials (500 at once against msg.Listener) overflowed a queue of 64
// and was rejected.
const defaultBacklog = 1024

// maxBacklog bounds WithBacklog: the listener holds a queue of that many
// requests in memory, and 65535 is the largest listen backlog a socket has
// had on Linux. Listen asks the kernel for it too, which caps it at
// rdma_ucm's max_backlog (1024 by default): there it bounds only the
// requests whose events the listener has not read yet.
const maxBacklog = 65535

// WithBacklog sets how many connect requests wait for Accept before new
// ones are rejected, at once: 1 to 65535 (default 1024).
func WithBacklog(n int) ListenOption {
	return listenOnly(func(o *listenOptions) {
		if (n < 1 || n > maxBacklog) && o.err == nil {
			o.err = invalid("backlog %d, want 1-%d", n, maxBacklog)
		}
		o.backlog = n
	})
}

// WithSharedReceiveQueue gives a listener a shared receive queue of depth
// receives, used by every endpoint it accepts (Listener.SRQ). The listener
// must be bound to one device's address, not a wildcard.
func WithSharedReceiveQueue(depth int) ListenOption {
	return listenOnly(func(o *listenOptions) {
		if depth < 1 && o.err == nil {
			o.err = invalid("shared receive queue depth %d", depth)
		}
		o.srqDepth = depth
	})
}
