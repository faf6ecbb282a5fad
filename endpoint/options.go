package endpoint

import (
	"fmt"
	"strings"
)

// PollMode is how completions are waited for: by the completion goroutine,
// and by callers of Next.
type PollMode int

const (
	// PollEvent sleeps on the completion channel between completions
	// (cheapest CPU, highest latency). The default. A process whose
	// goroutines all sleep this way lets Go's system monitor park, and
	// pays for waking it on each message; GODEBUG=schedtrace=2147483647
	// in the environment keeps it awake (docs/DESIGN.md, "Event mode and
	// the Go runtime").
	PollEvent PollMode = iota
	// PollBusy polls the CQ without sleeping: lowest latency, one core busy
	// per endpoint while it is open (the caller's, while it waits in Next).
	PollBusy
	// PollHybrid polls for a spin time after the last completion, then
	// sleeps (cm.WithPolling sets the spin).
	PollHybrid
)

// Flags modify one work request. Combine them with |.
type Flags uint8

const (
	// Inline copies the data into the work request itself
	// (IBV_SEND_INLINE), so the buffer is free again as soon as the post
	// returns. Small sends and writes go inline automatically; Inline asks
	// for it and is refused with ErrInvalid when the data exceeds the QP's
	// inline size (MaxInline) or the request is not a send or write.
	Inline Flags = 1 << iota
	// NoInline turns the automatic inline off for this request.
	NoInline
	// Unsignaled asks the device for no completion of its own (selective
	// signaling). The context still comes back, on a later signaled
	// completion of the send queue. READs and atomics are posted
	// signaled all the same: they finish when their response arrives,
	// which siw reports after the sends posted behind them.
	Unsignaled
	// Silent is Unsignaled, and a silent request that succeeds delivers no
	// Completion at all; one that fails still does (with its error, or
	// ErrClosed when Close flushes it). It applies to sends and writes
	// whose completion the caller would only throw away: inline ones, whose
	// buffer is free once the post returns, and ones from a buffer the
	// caller keeps reusing, which the device has read once a completion
	// of a send-queue request posted after it arrives. Each delivered
	// Completion costs its reader a channel receive or a Next call.
	Silent
	// Fence makes the request wait until earlier RDMA READs and atomics
	// have finished.
	Fence
	// Solicited sets the solicited event flag on a send, or on a write
	// with immediate data.
	Solicited

	allFlags = Inline | NoInline | Unsignaled | Silent | Fence | Solicited
)

var flagNames = [...]string{"Inline", "NoInline", "Unsignaled", "Silent", "Fence", "Solicited"}

// String lists the flags, as "Inline|Fence"; 0 is "0".
func (f Flags) String() string {
	var names []string
	for i, n := range flagNames {
		if f&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	if rest := f &^ allFlags; rest != 0 || len(names) == 0 {
		names = append(names, fmt.Sprintf("%#x", uint8(rest)))
	}
	return strings.Join(names, "|")
}
