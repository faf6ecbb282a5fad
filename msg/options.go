package msg

import (
	"fmt"
	"math"
	"time"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
)

// minRecvDepth: the credit protocol keeps three credits back from data
// (dataReserve) and grants in halves; with fewer than twice the reserve,
// data could leave only when every credit is back, and two sides sending
// both ways would starve each other.
const minRecvDepth = 2 * dataReserve

// defaultRecvDepth lets 61 messages of data be in flight each way: an RPC
// client's calls wait for credits only past that many at once. A
// connection pins as many receive buffers, and up to as many send buffers,
// of WithBufferSize's size each.
const defaultRecvDepth = 64

type options struct {
	recvDepth int
	bufSize   int
	cmOpts    []cm.Option
	logger    zerolog.Logger

	keepalive        time.Duration
	keepaliveTimeout time.Duration
	rvCache          int // bytes of rendezvous regions kept registered
	maxRecv          int // the largest message this side receives: at least what a receive buffer holds
	// rvBudget holds rvCache bytes for the connections of one Dial or
	// Listen together: newOptions makes it for the call.
	rvBudget *regionBudget
	// streamReader: the application reads the connections as byte
	// streams (rdmanet; seam.StreamReader), which hello tells the peer.
	streamReader bool
	// polls: the connections poll their CQs (busy or hybrid polling), so
	// spinning goroutines may hold every P (see outbox.post).
	polls bool
}

// Option configures Dial, Listen and Conn. A nil Option is ignored.
type Option func(*options)

// checkHello refuses a receive depth or a buffer size that a hello cannot
// carry (32 bits each) or that a peer would refuse to hear.
func checkHello(recvDepth, bufSize int) error {
	if recvDepth < minRecvDepth || recvDepth > math.MaxUint32 {
		return invalid("receive depth %d: at least %d, at most %d", recvDepth, minRecvDepth, uint32(math.MaxUint32))
	}
	if bufSize < HeaderSize+rendezvousInfoSize || bufSize > math.MaxUint32 {
		return invalid("buffer size %d: at least %d, at most %d", bufSize, HeaderSize+rendezvousInfoSize, uint32(math.MaxUint32))
	}
	return nil
}

func newOptions(opts []Option) (options, error) {
	o := options{recvDepth: defaultRecvDepth, bufSize: 4096, logger: zerolog.Nop(),
		keepalive: 2 * time.Second, keepaliveTimeout: 10 * time.Second, rvCache: 16 << 20,
		maxRecv: maxRendezvous}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if err := checkHello(o.recvDepth, o.bufSize); err != nil {
		return o, err
	}
	if o.keepalive < 0 || o.keepaliveTimeout < 0 {
		return o, invalid("keepalive interval %v and timeout %v: 0 turns one off, neither may be negative", o.keepalive, o.keepaliveTimeout)
	}
	if o.keepalive > 0 && o.keepaliveTimeout > 0 && o.keepaliveTimeout/2 < o.keepalive {
		return o, invalid("keepalive timeout %v: at least twice the interval %v", o.keepaliveTimeout, o.keepalive)
	}
	if o.rvCache < 0 {
		return o, invalid("rendezvous cache of %d bytes: at least 0", o.rvCache)
	}
	o.rvBudget = &regionBudget{limit: o.rvCache}
	if o.maxRecv < 0 || o.maxRecv > maxRendezvous {
		return o, invalid("largest message of %d bytes: at least 0, at most %d", o.maxRecv, maxRendezvous)
	}
	o.maxRecv = max(o.maxRecv, o.bufSize-HeaderSize)
	cfg, rnrRetrySet, err := seam.ConnOptions(o.cmOpts)
	if err != nil {
		return o, fmt.Errorf("msg: WithCMOptions: %w", err)
	}
	if cfg.SendDepth != 0 || cfg.RecvDepth != 0 || rnrRetrySet {
		return o, invalid("WithCMOptions: queue depths and the RNR retry count are msg's own (set the receive depth with WithRecvDepth)")
	}
	o.polls = endpoint.PollMode(cfg.Poll) != endpoint.PollEvent
	return o, nil
}

// invalid is an option's refusal: it matches endpoint.ErrInvalid, as
// package cm's refusals do.
func invalid(format string, a ...any) error {
	return fmt.Errorf("msg: %s: %w", fmt.Sprintf(format, a...), endpoint.ErrInvalid)
}

func init() {
	seam.StreamReader = Option(func(o *options) { o.streamReader = true })
}

// hello is what this side announces to its peers.
func (o options) hello() hello {
	return hello{recvDepth: o.recvDepth, bufSize: o.bufSize, maxMessage: o.maxRecv, streamReader: o.streamReader,
		silence: o.keepaliveTimeout}
}

// WithRecvDepth sets how many receives each connection keeps posted: the
// peer's credits (default 64, at least 6). The peer's messages of data may
// hold all but three of them before this side releases any; the last three
// are kept for the protocol's own (credits, confirmations, keepalives).
// It bounds the peer's messages in flight, and so an RPC client's calls in
// flight (the server's depth) and a server's responses (the client's).
func WithRecvDepth(n int) Option { return func(o *options) { o.recvDepth = n } }

