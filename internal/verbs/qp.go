package verbs

/*
#include <errno.h>
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"
)

// Context is an opened RDMA device (ibv_context).
type Context struct{ p *C.struct_ibv_context }

// DeviceAttr is the subset of ibv_device_attr this library plans with.
type DeviceAttr struct {
	MaxQPWR         int // work requests per queue
	MaxSGE          int // scatter/gather entries per work request
	MaxCQE          int // entries per completion queue
	MaxMRSize       uint64
	MaxQPRdAtom     int // outstanding RDMA reads/atomics a QP can answer
	MaxQPInitRdAtom int // outstanding RDMA reads/atomics a QP can issue
	MaxSRQWR        int
	MaxSGERd        int    // scatter/gather entries of an RDMA READ's local sink
	Atomics         bool   // atomic_cap is not IBV_ATOMIC_NONE
	IWARP           bool   // the transport is iWARP: no atomics, no immediate data, no RNR retry
	VendorID        uint32 // soft-iWARP's is siwVendorID
}

// deviceAttrs caches QueryDevice's answers by context. The contexts are
// librdmacm's, open while the device is, and a device's attributes do not
// change while it is open; the entry also names the device, so that a
// context freed and another allocated at its address is not mistaken
// for it.
var deviceAttrs sync.Map // Context.Key() -> cachedAttr

type cachedAttr struct {
	device *C.struct_ibv_device
	attr   DeviceAttr
}

// QueryDevice returns the device's attributes, read once per context
// (every connection asks for them).
func (c *Context) QueryDevice() (DeviceAttr, error) {
	if v, ok := deviceAttrs.Load(c.Key()); ok && v.(cachedAttr).device == c.p.device {
		return v.(cachedAttr).attr, nil
	}
	attr, err := c.queryDevice()
	if err == nil {
		deviceAttrs.Store(c.Key(), cachedAttr{device: c.p.device, attr: attr})
	}
	return attr, err
}

func (c *Context) queryDevice() (DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if ret := C.ibv_query_device(c.p, &a); ret != 0 {
		return DeviceAttr{}, retErrno("ibv_query_device", ret)
	}
	return DeviceAttr{
		MaxQPWR: int(a.max_qp_wr), MaxSGE: int(a.max_sge), MaxCQE: int(a.max_cqe),
		MaxMRSize: uint64(a.max_mr_size), MaxQPRdAtom: int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom), MaxSRQWR: int(a.max_srq_wr),
		MaxSGERd: int(a.max_sge_rd), Atomics: a.atomic_cap != C.IBV_ATOMIC_NONE,
		IWARP:    c.p.device.transport_type == C.IBV_TRANSPORT_IWARP,
		VendorID: uint32(a.vendor_id),
	}, nil
}

// Key identifies the device context (its C address).
func (c *Context) Key() uintptr { return uintptr(unsafe.Pointer(c.p)) }

// PD is a protection domain.
type PD struct{ p *C.struct_ibv_pd }

// AllocPD allocates a protection domain on the device.
func (c *Context) AllocPD() (*PD, error) {
	if err := injectedCreateFault(PDs); err != nil {
		return nil, callError("ibv_alloc_pd", err)
	}
	p, err := C.ibv_alloc_pd(c.p)
	if p == nil {
		return nil, callError("ibv_alloc_pd", err)
	}
	return &PD{p: p}, nil
}

// Dealloc frees the PD; nothing may still use it (QPs, MRs, SRQs).
func (pd *PD) Dealloc() error {
	if ret := C.ibv_dealloc_pd(pd.p); ret != 0 {
		return retErrno("ibv_dealloc_pd", ret)
	}
	return nil
}

// MR is a registered memory region.
type MR struct{ p *C.struct_ibv_mr }

// RegMR registers [addr, addr+length) with the given access flags. The memory
// must not be Go heap memory (the device keeps using it after this returns).
func (pd *PD) RegMR(addr unsafe.Pointer, length int, access int) (*MR, error) {
	if err := injectedCreateFault(MRs); err != nil {
		return nil, callError(fmt.Sprintf("ibv_reg_mr(%d bytes, access %#x)", length, access), err)
	}
	p, err := C.ibv_reg_mr(pd.p, addr, C.size_t(length), C.int(access))
	if p == nil {
		return nil, callError(fmt.Sprintf("ibv_reg_mr(%d bytes, access %#x)", length, access), err)
	}
	return &MR{p: p}, nil
}

// RegMsgs registers memory for sends and receives only: local access, as
// rdma_reg_msgs(3) does. The peer can never read or write it.
func (pd *PD) RegMsgs(addr unsafe.Pointer, length int) (*MR, error) {
	return pd.RegMR(addr, length, AccessLocalWrite)
}

// RegRead registers memory the peer may RDMA READ, as rdma_reg_read(3).
func (pd *PD) RegRead(addr unsafe.Pointer, length int) (*MR, error) {
	return pd.RegMR(addr, length, AccessLocalWrite|AccessRemoteRead)
}

// RegWrite registers memory the peer may RDMA WRITE, as rdma_reg_write(3).
func (pd *PD) RegWrite(addr unsafe.Pointer, length int) (*MR, error) {
	return pd.RegMR(addr, length, AccessLocalWrite|AccessRemoteWrite)
}

// LKey, RKey, Addr and Len describe the region.
func (mr *MR) LKey() uint32 { return uint32(mr.p.lkey) }

// RKey is the key the peer names the region with.
func (mr *MR) RKey() uint32 { return uint32(mr.p.rkey) }

// Addr is the region's start address.
func (mr *MR) Addr() uint64 { return uint64(uintptr(mr.p.addr)) }

// Len is the region's length in bytes.
func (mr *MR) Len() int { return int(mr.p.length) }

// Dereg deregisters the region (rdma_dereg_mr); its rkey stops working.
func (mr *MR) Dereg() error {
	if ret := C.ibv_dereg_mr(mr.p); ret != 0 {
		return retErrno("ibv_dereg_mr", ret)
	}
	return nil
}

// CompChannel is a completion channel with a non-blocking fd.
type CompChannel struct{ p *C.struct_ibv_comp_channel }

// NewCompChannel creates a completion channel on the device.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	if err := injectedCreateFault(CompChannels); err != nil {
		return nil, callError("ibv_create_comp_channel", err)
	}
	p, err := C.ibv_create_comp_channel(c.p)
	if p == nil {
		return nil, callError("ibv_create_comp_channel", err)
	}
	if err := setNonblock(p.fd); err != nil {
		C.ibv_destroy_comp_channel(p)
		return nil, callError("fcntl(O_NONBLOCK) on the completion channel", err)
	}
	return &CompChannel{p: p}, nil
}

// Fd is readable when a CQ on the channel has an event.
func (ch *CompChannel) Fd() int { return int(ch.p.fd) }

// GetEvent takes one CQ event (EAGAIN when none); it must be acked with
// CQ.AckEvents before the CQ is destroyed.
func (ch *CompChannel) GetEvent() error {
	if err := ch.injectedFault(); err != nil {
		return err
	}
	if ret, err := C.go_get_cq_event(ch.p); ret != 0 {
		if err == syscall.EAGAIN {
			return syscall.EAGAIN
		}
		return callError("ibv_get_cq_event", err)
	}
	return nil
}

// Destroy destroys the channel; its CQs must be destroyed first.
func (ch *CompChannel) Destroy() error {
	if ret := C.ibv_destroy_comp_channel(ch.p); ret != 0 {
		return retErrno("ibv_destroy_comp_channel", ret)
	}
	return nil
}

// CQ is a completion queue.
type CQ struct {
	p   *C.struct_ibv_cq
	wcs *C.struct_go_wc // reused poll array, C memory
	n   int
}

// NewCQ creates a CQ with at least cqe entries, signalling ch (may be nil
// for a CQ that is only busy-polled). pollBatch is how many completions one
// Poll returns at most.
func (c *Context) NewCQ(cqe int, ch *CompChannel, pollBatch int) (*CQ, error) {
	_ = c.GuardSiwKeys() // best effort: without a guard, queues meet siw's refusals as before
	if err := injectedCreateFault(CQs); err != nil {
		return nil, callError(fmt.Sprintf("ibv_create_cq(%d entries)", cqe), err)
	}
	var chp *C.struct_ibv_comp_channel
	if ch != nil {
		chp = ch.p
	}
	size, shrunk := injectedCQSize(cqe)
	p, err := C.ibv_create_cq(c.p, C.int(size), nil, chp, 0)
	if p == nil {
		return nil, callError(fmt.Sprintf("ibv_create_cq(%d entries)", cqe), err)
	}
	wcs := (*C.struct_go_wc)(C.calloc(C.size_t(pollBatch), C.sizeof_struct_go_wc))
	cq := &CQ{p: p, wcs: wcs, n: pollBatch}
	if shrunk {
		cq.markShrunk()
	}
	return cq, nil
}

// ReqNotify arms the CQ: the next completion (or next solicited one) raises
// an event on its channel.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if err := injectedArmFault(); err != nil {
		return err
	}
	s := 0
	if solicitedOnly {
		s = 1
	}
	return retErrno("ibv_req_notify_cq", C.go_req_notify_cq(cq.p, C.int(s)))
}

// AckEvents acks n events taken with CompChannel.GetEvent.
func (cq *CQ) AckEvents(n int) { C.ibv_ack_cq_events(cq.p, C.uint(n)) }

// WC is one work completion.
type WC struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32 // host byte order; valid when Flags&WCWithImm
	Flags     uint32
	QPNum     uint32
	// Unreliable datagram receives: who sent it (see SenderOf).
	SrcQP        uint32
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
}

// Poll polls up to the CQ's batch size into its reused C array and returns
// how many completions it holds; read them with At. No allocation.
func (cq *CQ) Poll() (int, error) { return cq.PollRetry(0) }

// PollRetry is Poll for a spinning caller: while the CQ is empty, it polls
// up to retries more times in C before it returns 0. One call into C costs
// more than a poll (under emulation, several times more), so a caller that
// spins anyway finds a completion sooner after it arrives this way.
func (cq *CQ) PollRetry(retries int) (int, error) {
	if n, ok := cq.stashedPoll(); ok {
		return n, nil
	}
	n := C.go_poll_cq(cptr(cq.p), C.int(cq.n), cptr(cq.wcs), C.int(retries))
	if n < 0 {
		return 0, retErrno("ibv_poll_cq", n)
	}
	return cq.injectedFault(int(n))
}

// Batch is the most completions one Poll returns; a Poll that returns
// fewer found the CQ empty after them.
func (cq *CQ) Batch() int { return cq.n }

// At returns completion i of the last Poll.
func (cq *CQ) At(i int) WC {
	w := (*[1 << 20]C.struct_go_wc)(unsafe.Pointer(cq.wcs))[i]
	return WC{WRID: uint64(w.wr_id), Status: WCStatus(w.status), Opcode: WCOpcode(w.opcode),
		VendorErr: uint32(w.vendor_err), ByteLen: uint32(w.byte_len), Imm: uint32(w.imm),
		Flags: uint32(w.wc_flags), QPNum: uint32(w.qp_num), SrcQP: uint32(w.src_qp),
		SLID: uint16(w.slid), SL: uint8(w.sl), DLIDPathBits: uint8(w.dlid_path_bits)}
}

// Destroy destroys the CQ; its QPs must be destroyed and its events acked.
func (cq *CQ) Destroy() error {
	if ret := C.ibv_destroy_cq(cq.p); ret != 0 {
		return retErrno("ibv_destroy_cq", ret)
	}
	cq.forgetStash()
	C.free(unsafe.Pointer(cq.wcs))
	return nil
}

// SRQ is a shared receive queue.
type SRQ struct{ p *C.struct_ibv_srq }

// NewSRQ creates a shared receive queue on the protection domain.
func (pd *PD) NewSRQ(maxWR, maxSGE int) (*SRQ, error) {
	_ = (&Context{p: pd.p.context}).GuardSiwKeys() // as NewCQ does
	if err := injectedCreateFault(SRQs); err != nil {
		return nil, callError("ibv_create_srq", err)
	}
	var attr C.struct_ibv_srq_init_attr
	attr.attr.max_wr = C.uint32_t(maxWR)
	attr.attr.max_sge = C.uint32_t(maxSGE)
	p, err := C.ibv_create_srq(pd.p, &attr)
	if p == nil {
		return nil, callError("ibv_create_srq", err)
	}
	return &SRQ{p: p}, nil
}

// Destroy destroys the SRQ; the QPs using it must be destroyed first.
func (srq *SRQ) Destroy() error {
	if ret := C.ibv_destroy_srq(srq.p); ret != 0 {
		return retErrno("ibv_destroy_srq", ret)
	}
	return nil
}

// QPInit describes the queue pair to create on an id: reliable connected,
// or unreliable datagram when UD is set (the id is then of PortSpaceUDP).
type QPInit struct {
	UD             bool
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ // optional
	MaxSendWR      int
	MaxRecvWR      int
	MaxSendSGE     int
	MaxRecvSGE     int
	MaxInline      int
}

// QPCaps are the capacities the device granted (at least what was asked).
type QPCaps struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInline int
}

// CreateQP creates a QP on the id (rdma_create_qp), in pd, or in
// librdmacm's per-device default PD when pd is nil. Work requests are
// signaled only when asked (sq_sig_all = 0), for selective signaling.
func (id *CMID) CreateQP(pd *PD, in QPInit) (QPCaps, error) {
	if err := injectedCreateFault(QPs); err != nil {
		return QPCaps{}, callError("rdma_create_qp", err)
	}
	var a C.struct_ibv_qp_init_attr
	a.send_cq = in.SendCQ.p
	a.recv_cq = in.RecvCQ.p
	if in.SRQ != nil {
		a.srq = in.SRQ.p
	}
	a.qp_type = C.IBV_QPT_RC
	if in.UD {
		// librdmacm moves a UD QP to RTS itself, with the port's P_Key
		// and the port space's Q_Key.
		a.qp_type = C.IBV_QPT_UD
	}
	a.cap.max_send_wr = C.uint32_t(in.MaxSendWR)
	a.cap.max_recv_wr = C.uint32_t(in.MaxRecvWR)
	a.cap.max_send_sge = C.uint32_t(in.MaxSendSGE)
	a.cap.max_recv_sge = C.uint32_t(in.MaxRecvSGE)
	a.cap.max_inline_data = C.uint32_t(in.MaxInline)
	var pdp *C.struct_ibv_pd
	if pd != nil {
		pdp = pd.p
	}
	if ret, err := C.rdma_create_qp(id.p, pdp, &a); ret != 0 {
		return QPCaps{}, callError(fmt.Sprintf("rdma_create_qp(send %d, recv %d, sge %d/%d, inline %d)",
			in.MaxSendWR, in.MaxRecvWR, in.MaxSendSGE, in.MaxRecvSGE, in.MaxInline), err)
	}
	noteQPCreated(id.QPKey())
	return QPCaps{MaxSendWR: int(a.cap.max_send_wr), MaxRecvWR: int(a.cap.max_recv_wr),
		MaxSendSGE: int(a.cap.max_send_sge), MaxRecvSGE: int(a.cap.max_recv_sge),
		MaxInline: int(a.cap.max_inline_data)}, nil
}

// qpEvents keeps librdmacm from working on a QP that is being destroyed:
// rdma_get_cm_event itself works on the event's id's QP (to RTR and RTS on
// a connect response, to the error state on a reject, attached to a
// multicast group on a join). A QP destroyed meanwhile would be freed
// under that work, or refused with EBUSY while the kernel holds it for a
// call, which rdma_destroy_qp ignores, leaving the QP, its CQ and its PD
// for the life of the process. Reading an event holds qpEvents; DestroyQP
// holds it only to take the QP off its id, after which librdmacm leaves
// it alone, and destroys it outside, so that closing many connections at
// once stays concurrent.
var qpEvents sync.Mutex

// DestroyQP destroys the id's QP, as rdma_destroy_qp does (the CQs are
// the caller's: librdmacm made none), out of librdmacm's reach first
// (qpEvents), and says when the device refused.
func (id *CMID) DestroyQP() error {
	qpEvents.Lock()
	qp := id.p.qp
	id.p.qp = nil
	qpEvents.Unlock()
	if qp == nil {
		return nil
	}
	if ret := C.ibv_destroy_qp(qp); ret != 0 {
		return callError("ibv_destroy_qp", syscall.Errno(ret))
	}
	return nil
}
