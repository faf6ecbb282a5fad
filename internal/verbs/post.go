package verbs

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// SGE is one scatter/gather entry: registered memory by address, length and
// local key.
type SGE struct {
	Addr uint64
	Len  uint32
	LKey uint32
}

// SendWR is one send-queue work request.
type SendWR struct {
	WRID       uint64
	Opcode     WROpcode
	Flags      int
	Imm        uint32 // host order; for SEND_WITH_IMM and RDMA_WRITE_WITH_IMM
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // atomics: compare (CAS) or add (FAA)
	Swap       uint64 // atomics: CAS
	SGE        []SGE
	// Unreliable datagram sends only: where the datagram goes.
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is one receive work request.
type RecvWR struct {
	WRID uint64
	SGE  []SGE
}

// ErrBatchFull is returned when a batch has no room for another request.
var ErrBatchFull = errors.New("verbs: work request batch is full")

// PostError says which work request of a batch the device refused; those
// before it were posted and will complete, it and those after were not.
// When Recv is true the receives failed and no send was posted. When
// Queued is true no request was refused: every one was queued (Index is
// the batch's length), but the device refused to start them (a software
// device's doorbell, refused while the queue pair cannot send): the device
// holds them, to flush when the queue pair fails.
type PostError struct {
	Recv   bool
	Index  int
	Queued bool
	Err    error
}

// Error names the refused request.
func (e *PostError) Error() string {
	kind := "send"
	if e.Recv {
		kind = "receive"
	}
	if e.Queued {
		return fmt.Sprintf("%s work requests 0-%d queued, but the device refused to start them: %v", kind, e.Index-1, e.Err)
	}
	return fmt.Sprintf("%s work request %d: %v", kind, e.Index, e.Err)
}

// Unwrap is the device's errno.
func (e *PostError) Unwrap() error { return e.Err }

// batch is the C memory of a batch of work requests (struct go_batch and
// its arrays, in one block) and how full it is. The block is made at the
// first request and grown as requests come, up to the batch's limits: it
// holds as many as were ever posted at once, not the queue's depth, so an
// endpoint that posts little costs little to set up. It is not safe for
// concurrent use.
type batch struct {
	c                  *C.struct_go_batch // nil until the first request
	wrSize, linkedSize C.size_t
	maxWR, maxSGE      int // the limits
	capWR, capSGE      int // the room in c
	n, nsge            int
}

// minBatchRoom is the room a batch starts with: a handful of requests
// cost one small block, and growth doubles from there.
const minBatchRoom = 8

func newBatch(maxWR, maxSGE int, wrSize, linkedSize C.size_t) batch {
	return batch{wrSize: wrSize, linkedSize: linkedSize, maxWR: maxWR, maxSGE: maxSGE}
}

// add reserves room for one request with sges and copies them; it returns
// the request's index and its first entry's.
func (b *batch) add(sges []SGE) (wr, first int, err error) {
	if b.n == b.maxWR || b.nsge+len(sges) > b.maxSGE {
		return 0, 0, ErrBatchFull
	}
	if b.n == b.capWR || b.nsge+len(sges) > b.capSGE {
		b.grow(b.n+1, b.nsge+len(sges))
	}
	dst := unsafe.Slice(b.c.sge, b.capSGE)
	for i, s := range sges {
		dst[b.nsge+i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Len), lkey: C.uint32_t(s.LKey)}
	}
	wr, first = b.n, b.nsge
	b.n++
	b.nsge += len(sges)
	return wr, first, nil
}

// grow moves the batch to a block with room for at least wrs requests and
// sges entries (at most the limits), keeping the requests added so far.
func (b *batch) grow(wrs, sges int) {
	capWR := min(b.maxWR, max(wrs, 2*b.capWR, minBatchRoom))
	capSGE := min(b.maxSGE, max(sges, 2*b.capSGE, capWR))
	// Every part's size is a multiple of 8, so each array is aligned.
	wrBytes, sgeBytes := C.size_t(capWR)*b.wrSize, C.size_t(capSGE)*C.sizeof_struct_ibv_sge
	p := C.malloc(C.sizeof_struct_go_batch + wrBytes + sgeBytes + C.size_t(capWR)*b.linkedSize)
	c := (*C.struct_go_batch)(p)
	*c = C.struct_go_batch{}
	c.wrs = unsafe.Add(p, C.sizeof_struct_go_batch)
	c.sge = (*C.struct_ibv_sge)(unsafe.Add(c.wrs, wrBytes))
	c.scratch = unsafe.Add(unsafe.Pointer(c.sge), sgeBytes)
	if b.c != nil {
		C.memcpy(c.wrs, b.c.wrs, C.size_t(b.n)*b.wrSize)
		C.memcpy(unsafe.Pointer(c.sge), unsafe.Pointer(b.c.sge), C.size_t(b.nsge)*C.sizeof_struct_ibv_sge)
		C.free(unsafe.Pointer(b.c))
	}
	b.c, b.capWR, b.capSGE = c, capWR, capSGE
}

// seal hands the count to C and empties the batch for the next one.
func (b *batch) seal() {
	if b.c != nil {
		b.c.n = C.int(b.n)
	}
	b.n, b.nsge = 0, 0
}

// Free releases the batch's C memory.
func (b *batch) Free() {
	C.free(unsafe.Pointer(b.c))
	b.c, b.capWR, b.capSGE = nil, 0, 0
}

// SendBatch is a reusable C-memory array of send work requests.
type SendBatch struct{ batch }

// NewSendBatch allocates room for maxWR requests with maxSGE entries in all.
func NewSendBatch(maxWR, maxSGE int) *SendBatch {
	return &SendBatch{newBatch(maxWR, maxSGE, C.sizeof_struct_go_send_wr, C.sizeof_struct_ibv_send_wr)}
}

