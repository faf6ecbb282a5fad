package endpoint

import (
	"errors"
	"fmt"
	"sync"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// SRQ is a shared receive queue (rdma_create_srq): receives posted to it
// are consumed by whichever of its endpoints a message arrives on, and that
// endpoint's Completions delivers the receive's context. Package cm makes
// one for a listener (cm.WithSharedReceiveQueue, Listener.SRQ).
type SRQ struct {
	pd     *seam.Domain
	pdv    *bufpool.PD
	srq    *verbs.SRQ
	maxSGE int

	mu      sync.Mutex
	slots   slotTable
	batch   *verbs.RecvBatch
	users   int // endpoints whose QP uses it
	retired bool
}

const srqBit = 1 << 33

func init() { seam.NewSRQ = newSRQ }

// newSRQ is seam.NewSRQ.
func newSRQ(dev *verbs.Context, pd any, depth, maxSGE int) (any, error) {
	if depth <= 0 || maxSGE <= 0 {
		return nil, fmt.Errorf("%w: shared receive queue depth %d, SGEs %d", ErrInvalid, depth, maxSGE)
	}
	attr, err := dev.QueryDevice()
	if err != nil {
		return nil, err
	}
	if depth > attr.MaxSRQWR || maxSGE > attr.MaxSGE {
		return nil, fmt.Errorf("%w: a shared receive queue of %d receives of %d SGEs; the device's hold at most %d of %d (cm.WithSharedReceiveQueue, WithMaxSGE)", ErrInvalid, depth, maxSGE, attr.MaxSRQWR, attr.MaxSGE)
	}
	d := seam.DomainOf(pd)
	if pd != nil && d == nil {
		return nil, fmt.Errorf("%w: the shared protection domain (cm.WithPD) is closed", ErrInvalid)
	}
	if d == nil {
		if d, err = seam.NewDomain(dev); err != nil {
			return nil, err
		}
	} else if !d.OnDevice(dev) {
		return nil, fmt.Errorf("%w: the shared protection domain is on another device", ErrInvalid)
	} else if err := d.Acquire(); err != nil {
		return nil, fmt.Errorf("endpoint: the shared protection domain: %w", err)
	}
	srq, err := d.PD().NewSRQ(depth, maxSGE)
	if err != nil {
		d.Release()
		return nil, err
	}
	return &SRQ{pd: d, pdv: seam.WrapPD(d).(*bufpool.PD), srq: srq, maxSGE: maxSGE, slots: newSlotTable(depth),
		batch: verbs.NewRecvBatch(1, maxSGE)}, nil
}

// PD is the protection domain the SRQ's receive buffers must be registered in.
func (s *SRQ) PD() *bufpool.PD {
	if !s.made() {
		return nil
	}
	return s.pdv
}

// made says whether s was made by cm.WithSharedReceiveQueue. A nil or
// zero SRQ's calls fail with errSRQNotMade, its PD is nil and nothing is
// pending on it, instead of panicking.
func (s *SRQ) made() bool { return s != nil && s.srq != nil }

var errSRQNotMade = fmt.Errorf("%w: an SRQ not made by cm.WithSharedReceiveQueue", ErrInvalid)

// PostRecv posts b to receive one message on any endpoint of the SRQ.
func (s *SRQ) PostRecv(wrContext any, b *bufpool.Buffer) error {
	if !s.made() {
		return errSRQNotMade
	}
	if b == nil {
		return fmt.Errorf("%w: recv without a buffer", ErrInvalid)
	}
	sge, d, err := seam.BufferSGE(b, 0, b.Len())
	if err != nil {
		return fmt.Errorf("%w: recv: %w", ErrInvalid, err)
	}
	if d != s.pd {
		return fmt.Errorf("%w: recv of a buffer registered in another protection domain than the shared receive queue's (SRQ.PD)", ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retired {
		return errClosedHere
	}
	if len(s.slots.free) == 0 {
		return ErrQueueFull
	}
	r := Request{Op: OpRecv, Context: wrContext, Buffer: b}
	idx := s.slots.take(&r, b.Len())
	s.batch.Add(&verbs.RecvWR{WRID: srqBit | uint64(idx), SGE: []verbs.SGE{sge}})
	if err := verbs.Post(nil, s.srq, s.batch, nil); err != nil {
		s.slots.release(idx)
		return err
	}
	return nil
}

// Pending is the number of posted receives not yet consumed.
func (s *SRQ) Pending() int {
	if !s.made() {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots.inUse()
}

func (s *SRQ) attach() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retired {
		return errClosedHere
	}
	s.users++
	return nil
}

func (s *SRQ) detach() {
	s.mu.Lock()
	s.users--
	s.mu.Unlock()
}

func (s *SRQ) complete(idx uint32) (slot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(idx) >= len(s.slots.slots) || !s.slots.slots[idx].used {
		return slot{}, false
	}
	return s.slots.release(idx), true
}

// Destroy destroys the SRQ once no endpoint uses it any more (close them,
// and the listener, first) and returns the receives never consumed, each
// with ErrClosed, so their buffers can go back to their pool.
func (s *SRQ) Destroy() ([]Completion, error) {
	if !s.made() {
		return nil, errSRQNotMade
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retired {
		return nil, nil
	}
	if s.users > 0 {
		return nil, fmt.Errorf("endpoint: %d endpoints still use the shared receive queue: close them first", s.users)
	}
	s.retired = true
	err := errors.Join(s.srq.Destroy(), s.pd.Release())
	s.batch.Free()
	var pending []Completion
	for i := range s.slots.slots {
		if s.slots.slots[i].used {
			sl := s.slots.release(uint32(i))
			pending = append(pending, Completion{Context: sl.ctx, Op: OpRecv, Buffer: sl.buf, Err: errClosedHere})
		}
	}
	return pending, err
}
