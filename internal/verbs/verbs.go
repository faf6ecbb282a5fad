// Package verbs is the only package of this module that calls C. It wraps
// librdmacm and libibverbs thinly: connection identifiers and event
// channels, protection domains, memory regions, completion queues and
// channels, queue pairs and shared receive queues, work-request batches and
// completion polling. It adds no policy: ownership, queue accounting and
// goroutines live in the packages above it.
//
// Rules kept here: no Go pointer is ever stored in C memory (work request ids
// are integers chosen by the caller); every C array the device or the
// library reads is allocated with C.malloc and freed by its owner's Free or
// Destroy; errno becomes a syscall.Errno, wrapped with the call that failed.
package verbs

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNoDevice is returned when no RDMA device is present at all.
var ErrNoDevice = errors.New("no RDMA device: load rdma_rxe and create one with " +
	"`rdma link add rxe0 type rxe netdev <if>`, or run under the testbed (bin/rxevm)")

// Resource names a kind of device object, for the fault hook that refuses
// its creation (FailCreate, in builds with the rdmacm_faultinject tag).
type Resource int

// The kinds of device objects the library creates.
const (
	EventChannels Resource = iota // rdma_create_event_channel
	CMIDs                         // rdma_create_id, rdma_create_ep
	PDs                           // ibv_alloc_pd
	MRs                           // ibv_reg_mr
	CompChannels                  // ibv_create_comp_channel
	CQs                           // ibv_create_cq
	SRQs                          // ibv_create_srq
	QPs                           // rdma_create_qp
	AHs                           // ibv_create_ah, ibv_create_ah_from_wc
)

func (r Resource) String() string {
	names := [...]string{"event channel", "CM id", "PD", "MR", "completion channel", "CQ", "SRQ", "QP", "AH"}
	if r < 0 || int(r) >= len(names) {
		return fmt.Sprintf("Resource(%d)", int(r))
	}
	return names[r]
}

// callError wraps the errno of a failed call with the call's name, so that
// errors.Is(err, syscall.ECONNREFUSED) and friends work above. A call that
// failed without setting errno (a provider that gives up in user space,
// such as soft-iWARP's when a new queue's mapping lands on the offset it
// takes for an invalid key; docs/TESTING.md) is EIO, and says that no
// reason was given.
func callError(call string, err error) error {
	if err == nil {
		return fmt.Errorf("%s: failed without an errno: %w", call, syscall.EIO)
	}
	return fmt.Errorf("%s: %w", call, err)
}

// retErrno turns the return convention of ibv_post_* and ibv_req_notify_cq
// (the errno itself is returned) into an error.
func retErrno(call string, ret C.int) error {
	if ret == 0 {
		return nil
	}
	if ret < 0 {
		ret = -ret
	}
	return fmt.Errorf("%s: %w", call, syscall.Errno(ret))
}

// WCStatus is ibv_wc_status: the outcome of one work request.
type WCStatus uint32

// Statuses named in this package's callers.
const (
	WCSuccess        WCStatus = C.IBV_WC_SUCCESS
	WCLocLenErr      WCStatus = C.IBV_WC_LOC_LEN_ERR
	WCLocQPOpErr     WCStatus = C.IBV_WC_LOC_QP_OP_ERR
	WCLocProtErr     WCStatus = C.IBV_WC_LOC_PROT_ERR
	WCWRFlushErr     WCStatus = C.IBV_WC_WR_FLUSH_ERR
	WCRemAccessErr   WCStatus = C.IBV_WC_REM_ACCESS_ERR
	WCRemInvReqErr   WCStatus = C.IBV_WC_REM_INV_REQ_ERR
	WCRetryExcErr    WCStatus = C.IBV_WC_RETRY_EXC_ERR
	WCRNRRetryExcErr WCStatus = C.IBV_WC_RNR_RETRY_EXC_ERR
	WCRemOpErr       WCStatus = C.IBV_WC_REM_OP_ERR
)

// String is libibverbs' own name for the status (ibv_wc_status_str).
func (s WCStatus) String() string {
	return C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(s)))
}

// WCOpcode is ibv_wc_opcode: what a completion completed.
type WCOpcode uint32

// Completion opcodes.
const (
	WCSend            WCOpcode = C.IBV_WC_SEND
	WCRDMAWrite       WCOpcode = C.IBV_WC_RDMA_WRITE
	WCRDMARead        WCOpcode = C.IBV_WC_RDMA_READ
	WCCompSwap        WCOpcode = C.IBV_WC_COMP_SWAP
	WCFetchAdd        WCOpcode = C.IBV_WC_FETCH_ADD
	WCRecv            WCOpcode = C.IBV_WC_RECV
	WCRecvRDMAWithImm WCOpcode = C.IBV_WC_RECV_RDMA_WITH_IMM
)

// WROpcode is ibv_wr_opcode: what a send work request does.
type WROpcode uint32

// Send work request opcodes.
const (
	WRSend             WROpcode = C.IBV_WR_SEND
	WRSendWithImm      WROpcode = C.IBV_WR_SEND_WITH_IMM
	WRRDMAWrite        WROpcode = C.IBV_WR_RDMA_WRITE
	WRRDMAWriteWithImm WROpcode = C.IBV_WR_RDMA_WRITE_WITH_IMM
	WRRDMARead         WROpcode = C.IBV_WR_RDMA_READ
	WRAtomicCmpSwp     WROpcode = C.IBV_WR_ATOMIC_CMP_AND_SWP
	WRAtomicFetchAdd   WROpcode = C.IBV_WR_ATOMIC_FETCH_AND_ADD
)

// Send flags (ibv_send_flags).
const (
	SendSignaled  = C.IBV_SEND_SIGNALED
	SendFence     = C.IBV_SEND_FENCE
	SendSolicited = C.IBV_SEND_SOLICITED
	SendInline    = C.IBV_SEND_INLINE
)

// Access flags (ibv_access_flags) for memory registration.
const (
	AccessLocalWrite   = C.IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite  = C.IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead   = C.IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic = C.IBV_ACCESS_REMOTE_ATOMIC
)

// WCWithImm is set in WC.Flags when the completion carries immediate data.
const WCWithImm = C.IBV_WC_WITH_IMM

// setNonblock makes a channel's descriptor, fresh from the C library,
// non-blocking, as the netpoller and the library's non-blocking reads
// need. One F_SETFL, without reading the flags first: a new channel's
// descriptor has no other status flag to keep (close-on-exec is a
// descriptor flag, which F_SETFL leaves alone).
func setNonblock(fd C.int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_NONBLOCK)
	return err
}
