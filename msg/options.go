package msg

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/cm"
)

// minRecvDepth: the credit protocol keeps one credit back for credit
// returns and grants in halves, which needs a few receives to work with.
const minRecvDepth = 4

type options struct {
	recvDepth int
	bufSize   int
	cmOpts    []cm.Option
	logger    zerolog.Logger

	keepalive        time.Duration
	keepaliveTimeout time.Duration
}

// Option configures Dial, Listen and Conn.
type Option func(*options)

func newOptions(opts []Option) (options, error) {
	o := options{recvDepth: 32, bufSize: 4096, logger: zerolog.Nop(),
		keepalive: 2 * time.Second, keepaliveTimeout: 10 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	if o.recvDepth < minRecvDepth {
		return o, errorf("receive depth %d: at least %d", o.recvDepth, minRecvDepth)
	}
	if o.keepalive > 0 && o.keepaliveTimeout > 0 && o.keepaliveTimeout < 2*o.keepalive {
		return o, errorf("keepalive timeout %v: at least twice the interval %v", o.keepaliveTimeout, o.keepalive)
	}
	if o.bufSize < HeaderSize+rendezvousInfoSize {
		return o, errorf("buffer size %d: at least %d", o.bufSize, HeaderSize+rendezvousInfoSize)
	}
	return o, nil
}

// WithRecvDepth sets how many receives each connection keeps posted: the
// peer's credits (default 32).
func WithRecvDepth(n int) Option { return func(o *options) { o.recvDepth = n } }

// WithBufferSize sets the size of each receive buffer (default 4096). A
// message whose payload does not fit the peer's buffers goes by rendezvous.
func WithBufferSize(n int) Option { return func(o *options) { o.bufSize = n } }

// WithCMOptions passes options to cm.Dial and cm.Listen (polling mode,
// logger, timeouts). Queue depths and private data are msg's own.
func WithCMOptions(opts ...cm.Option) Option {
	return func(o *options) { o.cmOpts = append(o.cmOpts, opts...) }
}

// WithLogger logs through l (silent by default).
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }

// WithKeepalive makes each side send a keepalive when it sent nothing for
// interval, and end the connection with ErrPeerSilent when the peer, able
// to send, sent nothing for timeout (default 2 s and 10 s; 0 turns either
// off). Soft-RoCE does not fail a QP whose link is cut (its transport
// retry timer never fires: librdmacm's rping hangs too), and an idle
// connection never notices a dead peer at all; the keepalive does both.
// Silence does not count while a rendezvous is being read either way: the
// reader's messages wait behind its RDMA READ, and the reader takes none
// while it registers the region and reads. Nor does time in which this side
// itself was stopped (its checks, every interval/2, came late): a GC pause
// behind a long copy stops every goroutine, the ones that take the peer's
// messages too.
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(o *options) { o.keepalive, o.keepaliveTimeout = interval, timeout }
}

// checkEvery is how often the control loop wakes to send keepalives and
// check the peer's silence (0: only when something changes). The silence
// rule reads a check later than this as this side having been stopped.
func (o options) checkEvery() time.Duration { return o.keepalive / 2 }
