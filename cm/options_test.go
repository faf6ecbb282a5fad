package cm

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdmacm/endpoint"
)

// A read depth the CM cannot carry is refused before anything is created,
// so no device is needed.
func TestReadDepthOutOfRangeIsRefused(t *testing.T) {
	for _, n := range []int{0, -1, 256} {
		_, err := Dial(context.Background(), "127.0.0.1:1", WithReadDepth(n))
		if !errors.Is(err, endpoint.ErrInvalid) {
			t.Errorf("Dial with WithReadDepth(%d): %v, want ErrInvalid", n, err)
		}
		_, err = Listen(context.Background(), "127.0.0.1:0", WithReadDepth(n))
		if !errors.Is(err, endpoint.ErrInvalid) {
			t.Errorf("Listen with WithReadDepth(%d): %v, want ErrInvalid", n, err)
		}
	}
}

// A backlog outside 1-65535 is refused before anything is created. The
// listener holds a queue of that many requests: WithBacklog(math.MaxInt32)
// made Listen allocate 16 GiB for it, and the process died out of memory.
func TestBacklogOutOfRangeIsRefused(t *testing.T) {
	for _, n := range []int{0, -1, maxBacklog + 1, math.MaxInt32, math.MaxInt} {
		_, err := Listen(context.Background(), "127.0.0.1:0", WithBacklog(n))
		if !errors.Is(err, endpoint.ErrInvalid) {
			t.Errorf("Listen with WithBacklog(%d): %v, want ErrInvalid", n, err)
		}
	}
}

// A nil option of any kind is ignored, as an option left unset: before,
// applying one panicked with a nil dereference.
func TestNilOptionsAreIgnored(t *testing.T) {
	d, err := newDialOptions([]DialOption{nil, Option(nil), HandshakeOption(nil)})
	if err != nil || d.resolveTimeout != 2*time.Second || d.conn.readDepth != defaultReadDepth {
		t.Errorf("Dial's: %+v, %v", d, err)
	}
	l, err := newListenOptions([]ListenOption{nil, Option(nil)})
	if err != nil || l.backlog != defaultBacklog {
		t.Errorf("Listen's: %+v, %v", l, err)
	}
	if _, err := newAcceptOptions(defaultConn(), []AcceptOption{nil, Option(nil), HandshakeOption(nil)}); err != nil {
		t.Errorf("Accept's: %v", err)
	}
}

// A resolve timeout of 0 or less is refused, and the error gives the value
// asked for (it said -1ns for 0).
func TestResolveTimeoutOutOfRangeIsRefused(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := newDialOptions([]DialOption{WithResolveTimeout(d)})
		if !errors.Is(err, endpoint.ErrInvalid) || !strings.Contains(err.Error(), "resolve timeout "+d.String()) {
			t.Errorf("WithResolveTimeout(%v): %v", d, err)
		}
	}
}

// A nil or zero Listener's or Request's calls fail with ErrInvalid and
// their addresses are nil: nothing panics or waits for ever.
func TestListenerNotMadeIsRefused(t *testing.T) {
	ctx := context.Background()
	for name, l := range map[string]*Listener{"nil": nil, "zero": {}} {
		_, acceptErr := l.Accept(ctx)
		_, requestErr := l.AcceptRequest(ctx)
		for op, err := range map[string]error{"Close": l.Close(), "Accept": acceptErr, "AcceptRequest": requestErr} {
			if !errors.Is(err, endpoint.ErrInvalid) {
				t.Errorf("%s Listener: %s gave %v, want ErrInvalid", name, op, err)
			}
		}
		if l.Addr() != nil || l.SRQ() != nil {
			t.Errorf("%s Listener: Addr %v, SRQ %v, want nil", name, l.Addr(), l.SRQ())
		}
	}
	for name, r := range map[string]*Request{"nil": nil, "zero": {}} {
		_, acceptErr := r.Accept(ctx)
		for op, err := range map[string]error{"Accept": acceptErr, "Reject": r.Reject(nil)} {
			if !errors.Is(err, endpoint.ErrInvalid) {
				t.Errorf("%s Request: %s gave %v, want ErrInvalid", name, op, err)
			}
		}
		if r.LocalAddr() != nil || r.RemoteAddr() != nil || r.PrivateData() != nil {
			t.Errorf("%s Request: addresses %v and %v, private data %v, want nil", name, r.LocalAddr(), r.RemoteAddr(), r.PrivateData())
		}
	}
}

// Every connection option refuses a value out of its range with
// ErrInvalid before anything is created, and the error names the value.
func TestOptionsOutOfRangeAreRefused(t *testing.T) {
	for want, opt := range map[string]Option{
		"inline size -1":        WithInline(-1),
		"poll mode 9":           WithPolling(endpoint.PollMode(9), 0),
		"spin 1ms with poll":    WithPolling(endpoint.PollEvent, time.Millisecond),
		"spin -1ns with poll":   WithPolling(endpoint.PollHybrid, -1),
		"RNR retry count 8":     WithRNRRetry(8),
		"RNR retry count -1":    WithRNRRetry(-1),
		"RNR timer 656ms":       WithRNRTimer(656 * time.Millisecond),
		"RNR timer -1ns":        WithRNRTimer(-1),
		"nil protection domain": WithPD(nil),
		"ack timeout 0s":        WithAckTimeout(0),
		"ack timeout 3h0m0s":    WithAckTimeout(3 * time.Hour),
	} {
		_, err := newDialOptions([]DialOption{opt})
		if !errors.Is(err, endpoint.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Dial's options gave %v, want ErrInvalid naming it", want, err)
		}
		_, err = newListenOptions([]ListenOption{opt})
		if !errors.Is(err, endpoint.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Listen's options gave %v, want ErrInvalid naming it", want, err)
		}
	}
	for _, depth := range []int{0, -1} {
		_, err := Listen(context.Background(), "127.0.0.1:0", WithSharedReceiveQueue(depth))
		if !errors.Is(err, endpoint.ErrInvalid) {
			t.Errorf("WithSharedReceiveQueue(%d): %v, want ErrInvalid", depth, err)
		}
	}
}
