package endpoint

import (
	"errors"
	"fmt"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Request is one work request: what PostBatch posts, and what each Post*
// method builds from its arguments. Its fields say everything the request
// does; a field that does not fit the operation must be left zero, or the
// post is refused with ErrInvalid.
type Request struct {
	Op      Op  // OpSend, OpRecv, OpWrite, OpRead, OpCompareAndSwap or OpFetchAndAdd
	Context any // comes back in the request's Completion

	// The local memory: Length bytes from the start of Buffer, or the
	// concatenation of Segments (then Buffer is nil and Length 0). A
	// receive takes the whole Buffer when Length is 0. An atomic's Buffer
	// receives the remote word's old value in its first 8 bytes.
	Buffer   *bufpool.Buffer
	Length   int
	Segments []bufpool.Segment

	// Remote is the peer's memory for writes, reads and atomics.
	Remote bufpool.Remote

	// HasImm makes a send or write carry Imm, 32 bits of immediate data
	// (SEND_WITH_IMM, RDMA_WRITE_WITH_IMM): the peer's receive completion
	// has HasImm and Imm.
	HasImm bool
	Imm    uint32

	Compare uint64 // OpCompareAndSwap: the value expected at Remote
	Swap    uint64 // OpCompareAndSwap: the value stored when it matches
	Add     uint64 // OpFetchAndAdd: the addend

	Flags Flags

	// Notify, if set, receives the request's completion instead of
	// Completions (and Next): a way to wait for this one request. It must
	// be buffered; give it room for every request that names it, or a
	// completion waiting for room holds up later ones.
	Notify chan<- Completion
}

// PostSend sends the first n bytes of b. The peer must have a receive
// posted: with none, the device resends it as cm.WithRNRRetry and the
// peer's cm.WithRNRTimer say (by default 6 times, at least 20.48 ms apart), then
// the send fails with StatusRNRRetryExc and the connection ends. Post
// receives before the peer may send, or use package msg, whose credits
// never let a message find no receive.
func (ep *Endpoint) PostSend(wrContext any, b *bufpool.Buffer, n int, flags ...Flags) error {
	return ep.postOne(Request{Op: OpSend, Context: wrContext, Buffer: b, Length: n}, flags)
}

// PostSendImm sends the first n bytes of b with immediate data.
func (ep *Endpoint) PostSendImm(wrContext any, b *bufpool.Buffer, n int, imm uint32, flags ...Flags) error {
	return ep.postOne(Request{Op: OpSend, Context: wrContext, Buffer: b, Length: n, HasImm: true, Imm: imm}, flags)
}

// PostSendv sends the concatenation of segs (rdma_post_sendv).
func (ep *Endpoint) PostSendv(wrContext any, segs []bufpool.Segment, flags ...Flags) error {
	return ep.postOne(Request{Op: OpSend, Context: wrContext, Segments: segs}, flags)
}

// PostRecv posts b to receive one message of up to b.Len() bytes.
func (ep *Endpoint) PostRecv(wrContext any, b *bufpool.Buffer) error {
	return ep.postOne(Request{Op: OpRecv, Context: wrContext, Buffer: b}, nil)
}

// PostRecvv posts a scatter list for one message (rdma_post_recvv).
func (ep *Endpoint) PostRecvv(wrContext any, segs []bufpool.Segment) error {
	return ep.postOne(Request{Op: OpRecv, Context: wrContext, Segments: segs}, nil)
}

// PostWrite writes the first n bytes of b to the start of remote.
func (ep *Endpoint) PostWrite(wrContext any, b *bufpool.Buffer, n int, remote bufpool.Remote, flags ...Flags) error {
	return ep.postOne(Request{Op: OpWrite, Context: wrContext, Buffer: b, Length: n, Remote: remote}, flags)
}

// PostWriteImm writes like PostWrite and consumes a receive at the peer,
// whose completion has Op OpRecvWriteImm and carries imm.
func (ep *Endpoint) PostWriteImm(wrContext any, b *bufpool.Buffer, n int, remote bufpool.Remote, imm uint32, flags ...Flags) error {
	return ep.postOne(Request{Op: OpWrite, Context: wrContext, Buffer: b, Length: n, Remote: remote, HasImm: true, Imm: imm}, flags)
}

// PostWritev gathers segs into remote (rdma_post_writev).
func (ep *Endpoint) PostWritev(wrContext any, segs []bufpool.Segment, remote bufpool.Remote, flags ...Flags) error {
	return ep.postOne(Request{Op: OpWrite, Context: wrContext, Segments: segs, Remote: remote}, flags)
}

// PostRead reads n bytes from the start of remote into b. On iWARP the
// read's sink must be registered for remote write, as a Region with
// bufpool.RemoteWrite is (its key need never leave this side): a pool's
// buffers are local-only, which soft-iWARP accepts and iWARP NICs may not.
func (ep *Endpoint) PostRead(wrContext any, b *bufpool.Buffer, n int, remote bufpool.Remote, flags ...Flags) error {
	return ep.postOne(Request{Op: OpRead, Context: wrContext, Buffer: b, Length: n, Remote: remote}, flags)
}

// PostReadv scatters remote into segs (rdma_post_readv).
func (ep *Endpoint) PostReadv(wrContext any, segs []bufpool.Segment, remote bufpool.Remote, flags ...Flags) error {
	return ep.postOne(Request{Op: OpRead, Context: wrContext, Segments: segs, Remote: remote}, flags)
}

// PostCompareAndSwap compares the 8-byte word at remote (8-byte aligned)
// with compare and, if equal, stores swap. The word's old value lands in the
// first 8 bytes of b, in host byte order.
func (ep *Endpoint) PostCompareAndSwap(wrContext any, b *bufpool.Buffer, remote bufpool.Remote, compare, swap uint64, flags ...Flags) error {
	return ep.postOne(Request{Op: OpCompareAndSwap, Context: wrContext, Buffer: b, Length: 8, Remote: remote, Compare: compare, Swap: swap}, flags)
}

// PostFetchAndAdd adds add to the 8-byte word at remote (8-byte aligned);
// the old value lands in the first 8 bytes of b, in host byte order.
func (ep *Endpoint) PostFetchAndAdd(wrContext any, b *bufpool.Buffer, remote bufpool.Remote, add uint64, flags ...Flags) error {
	return ep.postOne(Request{Op: OpFetchAndAdd, Context: wrContext, Buffer: b, Length: 8, Remote: remote, Add: add}, flags)
}

func (ep *Endpoint) postOne(r Request, flags []Flags) error {
	if !ep.made() {
		return errNotMade
	}
	for _, f := range flags {
		r.Flags |= f
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.scratch[0] = r
	err := ep.postLocked(ep.scratch)
	ep.scratch[0] = Request{} // drop references
	return err
}

// PostBatch posts all requests, sends and receives, each kind in one call
// into the device (one doorbell). It is all or nothing for what it checks
// first (every field of every request, and free slots): on such an error
// nothing is posted. If the device refuses a request, the error is a
// *PostError saying which, and what was posted.
func (ep *Endpoint) PostBatch(reqs []Request) error {
	if !ep.made() {
		return errNotMade
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.postLocked(reqs)
}

func (ep *Endpoint) postLocked(reqs []Request) error {
	if ep.closing {
		return ep.refusal()
	}
	if err := ep.failed(); err != nil {
		return err
	}
	nsend, nrecv := 0, 0
	sges := ep.sges[:0]
	spans := ep.spans[:0]
	for i := range reqs {
		start := len(sges)
		var err error
		if sges, err = ep.check(&reqs[i], sges); err != nil {
			ep.sges, ep.spans = sges[:0], spans[:0]
			if len(reqs) > 1 {
				return fmt.Errorf("request %d: %w", i, err)
			}
			return err
		}
		spans = append(spans, [2]int{start, len(sges)})
		if reqs[i].Op == OpRecv {
			nrecv++
		} else {
			nsend++
		}
	}
	ep.sges, ep.spans = sges[:0], spans[:0] // keep the grown arrays
	if nsend > len(ep.sends.free) || nrecv > len(ep.recvs.free) {
		return ErrQueueFull
	}
	sendIdx, recvIdx := ep.sendTaken[:0], ep.recvTaken[:0]
	for i := range reqs {
		r := &reqs[i]
		sg := sges[spans[i][0]:spans[i][1]]
		n := r.total()
		if r.Op == OpRecv {
			idx := ep.recvs.take(r, n)
			recvIdx = append(recvIdx, idx)
			ep.recvBatch.Add(&verbs.RecvWR{WRID: recvBit | uint64(idx), SGE: sg})
			continue
		}
		idx, flags := ep.takeSend(r, n)
		sendIdx = append(sendIdx, idx)
		compareAdd := r.Compare
		if r.Op == OpFetchAndAdd {
			compareAdd = r.Add
		}
		ep.sendBatch.Add(&verbs.SendWR{WRID: uint64(idx), Opcode: wrOpcode(r), Flags: flags,
			Imm: r.Imm, RemoteAddr: r.Remote.Addr, RKey: r.Remote.RKey, CompareAdd: compareAdd, Swap: r.Swap, SGE: sg})
	}
	// Receives first: a send in the same batch may be answered at once.
	err := verbs.Post(ep.id, nil, ep.recvBatch, ep.sendBatch)
	if err == nil {
		ep.countPosted(sendIdx, nrecv)
		return nil
	}
	var pe *verbs.PostError
	if !errors.As(err, &pe) {
		return err
	}
	kind := OpSend
	if pe.Recv {
		kind = OpRecv
		ep.countPosted(nil, pe.Index)
		ep.unpost(recvIdx, pe.Index, true)
		ep.unpost(sendIdx, 0, false)
	} else {
		ep.countPosted(sendIdx[:pe.Index], nrecv)
		ep.unpost(sendIdx, pe.Index, false)
	}
	return &PostError{Index: nthOfKind(reqs, kind, pe.Index), Err: pe.Err, queued: pe.Queued}
}

// nthOfKind is the index in reqs of the n-th receive (kind OpRecv) or the
// n-th request of the send queue (any other kind).
func nthOfKind(reqs []Request, kind Op, n int) int {
	for i := range reqs {
		if (reqs[i].Op == OpRecv) == (kind == OpRecv) {
			if n == 0 {
				return i
			}
			n--
		}
	}
	return len(reqs)
}

// check refuses a request before anything is posted, and appends its
// scatter/gather list to sges. ep.mu is held.
func (ep *Endpoint) check(r *Request, sges []verbs.SGE) ([]verbs.SGE, error) {
	if r.Op == OpRecv && ep.srq != nil {
		return sges, fmt.Errorf("%w: this endpoint receives through a shared receive queue: post receives to it", ErrInvalid)
	}
	switch r.Op {
	case OpSend, OpRecv, OpWrite, OpRead, OpCompareAndSwap, OpFetchAndAdd:
	default:
		return sges, fmt.Errorf("%w: %v is not an operation to post", ErrInvalid, r.Op)
	}
	sges, err := ep.memory(r, sges)
	if err != nil {
		return sges, err
	}
	if err := ep.checkFields(r); err != nil {
		return sges, err
	}
	if r.Notify != nil && cap(r.Notify) == 0 {
		return sges, fmt.Errorf("%w: an unbuffered Notify channel (the completion goroutine never waits on it)", ErrInvalid)
	}
	return sges, ep.checkFlags(r)
}

// memory checks a request's local memory and appends it to sges.
func (ep *Endpoint) memory(r *Request, sges []verbs.SGE) ([]verbs.SGE, error) {
	switch {
	case r.Buffer != nil && len(r.Segments) > 0:
		return sges, fmt.Errorf("%w: %v with both a Buffer and Segments", ErrInvalid, r.Op)
	case r.Buffer == nil && len(r.Segments) == 0:
		return sges, fmt.Errorf("%w: %v without a buffer or segments", ErrInvalid, r.Op)
	case r.Buffer == nil && r.Length != 0:
		return sges, fmt.Errorf("%w: %v with Length %d and Segments (their lengths say it)", ErrInvalid, r.Op, r.Length)
	case len(r.Segments) > ep.cfg.MaxSGE:
		return sges, fmt.Errorf("%w: %d segments, the QP takes at most %d (cm.WithMaxSGE)", ErrInvalid, len(r.Segments), ep.cfg.MaxSGE)
	}
	add := func(sge verbs.SGE, d *seam.Domain, err error) error {
		if err != nil {
			return fmt.Errorf("%w: %v: %w", ErrInvalid, r.Op, err)
		}
		if d != ep.pd {
			return fmt.Errorf("%w: %v of a buffer registered in another protection domain (make pools and regions on this endpoint's PD, or share one with cm.WithPD)", ErrInvalid, r.Op)
		}
		if sge.Len > 0 {
			sges = append(sges, sge)
		}
		return nil
	}
	if r.Buffer != nil {
		n := r.Length
		if r.Op == OpRecv && n == 0 {
			n = r.Buffer.Len()
		}
		if n < 0 || n > r.Buffer.Len() {
			return sges, fmt.Errorf("%w: %v of %d bytes from a %d-byte buffer", ErrInvalid, r.Op, n, r.Buffer.Len())
		}
		return sges, add(seam.BufferSGE(r.Buffer, 0, n))
	}
	total := 0
	for i := range r.Segments {
		total += r.Segments[i].Len()
		if err := add(seam.SegmentSGE(&r.Segments[i])); err != nil {
			return sges, err
		}
	}
	if total > maxMessage {
		return sges, fmt.Errorf("%w: %v of %d bytes, at most %d in one work request", ErrInvalid, r.Op, total, maxMessage)
	}
	return sges, nil
}

// maxMessage is the most one work request moves (the InfiniBand limit).
const maxMessage = 1 << 31

// checkFields refuses remote memory, immediate data and atomic operands
// where the operation has no use for them.
func (ep *Endpoint) checkFields(r *Request) error {
	n := r.total()
	switch r.Op {
	case OpSend, OpRecv:
		if r.Remote != (bufpool.Remote{}) {
			return fmt.Errorf("%w: a %v has no remote memory (Remote is set)", ErrInvalid, r.Op)
		}
	case OpRead, OpWrite:
		if uint64(n) > r.Remote.Len {
			return fmt.Errorf("%w: %v of %d bytes into a %d-byte remote region", ErrInvalid, r.Op, n, r.Remote.Len)
		}
		if r.Op == OpRead && len(r.Segments) > max(ep.dev.MaxSGERd, 1) {
			return fmt.Errorf("%w: an RDMA READ into %d segments; the device's READ sink takes %d (max_sge_rd)", ErrNotSupported, len(r.Segments), ep.dev.MaxSGERd)
		}
	case OpCompareAndSwap, OpFetchAndAdd:
		if n != 8 || r.Remote.Addr%8 != 0 || r.Remote.Len < 8 {
			return fmt.Errorf("%w: atomics need an 8-byte local buffer and an 8-byte aligned remote word (addr %#x, len %d)", ErrInvalid, r.Remote.Addr, r.Remote.Len)
		}
	}
	if (r.HasImm || r.Imm != 0) && r.Op != OpSend && r.Op != OpWrite {
		return fmt.Errorf("%w: immediate data on a %v", ErrInvalid, r.Op)
	}
	if r.Imm != 0 && !r.HasImm {
		return fmt.Errorf("%w: Imm %d without HasImm (set HasImm to send it)", ErrInvalid, r.Imm)
	}
	if r.Op != OpCompareAndSwap && (r.Compare != 0 || r.Swap != 0) {
		return fmt.Errorf("%w: Compare and Swap are compare-and-swap's, not a %v's", ErrInvalid, r.Op)
	}
	if r.Op != OpFetchAndAdd && r.Add != 0 {
		return fmt.Errorf("%w: Add is fetch-and-add's, not a %v's", ErrInvalid, r.Op)
	}
	// What the device lacks is checked last: a malformed request is
	// invalid on every device.
	if (r.Op == OpCompareAndSwap || r.Op == OpFetchAndAdd) && !ep.dev.Atomics {
		return ErrNoAtomics
	}
	if r.HasImm && ep.dev.IWARP {
		return fmt.Errorf("%w: immediate data (iWARP has none)", ErrNotSupported)
	}
	return nil
}

// checkFlags refuses flags that do not fit the operation.
func (ep *Endpoint) checkFlags(r *Request) error {
	f := r.Flags
	sendOrWrite := r.Op == OpSend || r.Op == OpWrite
	switch {
	case f&^allFlags != 0:
		return fmt.Errorf("%w: unknown flags %v", ErrInvalid, f&^allFlags)
	case r.Op == OpRecv && f != 0:
		// A receive always completes: its Completion carries the message.
		return fmt.Errorf("%w: flags %v on a receive (they apply to the send queue)", ErrInvalid, f)
	case f&Inline != 0 && f&NoInline != 0:
		return fmt.Errorf("%w: both Inline and NoInline", ErrInvalid)
	case f&Inline != 0 && (!sendOrWrite || r.total() > ep.caps.MaxInline):
		return fmt.Errorf("%w: inline %v of %d bytes, the QP inlines at most %d bytes of sends and writes", ErrInvalid, r.Op, r.total(), ep.caps.MaxInline)
	case f&Silent != 0 && !sendOrWrite:
		return fmt.Errorf("%w: Silent on a %v, whose completion says when its result is there", ErrInvalid, r.Op)
	case f&Solicited != 0 && r.Op != OpSend && !(r.Op == OpWrite && r.HasImm):
		return fmt.Errorf("%w: Solicited on a %v (it applies to sends and writes with immediate data)", ErrInvalid, r.Op)
	}
	return nil
}

// total is the request's length in bytes; the request is checked.
func (r *Request) total() int {
	if r.Buffer != nil {
		if r.Op == OpRecv && r.Length == 0 {
			return r.Buffer.Len()
		}
		return r.Length
	}
	n := 0
	for i := range r.Segments {
		n += r.Segments[i].Len()
	}
	return n
}

func wrOpcode(r *Request) verbs.WROpcode {
	switch r.Op {
	case OpSend:
		if r.HasImm {
			return verbs.WRSendWithImm
		}
		return verbs.WRSend
	case OpWrite:
		if r.HasImm {
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

func (t *slotTable) take(r *Request, n int) uint32 {
	idx := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	t.slots[idx] = slot{ctx: r.Context, buf: r.Buffer, op: r.Op, length: n, used: true, notify: r.Notify}
	if r.Buffer != nil {
		seam.Posted(r.Buffer, 1)
	}
	return idx
}

func (t *slotTable) release(idx uint32) slot {
	s := t.slots[idx]
	t.slots[idx] = slot{}
	t.free = append(t.free, idx)
	if s.buf != nil {
		seam.Posted(s.buf, -1)
	}
	return s
}

// takeSend takes a send slot and decides the flags: inline when it fits,
// and signaled unless asked otherwise, with every SignalEvery-th unsignaled
// send, and any send that leaves few slots free, forced signaled so that
// the unsignaled ones before it come back.
func (ep *Endpoint) takeSend(r *Request, n int) (uint32, int) {
	idx := ep.sends.take(r, n)
	ep.sendFIFO.push(idx)
	flags := 0
	if (r.Op == OpSend || r.Op == OpWrite) && n > 0 &&
		(r.Flags&Inline != 0 || r.Flags&NoInline == 0 && n <= ep.caps.MaxInline) {
		flags |= verbs.SendInline
	}
	if r.Flags&Fence != 0 {
		flags |= verbs.SendFence
	}
	if r.Flags&Solicited != 0 {
		flags |= verbs.SendSolicited
	}
	signaled := r.Flags&(Unsignaled|Silent) == 0 || ep.unsigRun+1 >= ep.cfg.SignalEvery || len(ep.sends.free) < ep.cfg.SendDepth/4 ||
		completesOnItsOwn(r.Op)
	if signaled {
		flags |= verbs.SendSignaled
		ep.unsigRun = 0
	} else {
		ep.unsigRun++
	}
	ep.sends.slots[idx].signaled = signaled
	ep.sends.slots[idx].silent = r.Flags&Silent != 0
	return idx, flags
}

// completesOnItsOwn says whether a request of op must be posted signaled
// whatever its flags, because a later request's completion would not mean
// that it is done: a READ or an atomic finishes when its response
// arrives, which siw reports after the sends posted behind it.
func completesOnItsOwn(op Op) bool {
	return op != OpSend && op != OpWrite
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