// WithBufferSize sets the size of each receive buffer, and the most a send
// buffer holds (default 4096). A message whose payload does not fit this
// side's buffers or the peer's goes by rendezvous.
//
// A connection pins WithRecvDepth's count of buffers of this size for its
// receives and at most as many for its sends, whatever the peer uses
// (rendezvous regions aside: WithRendezvousCache), so a server of many
// connections bounds its memory with these two options on its Listener.
func WithBufferSize(n int) Option { return func(o *options) { o.bufSize = n } }

// WithCMOptions passes connection options to cm.Dial and cm.Listen
// (polling mode, logger, timeouts, a shared PD). Queue depths and the RNR
// retry count are msg's own: Dial and Listen refuse options that set them.
//
// With busy or hybrid polling (cm.WithPolling), the goroutines that wait
// on a connection (a reader, a caller, a sender waiting for a credit)
// spin for what they wait for; between waits the connection's completions
// are taken as in event mode, so a connection nobody waits on keeps no
// core busy (a blocked Read or Recv is a wait).
func WithCMOptions(opts ...cm.Option) Option {
	return func(o *options) { o.cmOpts = append(o.cmOpts, opts...) }
}

// WithRendezvousCache sets how many bytes of rendezvous regions are kept
// registered between messages: by a dialed connection, or by all the
// connections a Listener accepts together, each side for its own (default
// 16 MiB; 0 keeps none). Mapping and registering a region for each large
// message costs more than moving it; a kept region costs pinned memory
// while its connection lives, and a Listener's connections give up the
// regions kept longest, whichever connection's, to keep the bound, so a
// server's idle regions stay within it however many connections it has.
// Regions are sized in powers of two from 64 KiB, so an 8 MiB message
// reuses one 8 MiB region. The one-sided operations (WriteRemote,
// ReadRemote, the atomics) stage their bytes in regions of the same cache.
func WithRendezvousCache(bytes int) Option { return func(o *options) { o.rvCache = bytes } }

// WithMaxRecvSize sets the largest message this side receives, counting
// an RPC's method name with its request (default and most 2 GiB, what one
// RDMA READ moves). A message that fits a receive buffer always arrives:
// it costs nothing more, so the bound is never below that. A larger one is
// received by rendezvous into a region registered for it, so a server
// that takes messages from clients it does not trust bounds with this
// what each of them can make it pin, as gRPC's MaxRecvMsgSize does
// (rdmanet sets 0: its peers' writes fit its buffers). The bound travels
// in the hello: the peer's Send, SendRegion and Call of a larger message
// fail at once with an error matching ErrTooLarge, and the connection
// goes on; a peer that offers one anyway ends the connection with an
// error matching ErrMalformed.
func WithMaxRecvSize(bytes int) Option { return func(o *options) { o.maxRecv = bytes } }

// WithLogger logs through l (silent by default): msg's own lines and its
// connections' (package cm's: a port going down, a CM event), unless
// WithCMOptions gives the connections a logger of their own.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }

// WithKeepalive makes this side send a keepalive when it sent nothing for
// interval, and end the connection with ErrPeerSilent when the peer, able
// to send, sent nothing for timeout (default 2 s and 10 s; 0 turns either
// off; timeout at least twice interval). Each side tells the other its
// timeout when they connect, and sends keepalives at least every half of
// the peer's (but not more often than every 10 ms for it), whatever its
// own interval: a side may set a longer interval, or none, and still keep
// to a peer that wants to hear from it sooner. It
// detects a peer or link that died where the device would not (an idle
// connection, or a device whose transport timer does not fire). Silence
// does not count while a rendezvous is being read either way, nor while
// this side itself was stopped (its checks came late).
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(o *options) { o.keepalive, o.keepaliveTimeout = interval, timeout }
}

// keepaliveEvery is how often a side with keepalive interval own sends
// one to a peer that tolerates silence (its hello) for at most
// peerSilence: at least every half of that, as this side's own timeout
// requires of its interval, though never more often than
// minPeerKeepalive for the peer's sake alone (0: never).
func keepaliveEvery(own, peerSilence time.Duration) time.Duration {
	if peerSilence <= 0 {
		return own
	}
	if half := max(peerSilence/2, minPeerKeepalive); own == 0 || half < own {
		return half
	}
	return own
}

// minPeerKeepalive bounds how often a peer's timeout makes this side send
// keepalives: a peer's hello must not make it send thousands a second.
const minPeerKeepalive = 10 * time.Millisecond

// checkEvery is how often the control loop of a connection that sends
// keepalives every sendEvery wakes to send them and check the peer's
// silence: half of that, or a quarter of this side's timeout when it sends
// none (0: only when something changes). The silence rule reads a check
// later than this as this side having been stopped.
func (o options) checkEvery(sendEvery time.Duration) time.Duration {
	if sendEvery == 0 {
		return o.keepaliveTimeout / 4
	}
	return sendEvery / 2
}
