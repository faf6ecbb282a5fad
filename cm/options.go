package cm

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

type options struct {
	ep             endpoint.Config
	privateData    []byte
	replyData      *[]byte
	backlog        int
	resolveTimeout time.Duration
	retryCount     int
	rnrRetryCount  int
	logger         zerolog.Logger
	srqDepth       int
	setup          func(*endpoint.Endpoint) error
	ackTimeout     int // exponent; 0: the CM's default
	rnrTimer       time.Duration
	readDepth      int
}

// defaultReadDepth and maxReadDepth bound WithReadDepth (the CM carries
// the depths in one byte each).
const (
	defaultReadDepth = 16
	maxReadDepth     = 255
)

func newOptions(opts []Option) options {
	o := options{backlog: 64, resolveTimeout: 2 * time.Second, retryCount: 7, rnrRetryCount: 7,
		rnrTimer: 640 * time.Microsecond, readDepth: defaultReadDepth, logger: zerolog.Nop()}
	for _, f := range opts {
		f(&o)
	}
	o.ep.Logger = o.logger
	return o
}

// validate refuses options no connection can be made with.
func (o options) validate() error {
	if o.readDepth < 1 || o.readDepth > maxReadDepth {
		return fmt.Errorf("%w: read depth %d (WithReadDepth), want 1-%d", endpoint.ErrInvalid, o.readDepth, maxReadDepth)
	}
	return nil
}

// readDepths are the responder resources and initiator depth to ask for:
// WithReadDepth's, capped at what the device allows.
func (o options) readDepths(dev verbs.DeviceAttr) (resp, init int) {
	return min(o.readDepth, dev.MaxQPRdAtom), min(o.readDepth, dev.MaxQPInitRdAtom)
}

// Option configures Dial, Listen and Request.Accept.
type Option func(*options)

// WithQueueDepth sets both the send and the receive queue depth (default 128).
func WithQueueDepth(n int) Option {
	return func(o *options) { o.ep.SendDepth, o.ep.RecvDepth = n, n }
}

// WithSendDepth sets the send queue depth.
func WithSendDepth(n int) Option { return func(o *options) { o.ep.SendDepth = n } }

// WithRecvDepth sets the receive queue depth.
func WithRecvDepth(n int) Option { return func(o *options) { o.ep.RecvDepth = n } }

// WithMaxSGE sets the scatter/gather entries per work request (default 4).
func WithMaxSGE(n int) Option { return func(o *options) { o.ep.MaxSGE = n } }

// WithInline sets the inline size asked of the QP (default 64 bytes).
func WithInline(n int) Option { return func(o *options) { o.ep.MaxInline = n } }

// WithPolling sets how completions are waited for; spin is PollHybrid's.
func WithPolling(mode endpoint.PollMode, spin time.Duration) Option {
	return func(o *options) { o.ep.Poll, o.ep.Spin = mode, spin }
}

// WithLogger logs through l (the library is silent by default).
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }

// WithPrivateData sends b with the connect request (Dial, at most 56 bytes)
// or with the accept (Request.Accept and Listener.Accept, at most 196 bytes).
func WithPrivateData(b []byte) Option { return func(o *options) { o.privateData = b } }

// WithReplyData makes Dial store the private data the peer accepted with
// in *dst.
func WithReplyData(dst *[]byte) Option { return func(o *options) { o.replyData = dst } }

// WithBacklog sets how many connect requests wait for Accept before new
// ones are rejected (default 64).
func WithBacklog(n int) Option { return func(o *options) { o.backlog = n } }

// WithResolveTimeout bounds address and route resolution (default 2s; a
// ctx deadline that is sooner wins).
func WithResolveTimeout(d time.Duration) Option { return func(o *options) { o.resolveTimeout = d } }

// WithCloseTimeout bounds how long an endpoint's Close waits for the device
// to flush posted work (default 5s).
func WithCloseTimeout(d time.Duration) Option { return func(o *options) { o.ep.CloseTimeout = d } }

// WithSharedReceiveQueue gives a listener a shared receive queue of depth
// receives, used by every endpoint it accepts (Listener.SRQ). The listener
// must be bound to one device's address, not a wildcard.
func WithSharedReceiveQueue(depth int) Option { return func(o *options) { o.srqDepth = depth } }

// WithRNRRetry sets how often the QP retries a send the peer had no receive
// posted for (0-7; 7, the default, retries forever). 0 makes any RNR an
// error at once: a protocol that counts credits uses it to prove it never
// overruns the peer.
func WithRNRRetry(n int) Option { return func(o *options) { o.rnrRetryCount = n } }

// WithRNRTimer sets how long a peer whose message found no receive posted
// here waits before sending it again (the QP's minimum RNR NAK timer,
// rounded up to the next InfiniBand step; at most 655 ms). The default is
// 0.64 ms, as in rdma-core's rc_pingpong and perftest. The kernel's CM
// would leave it at 655 ms, and on Soft-RoCE every receiver-not-ready then
// stalled the connection for ~0.7 s: rxe drops the packets behind the
// refused one and resends them only after the timer.
func WithRNRTimer(d time.Duration) Option { return func(o *options) { o.rnrTimer = d } }

// WithReadDepth sets how many RDMA reads and atomics may be in flight on the
// connection in each direction: the reads and atomics this side issues
// (initiator depth) and those of the peer it answers at once (responder
// resources). The default is 16; n must be 1-255, and the device's limits
// and, when accepting, what the dialer asked for cap it. A deeper pipe
// keeps more reads of a large transfer moving (perftest asks for the
// device's maximum); more beyond the cap wait in the send queue.
func WithReadDepth(n int) Option { return func(o *options) { o.readDepth = n } }

// WithSetup runs f on the new endpoint after its QP exists and before the
// connection is requested or accepted: the place to post receives, so that
// nothing the peer sends at once finds none. If f fails, or the connection
// then does, Dial or Accept returns the error after closing the endpoint
// and draining its completions: what f posted is no longer in use.
func WithSetup(f func(*endpoint.Endpoint) error) Option { return func(o *options) { o.setup = f } }

// WithPD makes the connection share pd (another endpoint's PD()), so that
// pools and regions on it serve both. By default every connection has a
// protection domain of its own, and its peer can reach nothing else.
func WithPD(pd *bufpool.PD) Option { return func(o *options) { o.ep.PD = pd } }

// WithAckTimeout sets the QP's ack timeout to 4.096 µs * 2^exp (1-31).
// With the retry count (7, the most) it bounds how long a peer that stopped
// answering (crashed host, cut link) takes to fail the connection: about
// 4.096 µs * 2^exp * 8, e.g. 0.5 s for exp 14, 8.6 s for 18. Only traffic
// notices: an idle connection to a dead host stays up until it sends.
func WithAckTimeout(exp int) Option { return func(o *options) { o.ackTimeout = exp } }
