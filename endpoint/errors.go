package endpoint

import (
	"errors"
	"fmt"
	"net"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Errors callers match with errors.Is.
var (
	// ErrClosed: the endpoint was closed, or the connection ended, before
	// the work request completed. It matches net.ErrClosed too.
	ErrClosed = fmt.Errorf("endpoint: closed: %w", net.ErrClosed)
	// ErrQueueFull: every send (or receive) queue slot holds a posted work
	// request. Post* never waits: read Completions, then post again.
	ErrQueueFull = errors.New("endpoint: queue full: wait for a completion before posting more")
	// ErrInvalid: the work request was refused before anything was posted
	// (bad length, too many segments, inline too large, misaligned atomic).
	ErrInvalid = errors.New("endpoint: invalid work request")
	// ErrNoAtomics: the device does not support atomic operations.
	ErrNoAtomics = errors.New("endpoint: the device has no atomic operations (atomic_cap is IBV_ATOMIC_NONE)")
)

// WCStatus is the device's status of a failed work request (ibv_wc_status).
type WCStatus = verbs.WCStatus

// Work-completion statuses worth matching on.
const (
	StatusLocalLength  = verbs.WCLocLenErr
	StatusLocalQPOp    = verbs.WCLocQPOpErr
	StatusLocalProt    = verbs.WCLocProtErr
	StatusFlushed      = verbs.WCWRFlushErr
	StatusRemoteAccess = verbs.WCRemAccessErr
	StatusRemoteInvReq = verbs.WCRemInvReqErr
	StatusRetryExc     = verbs.WCRetryExcErr
	StatusRNRRetryExc  = verbs.WCRNRRetryExcErr
	StatusRemoteOp     = verbs.WCRemOpErr
)

// CompletionError is a work request the device completed with an error.
// A flushed request (the QP went to the error state: Close, or the peer
// left) also matches ErrClosed.
type CompletionError struct {
	Op        Op
	Status    WCStatus
	VendorErr uint32
}

// Error names the operation and the device's status.
func (e *CompletionError) Error() string {
	return fmt.Sprintf("endpoint: %v failed: %v (status %d, vendor error %#x)", e.Op, e.Status, uint32(e.Status), e.VendorErr)
}

// Unwrap makes a flushed request match ErrClosed.
func (e *CompletionError) Unwrap() error {
	if e.Status == verbs.WCWRFlushErr {
		return ErrClosed
	}
	return nil
}
