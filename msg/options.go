package msg

import (
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
}

// Option configures Dial, Listen and Conn.
type Option func(*options)

func newOptions(opts []Option) (options, error) {
	o := options{recvDepth: 32, bufSize: 4096, logger: zerolog.Nop()}
	for _, f := range opts {
		f(&o)
	}
	if o.recvDepth < minRecvDepth {
		return o, errorf("receive depth %d: at least %d", o.recvDepth, minRecvDepth)
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
