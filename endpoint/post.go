package endpoint

import (
	"errors"
	"fmt"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

type inlineMode uint8

const (
	inlineAuto inlineMode = iota
	inlineForced
	inlineNever
)

// Request is one work request for PostBatch. The Post* methods build one
// for you; PostBatch posts many in one ibv_post_send (one doorbell).
type Request struct {
	Op       Op
	Context  any               // comes back in the Completion
	Buffer   *bufpool.Buffer   // the local buffer, with Length bytes from its start
	Length   int               // bytes of Buffer to use (sends, writes, reads)
	Segments []bufpool.Segment // scatter/gather list, instead of Buffer
	Remote   bufpool.Remote    // RDMA and atomics: the peer's memory
	Imm      uint32            // with WithImm
	Compare  uint64            // compare-and-swap: expected value; fetch-and-add: addend
	Swap     uint64            // compare-and-swap: new value

	hasImm     bool
	inline     inlineMode
	unsignaled bool
	silent     bool
	fence      bool
	solicited  bool
}

// Apply applies post options to the request (for building PostBatch lists).
func (r *Request) Apply(opts ...PostOption) *Request {
	r.apply(opts)
	return r
}

// apply does not return r, so that a Request on the stack stays there.
func (r *Request) apply(opts []PostOption) {
	for _, o := range opts {
		o(r)
	}
}

// PostSend sends the first n bytes of b. The peer must have a receive posted.
func (ep *Endpoint) PostSend(wrContext any, b *bufpool.Buffer, n int, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpSend, Context: wrContext, Buffer: b, Length: n}, opts)
}

// PostSendImm sends the first n bytes of b with immediate data.
func (ep *Endpoint) PostSendImm(wrContext any, b *bufpool.Buffer, n int, imm uint32, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpSend, Context: wrContext, Buffer: b, Length: n, Imm: imm, hasImm: true}, opts)
}

// PostSendv sends the concatenation of segs (rdma_post_sendv).
func (ep *Endpoint) PostSendv(wrContext any, segs []bufpool.Segment, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpSend, Context: wrContext, Segments: segs}, opts)
}

// PostRecv posts b to receive one message of up to b.Len() bytes.
func (ep *Endpoint) PostRecv(wrContext any, b *bufpool.Buffer) error {
	return ep.postOne(Request{Op: OpRecv, Context: wrContext, Buffer: b, Length: b.Len()}, nil)
}

// PostRecvv posts a scatter list for one message (rdma_post_recvv).
func (ep *Endpoint) PostRecvv(wrContext any, segs []bufpool.Segment) error {
	return ep.postOne(Request{Op: OpRecv, Context: wrContext, Segments: segs}, nil)
}

// PostWrite writes the first n bytes of b to the start of remote.
func (ep *Endpoint) PostWrite(wrContext any, b *bufpool.Buffer, n int, remote bufpool.Remote, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpWrite, Context: wrContext, Buffer: b, Length: n, Remote: remote}, opts)
}

// PostWriteImm writes like PostWrite and consumes a receive at the peer,
// whose completion has Op OpRecvWriteImm and carries imm.
func (ep *Endpoint) PostWriteImm(wrContext any, b *bufpool.Buffer, n int, remote bufpool.Remote, imm uint32, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpWrite, Context: wrContext, Buffer: b, Length: n, Remote: remote, Imm: imm, hasImm: true}, opts)
}

// PostWritev gathers segs into remote (rdma_post_writev).
func (ep *Endpoint) PostWritev(wrContext any, segs []bufpool.Segment, remote bufpool.Remote, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpWrite, Context: wrContext, Segments: segs, Remote: remote}, opts)
}

// PostRead reads n bytes from the start of remote into b.
func (ep *Endpoint) PostRead(wrContext any, b *bufpool.Buffer, n int, remote bufpool.Remote, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpRead, Context: wrContext, Buffer: b, Length: n, Remote: remote}, opts)
}

// PostReadv scatters remote into segs (rdma_post_readv).
func (ep *Endpoint) PostReadv(wrContext any, segs []bufpool.Segment, remote bufpool.Remote, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpRead, Context: wrContext, Segments: segs, Remote: remote}, opts)
}

// PostCompareAndSwap compares the 8-byte word at remote (8-byte aligned)
// with compare and, if equal, stores swap. The word's old value lands in the
// first 8 bytes of b, in host byte order.
func (ep *Endpoint) PostCompareAndSwap(wrContext any, b *bufpool.Buffer, remote bufpool.Remote, compare, swap uint64, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpCompareAndSwap, Context: wrContext, Buffer: b, Length: 8, Remote: remote, Compare: compare, Swap: swap}, opts)
}

