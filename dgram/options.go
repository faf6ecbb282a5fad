package dgram

import (
	"fmt"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/endpoint"
)

// Option configures Listen and Dial. A nil Option is ignored.
type Option func(*options)

type options struct {
	sendDepth, recvDepth int
	peers                int // address handles kept for peers learnt from their datagrams
	logger               zerolog.Logger
	err                  error
}

func newOptions(opts []Option) (options, error) {
	o := options{sendDepth: 128, recvDepth: 256, peers: 1024, logger: zerolog.Nop()}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o, o.err
}

func positive(what string, n int, set func(*options)) Option {
	return func(o *options) {
		if n <= 0 {
			if o.err == nil {
				o.err = fmt.Errorf("%w: %s %d must be positive", endpoint.ErrInvalid, what, n)
			}
			return
		}
		set(o)
	}
}

// WithSendDepth sets how many datagrams may be on their way out at once
// (default 128): a write beyond it waits for the device to finish one.
func WithSendDepth(n int) Option {
	return positive("send depth", n, func(o *options) { o.sendDepth = n })
}

// WithRecvDepth sets how many receive buffers stay posted (default 256).
// Datagrams that arrive while all of them are full are dropped by the
// device: it is the most a reader may fall behind by.
func WithRecvDepth(n int) Option {
	return positive("receive depth", n, func(o *options) { o.recvDepth = n })
}

// WithPeerCache bounds how many peers learnt from the datagrams they sent
// are kept (default 1024), each with the address handle made on the first
// write to it. The least recently written to are forgotten first, never
// one a send in flight still uses. A write to a forgotten peer fails with
// ErrNoPath until a datagram from it arrives again; so does one to the
// sender of a group's datagram, which no handle can answer (Resolve it).
// Peers from Resolve and joined groups are kept until Close or LeaveGroup.
func WithPeerCache(n int) Option {
	return positive("peer cache", n, func(o *options) { o.peers = n })
}

// WithLogger sets the logger; the default logs nothing.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }
