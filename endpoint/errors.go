package endpoint

import (
	"errors"
	"fmt"
	"net"

	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Errors callers match with errors.Is.
var (
	// ErrClosed: the endpoint was closed, or its connection ended (the
	// peer left), before the work request completed. Only an error that
	// this side's Close caused matches net.ErrClosed too: net keeps that
	// for a conn its own side closed, and code written for net ignores it
	// after its own Close, so a peer's leaving must not look like one.
	ErrClosed = errors.New("endpoint: closed")
	// ErrQueueFull: every send (or receive) queue slot holds a posted work
	// request. Post* never waits: read Completions, then post again.
	ErrQueueFull = errors.New("endpoint: queue full: wait for a completion before posting more")
	// ErrInvalid: an argument was refused before anything was posted or
	// created. A work request (a missing or foreign buffer, a length past
	// it, a field or flag that does not fit the operation, too many
	// segments, inline too large, a misaligned atomic), or a connection's
	// option (package cm's), out of range or beyond what the device holds.
	ErrInvalid = errors.New("endpoint: invalid argument")
	// ErrNotSupported: the device cannot do what the work request asks
	// (iWARP has no atomics and no immediate data, and some devices take
	// one segment for an RDMA READ's sink). It was refused before anything
	// was posted.
	ErrNotSupported = errors.New("endpoint: not supported by the device")
	// ErrNoAtomics: the device does not support atomic operations. It
	// matches ErrNotSupported.
	ErrNoAtomics = fmt.Errorf("%w: no atomic operations (atomic_cap is IBV_ATOMIC_NONE)", ErrNotSupported)
	// ErrDeviceFailure: the device reported, by an asynchronous event,
	// that the endpoint's QP failed (IBV_EVENT_QP_FATAL, QP_REQ_ERR,
	// QP_ACCESS_ERR), that its CQ overran and lost completions
	// (IBV_EVENT_CQ_ERR), or that the device itself failed
	// (IBV_EVENT_DEVICE_FATAL). The endpoint ends: Done closes, at once
	// for the CQ or the device, and for the QP unless the CM says first
	// that the peer left (a peer's going fails siw's QP). Err then
	// matches this and ErrClosed, and names the device and the event.
	// Package dgram's Conn fails its reads and writes with it when its
	// queue pair or a completion queue fails.
	ErrDeviceFailure = errors.New("endpoint: the device reported a failure")
	// ErrPortDown: the port of the device the connection runs on was not
	// active when one of its work requests failed, or when the connection
	// ended for a reason other than this side's Close: its link is down
	// (Soft-RoCE's and soft-iWARP's ports follow their netdev). The error
	// names the device, the port and its state. On Soft-RoCE a request
	// sent while the port is down fails at once, and a connection that
	// sends nothing then survives; soft-iWARP ends every connection on
	// the port. Once the port is active again, soft-iWARP makes new
	// connections; Soft-RoCE on Linux 6.1 makes none after a connection
	// was closed while its port was down, until the device is re-created
	// (docs/DESIGN.md).
	ErrPortDown = errors.New("endpoint: the connection's port is down")
	// ErrAddressGone: the connection's local IP address was assigned to
	// no interface of this host when one of its work requests failed, or
	// when the device failed its QP, or (package msg) when its peer went
	// silent: an operator or a DHCP client removed it. The error names the
	// address. Soft-RoCE fails a request sent then at once; soft-iWARP's
	// connection goes silent, and package msg's keepalive ends it with an
	// error that matches this as well as msg.ErrPeerSilent. Connections
	// made once the address is back work.
	ErrAddressGone = errors.New("endpoint: the connection's local address is gone")
)

// portDownError is the state of a port that was not active when a
// connection failed or ended; it matches ErrPortDown.
type portDownError struct {
	dev   string
	port  int
	state verbs.PortState
}

func (e *portDownError) Error() string {
	if e.state == verbs.PortDown {
		return fmt.Sprintf("%s port %d is down", e.dev, e.port)
	}
	return fmt.Sprintf("%s port %d is not active (%v)", e.dev, e.port, e.state)
}

func (e *portDownError) Is(target error) bool { return target == ErrPortDown }

// addressGoneError is a connection's local address, assigned to no
// interface when the connection failed or ended; it matches
// ErrAddressGone.
type addressGoneError struct{ ip net.IP }

func (e *addressGoneError) Error() string {
	return fmt.Sprintf("%v is no longer an address of this host", e.ip)
}

func (e *addressGoneError) Is(target error) bool { return target == ErrAddressGone }

// localFault is what, on this host, explains a connection's failure or
// end now: its port (port of dev) not active (a *portDownError), or its
// local address (local, the id's bound address) assigned to no interface
// (an *addressGoneError; not checked when local is nil). It is nil when
// neither holds or neither can be read. Without it, Soft-RoCE's requests
// sent while the link is down or the address is gone fail as a bare
// "local QP operation error", and soft-iWARP's connections end as if the
// peer had left, or had gone silent.
//
// The states are read when the failure comes rather than taken from the
// device's port events or the kernel's address notices: those arrive on
// other descriptors, and may arrive after the failure.
func localFault(dev *verbs.Context, port int, local net.Addr) error {
	if state, err := dev.PortState(port); err == nil && state != verbs.PortActive {
		return &portDownError{dev: dev.Name(), port: port, state: state}
	}
	return addressGone(local)
}

// addressGone is an *addressGoneError when local, an id's bound address,
// is a specific IP address that no interface of this host has now, and
// nil otherwise, or when the interfaces cannot be listed.
func addressGone(local net.Addr) error {
	tcp, ok := local.(*net.TCPAddr)
	if !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		return nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(tcp.IP) {
			return nil
		}
	}
	return &addressGoneError{ip: tcp.IP}
}

// whileLocalFault is seam.WhileLocalFault: cause, why a connection (or a
// datagram Conn's queue pair) failed, naming its local fault too when
// there is one (localFault).
func whileLocalFault(dev *verbs.Context, port int, local net.Addr, cause error) error {
	if errors.Is(cause, ErrPortDown) || errors.Is(cause, ErrAddressGone) {
		return cause
	}
	if fault := localFault(dev, port, local); fault != nil {
		return fmt.Errorf("%w, while %w", cause, fault)
	}
	return cause
}

// localFault is localFault of ep's port and bound address.
func (ep *Endpoint) localFault() error {
	return localFault(ep.id.Context(), ep.id.PortNum(), ep.cfg.LocalAddr)
}

// whileLocalFault is whileLocalFault of ep's port and bound address.
func (ep *Endpoint) whileLocalFault(cause error) error {
	return whileLocalFault(ep.id.Context(), ep.id.PortNum(), ep.cfg.LocalAddr, cause)
}

func init() {
	seam.WhileLocalFault = whileLocalFault
	seam.EndpointWhileLocalFault = func(ep any, cause error) error { return ep.(*Endpoint).whileLocalFault(cause) }
}

// errClosedHere is ErrClosed as this side's Close causes it: it matches
// net.ErrClosed too.
var errClosedHere = fmt.Errorf("%w: %w", ErrClosed, net.ErrClosed)

// closedHere is what this side's close of the endpoint reports (a post or
// a Next after it, what it flushes): errClosedHere for Close, or the cause
// a sibling package or a failure of the endpoint's own closed it with.
func (ep *Endpoint) closedHere() error {
	if p := ep.closedBy.Load(); p != nil {
		return *p
	}
	return errClosedHere
}

// refusal is what a post or a Next refused because the endpoint is
// closing reports: the local close error once the application called
// Close, whatever ended the endpoint first (net's conns answer every call
// after Close with net.ErrClosed), and the close's cause before that.
func (ep *Endpoint) refusal() error {
	if ep.calledClose.Load() {
		return errClosedHere
	}
	return ep.closedHere()
}

// Status is the device's status of a work request that failed: the value
// of libibverbs' enum ibv_wc_status.
type Status uint32

// Work-completion statuses worth matching on (ibv_wc_status values).
const (
	StatusLocalLength  Status = 1  // IBV_WC_LOC_LEN_ERR: a message longer than the receive
	StatusLocalQPOp    Status = 2  // IBV_WC_LOC_QP_OP_ERR
	StatusLocalProt    Status = 4  // IBV_WC_LOC_PROT_ERR: local memory the QP may not use
	StatusFlushed      Status = 5  // IBV_WC_WR_FLUSH_ERR: the QP went to the error state first
	StatusRemoteInvReq Status = 9  // IBV_WC_REM_INV_REQ_ERR
	StatusRemoteAccess Status = 10 // IBV_WC_REM_ACCESS_ERR: a bad rkey, range or access right
	StatusRemoteOp     Status = 11 // IBV_WC_REM_OP_ERR
	StatusRetryExc     Status = 12 // IBV_WC_RETRY_EXC_ERR: the peer stopped answering
	StatusRNRRetryExc  Status = 13 // IBV_WC_RNR_RETRY_EXC_ERR: the peer had no receive posted
)

// String is libibverbs' name for the status (ibv_wc_status_str).
func (s Status) String() string { return verbs.WCStatus(s).String() }

// CompletionError is a work request the device completed with an error.
// A flushed request (the QP went to the error state: Close, or the peer
// left) also matches ErrClosed, and so does one that failed after this
// side's Close began, whatever its status; that one matches net.ErrClosed
// too.
type CompletionError struct {
	Op        Op
	Status    Status
	VendorErr uint32

	closedBy error // the close it failed during (closedHere), nil before one began
	local    error // what on this host explains it (localFault), if anything
}

// Error names the operation and the device's status, and the local fault
// when there was one: the port down, or the address gone.
func (e *CompletionError) Error() string {
	s := fmt.Sprintf("endpoint: %v failed: %v (status %d, vendor error %#x)", e.Op, e.Status, uint32(e.Status), e.VendorErr)
	if e.local != nil {
		s += ", while " + e.local.Error()
	}
	return s
}

// Unwrap makes a flushed request match ErrClosed, one that failed during
// Close match what that close reports (net.ErrClosed as well, for Close
// itself), and one that failed while its port was down or its address
// gone ErrPortDown or ErrAddressGone.
func (e *CompletionError) Unwrap() []error {
	switch {
	case e.closedBy != nil:
		return []error{e.closedBy}
	case e.Status == StatusFlushed:
		return []error{ErrClosed}
	case e.local != nil:
		return []error{e.local}
	}
	return nil
}

// PostError is PostBatch's error when the device refused one of the
// requests (ibv_post_recv or ibv_post_send failed). A batch's receives are
// posted first, then its sends. The requests of the refused one's kind
// before it were posted and will complete; it and the later ones of its
// kind were not, and when it is a receive, no send of the batch was posted.
//
// Index is the batch's length when the device refused none: it queued
// every request but would not start them. Soft-iWARP refuses so while a
// connection's end moves its queue pair out of the state that sends (and
// Soft-RoCE for a queue pair not yet able to send); each request then
// completes, as a flush or at Close.
type PostError struct {
	Index int   // the refused request's index in the slice given to PostBatch
	Err   error // the device's error (an errno)

	queued bool // every request was queued (Index is the batch's length)
}

// Error names the refused request.
func (e *PostError) Error() string {
	if e.queued {
		return fmt.Sprintf("endpoint: the device queued all %d work requests but refused to start them: %v", e.Index, e.Err)
	}
	return fmt.Sprintf("endpoint: the device refused work request %d: %v", e.Index, e.Err)
}

// Unwrap is the device's error.
func (e *PostError) Unwrap() error { return e.Err }