// PostFetchAndAdd adds add to the 8-byte word at remote (8-byte aligned);
// the old value lands in the first 8 bytes of b, in host byte order.
func (ep *Endpoint) PostFetchAndAdd(wrContext any, b *bufpool.Buffer, remote bufpool.Remote, add uint64, opts ...PostOption) error {
	return ep.postOne(Request{Op: OpFetchAndAdd, Context: wrContext, Buffer: b, Length: 8, Remote: remote, Compare: add}, opts)
}

func (ep *Endpoint) postOne(r Request, opts []PostOption) error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.scratch[0] = r
	// Options run on the endpoint's scratch request, not on r: r would
	// escape to the heap through the unknown option functions.
	ep.scratch[0].apply(opts)
	err := ep.postLocked(ep.scratch)
	ep.scratch[0] = Request{} // drop references
	return err
}

// PostBatch posts all requests, sends and receives, each kind in one call.
// It is all or nothing for what it checks first (slots, lengths, segments):
// on such an error nothing is posted. If the device refuses a request, the
// requests before it are posted and will complete; the error is a
// *verbs.PostError-wrapping error naming the first one that was not.
func (ep *Endpoint) PostBatch(reqs []Request) error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.postLocked(reqs)
}

func (ep *Endpoint) postLocked(reqs []Request) error {
	if ep.closing {
		return ErrClosed
	}
	nsend, nrecv := 0, 0
	for i := range reqs {
		if err := ep.check(&reqs[i]); err != nil {
			if len(reqs) > 1 {
				return fmt.Errorf("request %d: %w", i, err)
			}
			return err
		}
		if reqs[i].Op == OpRecv {
			nrecv++
		} else {
			nsend++
		}
	}
	if nsend > len(ep.sends.free) || nrecv > len(ep.recvs.free) {
		return ErrQueueFull
	}
	var sges [8]verbs.SGE
	sendIdx, recvIdx := ep.sendTaken[:0], ep.recvTaken[:0]
	for i := range reqs {
		r := &reqs[i]
		sg := ep.sgeList(r, sges[:0])
		if r.Op == OpRecv {
			idx := ep.recvs.take(r)
			recvIdx = append(recvIdx, idx)
			ep.recvBatch.Add(&verbs.RecvWR{WRID: recvBit | uint64(idx), SGE: sg})
			continue
		}
		idx, flags := ep.takeSend(r)
		sendIdx = append(sendIdx, idx)
		ep.sendBatch.Add(&verbs.SendWR{WRID: uint64(idx), Opcode: wrOpcode(r), Flags: flags,
			Imm: r.Imm, RemoteAddr: r.Remote.Addr, RKey: r.Remote.RKey, CompareAdd: r.Compare, Swap: r.Swap, SGE: sg})
	}
	// Receives first: a send in the same batch may be answered at once.
	err := verbs.Post(ep.id, nil, ep.recvBatch, ep.sendBatch)
	if err == nil {
		return nil
	}
	var pe *verbs.PostError
	if errors.As(err, &pe) {
		if pe.Recv {
			ep.unpost(recvIdx, pe.Index, true)
			ep.unpost(sendIdx, 0, false)
		} else {
			ep.unpost(sendIdx, pe.Index, false)
		}
	}
	return err
}

// check refuses a request before anything is posted.
func (ep *Endpoint) check(r *Request) error {
	if r.Op == OpRecv && ep.cfg.SRQ != nil {
		return fmt.Errorf("%w: this endpoint receives through a shared receive queue: post receives to it", ErrInvalid)
	}
	if r.Buffer == nil && len(r.Segments) == 0 {
		return fmt.Errorf("%w: %v without a buffer or segments", ErrInvalid, r.Op)
	}
	if r.Buffer != nil && (r.Length < 0 || r.Length > r.Buffer.Len()) {
		return fmt.Errorf("%w: %v of %d bytes from a %d-byte buffer", ErrInvalid, r.Op, r.Length, r.Buffer.Len())
	}
	if len(r.Segments) > ep.cfg.MaxSGE {
		return fmt.Errorf("%w: %d segments, the QP takes at most %d (Config.MaxSGE)", ErrInvalid, len(r.Segments), ep.cfg.MaxSGE)
	}
	n := r.total()
	switch r.Op {
	case OpRead, OpWrite:
		if uint64(n) > uint64(r.Remote.Len) {
			return fmt.Errorf("%w: %v of %d bytes into a %d-byte remote region", ErrInvalid, r.Op, n, r.Remote.Len)
		}
	case OpCompareAndSwap, OpFetchAndAdd:
		if !ep.dev.Atomics {
			return ErrNoAtomics
		}
		if n != 8 || r.Remote.Addr%8 != 0 || r.Remote.Len < 8 {
			return fmt.Errorf("%w: atomics need an 8-byte local buffer and an 8-byte aligned remote word (addr %#x, len %d)", ErrInvalid, r.Remote.Addr, r.Remote.Len)
		}
	case OpRecv, OpSend:
	default:
		return fmt.Errorf("%w: unknown op %v", ErrInvalid, r.Op)
	}
	if r.inline == inlineForced && (n > ep.caps.MaxInline || r.Op != OpSend && r.Op != OpWrite) {
		return fmt.Errorf("%w: inline %v of %d bytes, the QP inlines at most %d bytes of sends and writes", ErrInvalid, r.Op, n, ep.caps.MaxInline)
	}
	if r.Op == OpRecv && (r.unsignaled || r.fence || r.solicited) {
		// A receive always completes: its Completion carries the message.
		return fmt.Errorf("%w: Unsignaled, Silent, Fence and Solicited apply to sends, writes, reads and atomics, not to a receive", ErrInvalid)
	}
	if r.hasImm && r.Op != OpSend && r.Op != OpWrite {
		return fmt.Errorf("%w: immediate data on a %v", ErrInvalid, r.Op)
	}
	return nil
}

