package verbs

/*
#include <stdlib.h>
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
type PostError struct {
	Index int
	Err   error
}

// Error names the refused request.
func (e *PostError) Error() string { return fmt.Sprintf("work request %d: %v", e.Index, e.Err) }

// Unwrap is the device's errno.
func (e *PostError) Unwrap() error { return e.Err }

// SendBatch is a reusable C-memory array of send work requests, posted with
// one ibv_post_send. It is not safe for concurrent use.
type SendBatch struct {
	wrs     *C.struct_go_send_wr
	sges    *C.struct_ibv_sge
	scratch *C.struct_ibv_send_wr
	bad     *C.int
	maxWR   int
	maxSGE  int
	n, nsge int
}

// NewSendBatch allocates room for maxWR requests with maxSGE entries in all.
func NewSendBatch(maxWR, maxSGE int) *SendBatch {
	return &SendBatch{
		wrs:     (*C.struct_go_send_wr)(C.calloc(C.size_t(maxWR), C.sizeof_struct_go_send_wr)),
		sges:    (*C.struct_ibv_sge)(C.calloc(C.size_t(maxSGE), C.sizeof_struct_ibv_sge)),
		scratch: (*C.struct_ibv_send_wr)(C.calloc(C.size_t(maxWR), C.sizeof_struct_ibv_send_wr)),
		bad:     (*C.int)(C.calloc(1, C.sizeof_int)),
		maxWR:   maxWR, maxSGE: maxSGE,
	}
}

// Len is the number of requests added since the last Reset.
func (b *SendBatch) Len() int { return b.n }

// Add appends a request.
func (b *SendBatch) Add(wr *SendWR) error {
	if b.n == b.maxWR || b.nsge+len(wr.SGE) > b.maxSGE {
		return ErrBatchFull
	}
	sges := unsafe.Slice(b.sges, b.maxSGE)
	for i, s := range wr.SGE {
		sges[b.nsge+i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Len), lkey: C.uint32_t(s.LKey)}
	}
	w := &unsafe.Slice(b.wrs, b.maxWR)[b.n]
	*w = C.struct_go_send_wr{
		wr_id: C.uint64_t(wr.WRID), remote_addr: C.uint64_t(wr.RemoteAddr),
		compare_add: C.uint64_t(wr.CompareAdd), swap: C.uint64_t(wr.Swap),
		rkey: C.uint32_t(wr.RKey), opcode: C.uint32_t(wr.Opcode), send_flags: C.uint32_t(wr.Flags),
		imm: C.uint32_t(wr.Imm), sge_first: C.uint32_t(b.nsge), num_sge: C.uint32_t(len(wr.SGE)),
	}
	b.n++
	b.nsge += len(wr.SGE)
	return nil
}

// Reset empties the batch.
func (b *SendBatch) Reset() { b.n, b.nsge = 0, 0 }

// Post posts the batch on the id's QP in one ibv_post_send and empties it.
// On failure the error is a *PostError naming the first request not posted.
func (b *SendBatch) Post(id *CMID) error {
	n := b.n
	b.Reset()
	if n == 0 {
		return nil
	}
	if ret := C.go_post_send(cptr(id.p.qp), cptr(b.wrs), C.int(n), cptr(b.sges), cptr(b.scratch), cptr(b.bad)); ret != 0 {
		return &PostError{Index: int(*b.bad), Err: retErrno("ibv_post_send", ret)}
	}
	return nil
}

// Free releases the batch's C memory.
func (b *SendBatch) Free() {
	C.free(unsafe.Pointer(b.wrs))
	C.free(unsafe.Pointer(b.sges))
	C.free(unsafe.Pointer(b.scratch))
	C.free(unsafe.Pointer(b.bad))
}

// RecvBatch is a reusable C-memory array of receive work requests.
type RecvBatch struct {
	wrs     *C.struct_go_recv_wr
	sges    *C.struct_ibv_sge
	scratch *C.struct_ibv_recv_wr
	bad     *C.int
	maxWR   int
	maxSGE  int
	n, nsge int
}

// NewRecvBatch allocates room for maxWR requests with maxSGE entries in all.
func NewRecvBatch(maxWR, maxSGE int) *RecvBatch {
	return &RecvBatch{
		wrs:     (*C.struct_go_recv_wr)(C.calloc(C.size_t(maxWR), C.sizeof_struct_go_recv_wr)),
		sges:    (*C.struct_ibv_sge)(C.calloc(C.size_t(maxSGE), C.sizeof_struct_ibv_sge)),
		scratch: (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(maxWR), C.sizeof_struct_ibv_recv_wr)),
		bad:     (*C.int)(C.calloc(1, C.sizeof_int)),
		maxWR:   maxWR, maxSGE: maxSGE,
	}
}

// Len is the number of requests added since the last Reset.
func (b *RecvBatch) Len() int { return b.n }

// Add appends a request.
func (b *RecvBatch) Add(wr *RecvWR) error {
	if b.n == b.maxWR || b.nsge+len(wr.SGE) > b.maxSGE {
		return ErrBatchFull
	}
	sges := unsafe.Slice(b.sges, b.maxSGE)
	for i, s := range wr.SGE {
		sges[b.nsge+i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Len), lkey: C.uint32_t(s.LKey)}
	}
	unsafe.Slice(b.wrs, b.maxWR)[b.n] = C.struct_go_recv_wr{wr_id: C.uint64_t(wr.WRID),
		sge_first: C.uint32_t(b.nsge), num_sge: C.uint32_t(len(wr.SGE))}
	b.n++
	b.nsge += len(wr.SGE)
	return nil
}

// Reset empties the batch.
func (b *RecvBatch) Reset() { b.n, b.nsge = 0, 0 }

// Post posts the batch on the id's QP, or on srq when it is not nil.
func (b *RecvBatch) Post(id *CMID, srq *SRQ) error {
	n := b.n
	b.Reset()
	if n == 0 {
		return nil
	}
	var qp *C.struct_ibv_qp
	var srqp *C.struct_ibv_srq
	if srq != nil {
		srqp = srq.p
	} else {
		qp = id.p.qp
	}
	if ret := C.go_post_recv(cptr(qp), cptr(srqp), cptr(b.wrs), C.int(n), cptr(b.sges), cptr(b.scratch), cptr(b.bad)); ret != 0 {
		return &PostError{Index: int(*b.bad), Err: retErrno("ibv_post_recv", ret)}
	}
	return nil
}

// cptr passes a pointer to C memory as an integer (see shim.h: it spares
// the hot calls cgo's per-argument pointer checks). Never pass Go memory.
func cptr[T any](p *T) C.uintptr_t { return C.uintptr_t(uintptr(unsafe.Pointer(p))) }

// Free releases the batch's C memory.
func (b *RecvBatch) Free() {
	C.free(unsafe.Pointer(b.wrs))
	C.free(unsafe.Pointer(b.sges))
	C.free(unsafe.Pointer(b.scratch))
	C.free(unsafe.Pointer(b.bad))
}