// Add appends a request.
func (b *SendBatch) Add(wr *SendWR) error {
	i, first, err := b.add(wr.SGE)
	if err != nil {
		return err
	}
	unsafe.Slice((*C.struct_go_send_wr)(b.c.wrs), b.capWR)[i] = C.struct_go_send_wr{
		wr_id: C.uint64_t(wr.WRID), remote_addr: C.uint64_t(wr.RemoteAddr),
		compare_add: C.uint64_t(wr.CompareAdd), swap: C.uint64_t(wr.Swap),
		rkey: C.uint32_t(wr.RKey), opcode: C.uint32_t(wr.Opcode), send_flags: C.uint32_t(wr.Flags),
		imm: C.uint32_t(wr.Imm), sge_first: C.uint32_t(first), num_sge: C.uint32_t(len(wr.SGE)),
		remote_qpn: C.uint32_t(wr.RemoteQPN), remote_qkey: C.uint32_t(wr.RemoteQKey),
	}
	if wr.AH != nil {
		unsafe.Slice((*C.struct_go_send_wr)(b.c.wrs), b.capWR)[i].ah = cptr(wr.AH.p)
	}
	return nil
}

// RecvBatch is a reusable C-memory array of receive work requests.
type RecvBatch struct{ batch }

// NewRecvBatch allocates room for maxWR requests with maxSGE entries in all.
func NewRecvBatch(maxWR, maxSGE int) *RecvBatch {
	return &RecvBatch{newBatch(maxWR, maxSGE, C.sizeof_struct_go_recv_wr, C.sizeof_struct_ibv_recv_wr)}
}

// Add appends a request.
func (b *RecvBatch) Add(wr *RecvWR) error {
	i, first, err := b.add(wr.SGE)
	if err != nil {
		return err
	}
	unsafe.Slice((*C.struct_go_recv_wr)(b.c.wrs), b.capWR)[i] = C.struct_go_recv_wr{wr_id: C.uint64_t(wr.WRID),
		sge_first: C.uint32_t(first), num_sge: C.uint32_t(len(wr.SGE))}
	return nil
}

// Post posts recv's requests (to srq when it is not nil, else to id's QP),
// then send's, in one call into C, and empties both. Either may be nil.
// On failure the error is a *PostError naming the first request not
// posted; after failed receives no send was posted.
func Post(id *CMID, srq *SRQ, recv *RecvBatch, send *SendBatch) error {
	var qp, srqp, rc, sc C.uintptr_t
	if id != nil {
		qp = cptr(id.p.qp)
	}
	if srq != nil {
		srqp = cptr(srq.p)
	}
	// A batch that never held a request has no C memory, and nothing to post.
	var rb, sb *C.struct_go_batch
	if recv != nil {
		recv.seal()
		rb, rc = recv.c, cptr(recv.c)
	}
	if send != nil {
		send.seal()
		sb, sc = send.c, cptr(send.c)
	}
	if f, ok := injectedRefusal(batchLen(rb), batchLen(sb)); ok {
		return postRefusing(qp, srqp, rb, sb, f)
	}
	ret := C.go_post(qp, srqp, rc, sc)
	if ret == 0 {
		return nil
	}
	if sb == nil || rb != nil && rb.bad >= 0 {
		return &PostError{Recv: true, Index: int(rb.bad), Err: retErrno("ibv_post_recv", ret)}
	}
	return &PostError{Index: int(sb.bad), Queued: int(sb.bad) == int(sb.n), Err: retErrno("ibv_post_send", ret)}
}

// batchLen is how many requests a sealed batch holds (0 for none).
func batchLen(b *C.struct_go_batch) int {
	if b == nil {
		return 0
	}
	return int(b.n)
}

// refusal is a request the device is made to refuse (FailNextPost, in
// builds with the rdmacm_faultinject tag): the receive or the send request
// of that index in the next batch that holds one.
type refusal struct {
	recv  bool
	index int
	err   error
}

// postRefusing posts what a device that refuses request f takes of the
// batch, as ibv_post_recv and ibv_post_send do: the receives before a
// refused receive, and then no send; every receive and the sends before a
// refused send. It fails as Post does when the device refuses that
// request, or with the real error if the device refuses the rest.
func postRefusing(qp, srqp C.uintptr_t, rb, sb *C.struct_go_batch, f refusal) error {
	if f.recv {
		rb.n, sb = C.int(f.index), nil
	} else {
		sb.n = C.int(f.index)
	}
	if ret := C.go_post(qp, srqp, cptr(rb), cptr(sb)); ret != 0 {
		return fmt.Errorf("verbs: posting the requests before an injected refusal: %w", retErrno("ibv_post", ret))
	}
	return &PostError{Recv: f.recv, Index: f.index, Err: f.err}
}

// cptr passes a pointer to C memory as an integer (see shim.h: it spares
// the hot calls cgo's per-argument pointer checks). Never pass Go memory.
func cptr[T any](p *T) C.uintptr_t { return C.uintptr_t(uintptr(unsafe.Pointer(p))) }

// request reads back request i of the batch being filled: its id and its
// entries' addresses. The tests use it to check what C will be handed.
func (b *SendBatch) request(i int) (id uint64, addrs []uint64) {
	wr := unsafe.Slice((*C.struct_go_send_wr)(b.c.wrs), b.capWR)[i]
	for _, s := range unsafe.Slice(b.c.sge, b.capSGE)[wr.sge_first : wr.sge_first+wr.num_sge] {
		addrs = append(addrs, uint64(s.addr))
	}
	return uint64(wr.wr_id), addrs
}