func (r *Request) total() int {
	if r.Buffer != nil {
		return r.Length
	}
	n := 0
	for _, s := range r.Segments {
		n += int(s.Len)
	}
	return n
}

func (ep *Endpoint) sgeList(r *Request, dst []verbs.SGE) []verbs.SGE {
	if r.Buffer != nil {
		if r.Length == 0 {
			return dst // a zero-length message has no SGE
		}
		s, _ := r.Buffer.Segment(0, r.Length) // checked
		return append(dst, verbs.SGE{Addr: s.Addr, Len: s.Len, LKey: s.LKey})
	}
	for _, s := range r.Segments {
		dst = append(dst, verbs.SGE{Addr: s.Addr, Len: s.Len, LKey: s.LKey})
	}
	return dst
}

func wrOpcode(r *Request) verbs.WROpcode {
	switch r.Op {
	case OpSend:
		if r.hasImm {
			return verbs.WRSendWithImm
		}
		return verbs.WRSend
	case OpWrite:
		if r.hasImm {
			return verbs.WRRDMAWriteWithImm
		}
		return verbs.WRRDMAWrite
	case OpRead:
		return verbs.WRRDMARead
	case OpCompareAndSwap:
		return verbs.WRAtomicCmpSwp
	default:
		return verbs.WRAtomicFetchAdd
	}
}

func (t *slotTable) take(r *Request) uint32 {
	idx := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	t.slots[idx] = slot{ctx: r.Context, buf: r.Buffer, op: r.Op, length: r.total(), used: true}
	return idx
}

func (t *slotTable) release(idx uint32) slot {
	s := t.slots[idx]
	t.slots[idx] = slot{}
	t.free = append(t.free, idx)
	return s
}

// takeSend takes a send slot and decides the flags: inline when it fits,
// and signaled unless asked otherwise, with every SignalEvery-th unsignaled
// send, and any send that leaves few slots free, forced signaled so that
// the unsignaled ones before it come back.
func (ep *Endpoint) takeSend(r *Request) (uint32, int) {
	idx := ep.sends.take(r)
	ep.sendFIFO.push(idx)
	flags := 0
	n := r.total()
	if (r.Op == OpSend || r.Op == OpWrite) && n > 0 &&
		(r.inline == inlineForced || r.inline == inlineAuto && n <= ep.caps.MaxInline) {
		flags |= verbs.SendInline
	}
	if r.fence {
		flags |= verbs.SendFence
	}
	if r.solicited {
		flags |= verbs.SendSolicited
	}
	signaled := !r.unsignaled || ep.unsigRun+1 >= ep.cfg.SignalEvery || len(ep.sends.free) < ep.cfg.SendDepth/4
	if signaled {
		flags |= verbs.SendSignaled
		ep.unsigRun = 0
	} else {
		ep.unsigRun++
	}
	ep.sends.slots[idx].signaled = signaled
	ep.sends.slots[idx].silent = r.silent
	return idx, flags
}

// unpost gives back the slots of the requests of one kind that were not
// posted: those from the failing index on (all of them for a batch that
// was never handed to the device).
func (ep *Endpoint) unpost(taken []uint32, from int, recv bool) {
	for _, idx := range taken[from:] {
		if recv {
			ep.recvs.release(idx)
			continue
		}
		ep.sends.release(idx)
	}
	if !recv {
		ep.sendFIFO.dropNewest(len(taken) - from)
	}
}
