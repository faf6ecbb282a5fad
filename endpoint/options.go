package endpoint

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/bufpool"
)

// PollMode is how the completion goroutine waits for completions.
type PollMode int

const (
	// PollEvent sleeps on the completion channel between completions
	// (cheapest CPU, highest latency). The default.
	PollEvent PollMode = iota
	// PollBusy polls the CQ without sleeping: lowest latency, one core busy
	// per endpoint while it is open (the caller's, while it waits in Next).
	PollBusy
	// PollHybrid polls for Config.Spin after the last completion, then sleeps.
	PollHybrid
)

// Config sizes and tunes an endpoint. The zero value is usable; package cm
// fills it from its options.
type Config struct {
	SendDepth int // send queue slots (default 128)
	RecvDepth int // receive queue slots (default 128)
	MaxSGE    int // scatter/gather entries per work request (default 4)
	MaxInline int // inline bytes asked of the QP (default 64; the device may grant more)
	// SignalEvery: an unsignaled send is forced signaled after this many
	// unsignaled ones in a row, so their slots come back (default SendDepth/4).
	SignalEvery int
	Poll        PollMode
	Spin        time.Duration // PollHybrid's spin (default 50µs)
	// CloseTimeout bounds how long Close waits for flushed completions
	// before it destroys the QP anyway (default 5s).
	CloseTimeout time.Duration
	Logger       zerolog.Logger
	// SRQ, if set, receives for this endpoint: PostRecv on the endpoint is
	// refused, receives are posted to the SRQ. The endpoint joins its PD.
	SRQ *SRQ
	// PD, if set, is shared with this endpoint (it takes a reference);
	// otherwise the endpoint gets a protection domain of its own.
	PD *bufpool.PD
}

func (c *Config) setDefaults() {
	if c.SendDepth <= 0 {
		c.SendDepth = 128
	}
	if c.RecvDepth <= 0 {
		c.RecvDepth = 128
	}
	if c.MaxSGE <= 0 {
		c.MaxSGE = 4
	}
	if c.MaxInline < 0 {
		c.MaxInline = 0
	} else if c.MaxInline == 0 {
		c.MaxInline = 64
	}
	if c.SignalEvery <= 0 {
		c.SignalEvery = max(1, c.SendDepth/4)
	}
	if c.Spin <= 0 {
		c.Spin = 50 * time.Microsecond
	}
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = 5 * time.Second
	}
}

// PostOption modifies one work request.
type PostOption func(*Request)

// Inline copies the data into the work request itself (IBV_SEND_INLINE), so
// the buffer is free again as soon as Post returns. Small sends and writes
// go inline automatically; this asks for it and fails with ErrInvalid when
// the data exceeds the QP's inline size.
func Inline() PostOption { return func(r *Request) { r.inline = inlineForced } }

// NoInline turns the automatic inline off for this request.
func NoInline() PostOption { return func(r *Request) { r.inline = inlineNever } }

// Unsignaled asks the device for no completion of its own (selective
// signaling). The context still comes back, on a later signaled completion.
// A receive always completes: on one, this and Silent are ErrInvalid.
func Unsignaled() PostOption { return func(r *Request) { r.unsignaled = true } }

// Silent is Unsignaled, and a silent request that succeeds delivers no
// Completion at all; one that fails still does (with its error, or
// ErrClosed when Close flushes it). It suits sends and writes whose
// completion the caller would only throw away: inline ones, whose buffer is
// free once the post returns, and ones from a buffer the caller keeps
// reusing, which the device has read once any later send-queue completion
// of this endpoint arrives (they complete in order). Each delivered
// Completion costs the reader a channel receive or a Next call, which is
// what a message-rate or ping-pong loop of unsignaled posts (as perftest's)
// does not want to pay.
func Silent() PostOption { return func(r *Request) { r.unsignaled, r.silent = true, true } }

// Fence waits for earlier RDMA READs and atomics to finish first.
func Fence() PostOption { return func(r *Request) { r.fence = true } }

// Solicited sets the solicited event flag on a send.
func Solicited() PostOption { return func(r *Request) { r.solicited = true } }

// WithImm attaches 32 bits of immediate data (host order): a send becomes
// SEND_WITH_IMM, a write becomes RDMA_WRITE_WITH_IMM.
func WithImm(imm uint32) PostOption { return func(r *Request) { r.Imm, r.hasImm = imm, true } }
