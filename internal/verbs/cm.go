package verbs

/*
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"unsafe"
)

// MaxConnPrivateData and MaxRejectPrivateData are the private data limits of
// an RC connect/accept and a reject over InfiniBand CM (RoCE uses the same),
// as documented in rdma_connect(3) and rdma_reject(3).
const (
	MaxConnPrivateData   = 56
	MaxAcceptPrivateData = 196
	MaxRejectPrivateData = 148
)

// EventChannel is an rdma_event_channel whose fd is non-blocking: GetEvent
// returns EAGAIN instead of parking a thread in C, and the fd is waited on
// through Go's netpoller by the caller.
type EventChannel struct{ p *C.struct_rdma_event_channel }

// NewEventChannel creates a non-blocking CM event channel.
func NewEventChannel() (*EventChannel, error) {
	if err := injectedCreateFault(EventChannels); err != nil {
		return nil, callError("rdma_create_event_channel", err)
	}
	p, err := C.rdma_create_event_channel()
	if p == nil {
		if err == syscall.ENODEV || err == syscall.ENOENT {
			return nil, fmt.Errorf("rdma_create_event_channel: %w (%w)", err, ErrNoDevice)
		}
		return nil, callError("rdma_create_event_channel", err)
	}
	if err := setNonblock(p.fd); err != nil {
		C.rdma_destroy_event_channel(p)
		return nil, callError("fcntl(O_NONBLOCK) on the CM event channel", err)
	}
	return &EventChannel{p: p}, nil
}

// Fd is the channel's file descriptor, readable when an event is pending.
func (c *EventChannel) Fd() int { return int(c.p.fd) }

// Destroy destroys the channel. Every id on it must be destroyed first.
func (c *EventChannel) Destroy() { C.rdma_destroy_event_channel(c.p) }

// EventType is rdma_cm_event_type.
type EventType int

// CM event types.
const (
	EventAddrResolved    EventType = C.RDMA_CM_EVENT_ADDR_RESOLVED
	EventAddrError       EventType = C.RDMA_CM_EVENT_ADDR_ERROR
	EventRouteResolved   EventType = C.RDMA_CM_EVENT_ROUTE_RESOLVED
	EventRouteError      EventType = C.RDMA_CM_EVENT_ROUTE_ERROR
	EventConnectRequest  EventType = C.RDMA_CM_EVENT_CONNECT_REQUEST
	EventConnectResponse EventType = C.RDMA_CM_EVENT_CONNECT_RESPONSE
	EventConnectError    EventType = C.RDMA_CM_EVENT_CONNECT_ERROR
	EventUnreachable     EventType = C.RDMA_CM_EVENT_UNREACHABLE
	EventRejected        EventType = C.RDMA_CM_EVENT_REJECTED
	EventEstablished     EventType = C.RDMA_CM_EVENT_ESTABLISHED
	EventDisconnected    EventType = C.RDMA_CM_EVENT_DISCONNECTED
	EventDeviceRemoval   EventType = C.RDMA_CM_EVENT_DEVICE_REMOVAL
	EventAddrChange      EventType = C.RDMA_CM_EVENT_ADDR_CHANGE
	EventTimewaitExit    EventType = C.RDMA_CM_EVENT_TIMEWAIT_EXIT
	EventMulticastJoin   EventType = C.RDMA_CM_EVENT_MULTICAST_JOIN
	EventMulticastError  EventType = C.RDMA_CM_EVENT_MULTICAST_ERROR
)

// String is librdmacm's name for the event (rdma_event_str).
func (t EventType) String() string {
	return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(t)))
}

// Event is one CM event, copied out of C. It must be acked exactly once.
type Event struct {
	Type EventType
	// Status is the event's status; for REJECTED it is the IB CM reject
	// reason, for errors a negative errno (also for those librdmacm makes
	// itself, whose own status is -1 with the cause in errno).
	Status int
	// ID the event is for; for CONNECT_REQUEST a new id, on ListenID.
	ID       *CMID
	ListenID *CMID
	// PrivateData of a connect request, accept or reject, copied.
	PrivateData []byte
	// ResponderResources and InitiatorDepth of a connect request.
	ResponderResources, InitiatorDepth int
	// UD is what an event of an unreliable datagram id carries: the
	// peer's QP for ESTABLISHED (service ID resolution), the group's for
	// MULTICAST_JOIN. Nil for reliable connections.
	UD  *UDParam
	raw *C.struct_rdma_cm_event
}

// UDParam is rdma_ud_param: where datagrams to the peer (or group) go.
type UDParam struct {
	QPNum, QKey uint32
	ahAttr      C.struct_ibv_ah_attr // no pointers inside: a Go copy is fine
}

// GetEvent returns the next event, or syscall.EAGAIN when none is pending.
// No QP is taken off its id for destroying while it runs (qpEvents).
func (c *EventChannel) GetEvent() (*Event, error) {
	if err := c.injectedFault(); err != nil {
		return nil, err
	}
	var raw *C.struct_rdma_cm_event
	qpEvents.Lock()
	ret, err := C.rdma_get_cm_event(c.p, &raw)
	qpEvents.Unlock()
	if ret != 0 {
		if err == syscall.EAGAIN {
			return nil, syscall.EAGAIN
		}
		return nil, callError("rdma_get_cm_event", err)
	}
	ev := &Event{Type: EventType(raw.event), Status: int(raw.status), raw: raw, ID: &CMID{p: raw.id}}
	if errno, ok := err.(syscall.Errno); ok && errno != 0 && ev.Status == -1 && librdmacmMadeError(ev.Type) {
		// librdmacm turned the event into an error itself, completing
		// the connection in userspace, and its status is that call's -1:
		// the cause is in errno.
		ev.Status = -int(errno)
	}
	if raw.listen_id != nil {
		ev.ListenID = &CMID{p: raw.listen_id}
	}
	if raw.id.ps == C.RDMA_PS_UDP || ev.Type == EventMulticastJoin {
		// For datagram ids the union holds rdma_ud_param.
		ud := (*C.struct_rdma_ud_param)(unsafe.Pointer(&raw.param))
		if ud.private_data != nil && ud.private_data_len > 0 {
			ev.PrivateData = C.GoBytes(ud.private_data, C.int(ud.private_data_len))
		}
		ev.UD = &UDParam{QPNum: uint32(ud.qp_num), QKey: uint32(ud.qkey), ahAttr: ud.ah_attr}
		return ev, nil
	}
	// For RC ids the union holds rdma_conn_param.
	conn := (*C.struct_rdma_conn_param)(unsafe.Pointer(&raw.param))
	if conn.private_data != nil && conn.private_data_len > 0 {
		ev.PrivateData = C.GoBytes(conn.private_data, C.int(conn.private_data_len))
	}
	ev.ResponderResources = int(conn.responder_resources)
	ev.InitiatorDepth = int(conn.initiator_depth)
	return ev, nil
}

// librdmacmMadeError says events of type t may be ones librdmacm made of
// a success it could not complete (a connect response or establishment
// whose queue pair transitions or RTU failed): CONNECT_ERROR, and the
// resolution errors it makes when querying the route fails.
func librdmacmMadeError(t EventType) bool {
	return t == EventConnectError || t == EventAddrError || t == EventRouteError
}

// Ack releases the event. Destroying an id waits for all its events to be
// acked, so every event must be acked, and before its id is destroyed.
func (e *Event) Ack() error {
	if e.raw == nil {
		return nil
	}
	raw := e.raw
	e.raw = nil
	if ret, err := C.rdma_ack_cm_event(raw); ret != 0 {
		return callError("rdma_ack_cm_event", err)
	}
	return nil
}

// PortSpace is an rdma_port_space: what kind of QP an id's port serves.
type PortSpace int

// Port spaces.
const (
	PortSpaceTCP PortSpace = C.RDMA_PS_TCP // reliable connected QPs
	PortSpaceUDP PortSpace = C.RDMA_PS_UDP // unreliable datagram QPs
)

// CMID is an rdma_cm_id.
type CMID struct{ p *C.struct_rdma_cm_id }

// CreateID creates an id of port space ps whose events arrive on ch.
func CreateID(ch *EventChannel, ps PortSpace) (*CMID, error) {
	if err := injectedCreateFault(CMIDs); err != nil {
		return nil, callError("rdma_create_id", err)
	}
	var p *C.struct_rdma_cm_id
	if ret, err := C.rdma_create_id(ch.p, &p, nil, C.enum_rdma_port_space(ps)); ret != 0 {
		return nil, callError("rdma_create_id", err)
	}
	return &CMID{p: p}, nil
}

// Key identifies the id (its C address), as the events for it carry it.
func (id *CMID) Key() uintptr { return uintptr(unsafe.Pointer(id.p)) }

// CreateEP creates an id for ai as rdma_create_ep(3) does, without a QP.
// For a passive ai it is bound to ai's address and returns at once. The id
// is synchronous (no event channel): Migrate it to a channel to use it
// without blocking. (For an active ai rdma_create_ep resolves the address
// and route synchronously, blocking a thread; Dial does not use it.)
func CreateEP(ai *AddrInfo) (*CMID, error) {
	if err := injectedCreateFault(CMIDs); err != nil {
		return nil, callError("rdma_create_ep", err)
	}
	var p *C.struct_rdma_cm_id
	if ret, err := C.rdma_create_ep(&p, ai.p, nil, nil); ret != 0 {
		return nil, callError("rdma_create_ep", syncChannelCause(err))
	}
	return &CMID{p: p}, nil
}

// syncChannelCause is rdma_create_ep's err, or what it hides: librdmacm
// reports any failure to open a synchronous id's own event channel as
// ENOMEM, so that a process at its limit of open files (EMFILE) would
// read "cannot allocate memory" and look at the wrong limit. That channel
// is the one file rdma_create_ep opens; after an ENOMEM, opening one
// again tells which it was.
func syncChannelCause(err error) error {
	if !errors.Is(err, syscall.ENOMEM) {
		return err
	}
	ch, openErr := C.rdma_create_event_channel()
	if ch == nil && openErr != nil {
		return fmt.Errorf("opening the id's event channel: %w", openErr)
	}
	if ch != nil {
		C.rdma_destroy_event_channel(ch)
	}
	return err
}

// DestroyEP destroys an id made by CreateEP, with its QP if it has one
// (rdma_destroy_ep).
func (id *CMID) DestroyEP() { C.rdma_destroy_ep(id.p) }

// Destroy destroys the id. Its QP must be destroyed and its events acked.
func (id *CMID) Destroy() error {
	if ret, err := C.rdma_destroy_id(id.p); ret != 0 {
		return callError("rdma_destroy_id", err)
	}
	return nil
}

// Migrate moves the id's events to another channel (rdma_migrate_id).
func (id *CMID) Migrate(ch *EventChannel) error {
	if ret, err := C.rdma_migrate_id(id.p, ch.p); ret != 0 {
		return callError("rdma_migrate_id", err)
	}
	return nil
}

// ResolveAddr starts resolving ai's destination; ADDR_RESOLVED or
// ADDR_ERROR follows on the channel.
func (id *CMID) ResolveAddr(ai *AddrInfo, timeoutMs int) error {
	if ret, err := C.rdma_resolve_addr(id.p, ai.p.ai_src_addr, ai.p.ai_dst_addr, C.int(timeoutMs)); ret != 0 {
		return callError("rdma_resolve_addr", err)
	}
	return nil
}

// ResolveRoute starts route resolution; ROUTE_RESOLVED or ROUTE_ERROR follows.
func (id *CMID) ResolveRoute(timeoutMs int) error {
	if ret, err := C.rdma_resolve_route(id.p, C.int(timeoutMs)); ret != 0 {
		return callError("rdma_resolve_route", err)
	}
	return nil
}

// SetAckTimeout sets the QP's transport ack timeout to 4.096 µs * 2^exp
// (RDMA_OPTION_ID_ACK_TIMEOUT); with the retry count it bounds how long a
// silent peer takes to fail a send. Set it before connect or accept.
func (id *CMID) SetAckTimeout(exp uint8) error {
	v := C.uint8_t(exp)
	if ret, err := C.rdma_set_option(id.p, C.RDMA_OPTION_ID, C.RDMA_OPTION_ID_ACK_TIMEOUT, unsafe.Pointer(&v), 1); ret != 0 {
		return callError("rdma_set_option(ACK_TIMEOUT)", err)
	}
	return nil
}

// SetAFOnly restricts a listener on the IPv6 wildcard (::) to IPv6
// (RDMA_OPTION_ID_AFONLY), so that an IPv4 wildcard can listen on the same
// port beside it. Set it before Listen.
func (id *CMID) SetAFOnly() error {
	v := C.int(1)
	if ret, err := C.rdma_set_option(id.p, C.RDMA_OPTION_ID, C.RDMA_OPTION_ID_AFONLY, unsafe.Pointer(&v), C.size_t(unsafe.Sizeof(v))); ret != 0 {
		return callError("rdma_set_option(AFONLY)", err)
	}
	return nil
}

// SetMinRNRTimer sets how long this QP, receiving, asks a sender to wait
// before it resends a message that found no receive posted (the minimum
// RNR NAK timer, in the InfiniBand encoding: 1 is 0.01 ms, 12 is 0.64 ms,
// 31 is 491.52 ms, 0 is 655.36 ms). The QP must be connected.
func (id *CMID) SetMinRNRTimer(code uint8) error {
	var attr C.struct_ibv_qp_attr
	attr.min_rnr_timer = C.uint8_t(code)
	return retErrno("ibv_modify_qp(MIN_RNR_TIMER)", C.ibv_modify_qp(id.p.qp, &attr, C.IBV_QP_MIN_RNR_TIMER))
}

// Listen starts listening for connect requests.
func (id *CMID) Listen(backlog int) error {
	if err := id.injectedListenFault(); err != nil {
		return callError("rdma_listen", err)
	}
	if ret, err := C.rdma_listen(id.p, C.int(backlog)); ret != 0 {
		return callError("rdma_listen", err)
	}
	return nil
}

// ConnParam is rdma_conn_param without the fields ignored when the id has a QP.
type ConnParam struct {
	PrivateData        []byte
	ResponderResources int
	InitiatorDepth     int
	RetryCount         int // transport retries (0-7); ignored on accept
	RNRRetryCount      int // receiver-not-ready retries (0-7; 7 is infinite)
	// QPNum names the QP of an id that has none of its own: a datagram
	// id's service ID resolution request or answer.
	QPNum uint32
}

func (cp *ConnParam) toC() (C.struct_rdma_conn_param, func()) {
	var c C.struct_rdma_conn_param
	free := func() {}
	if len(cp.PrivateData) > 0 {
		p := C.CBytes(cp.PrivateData)
		c.private_data = p
		c.private_data_len = C.uint8_t(len(cp.PrivateData))
		free = func() { C.free(p) }
	}
	c.responder_resources = C.uint8_t(cp.ResponderResources)
	c.initiator_depth = C.uint8_t(cp.InitiatorDepth)
	c.retry_count = C.uint8_t(cp.RetryCount)
	c.rnr_retry_count = C.uint8_t(cp.RNRRetryCount)
	c.qp_num = C.uint32_t(cp.QPNum)
	return c, free
}

// Connect starts connecting; ESTABLISHED, REJECTED, UNREACHABLE or
// CONNECT_ERROR follows. On iWARP it returns once TCP has connected, with
// signals held off meanwhile (go_rdma_connect says why).
func (id *CMID) Connect(cp ConnParam) error {
	if len(cp.PrivateData) > MaxConnPrivateData {
		return fmt.Errorf("rdma_connect: %d bytes of private data, at most %d fit: %w",
			len(cp.PrivateData), MaxConnPrivateData, syscall.EINVAL)
	}
	c, free := cp.toC()
	defer free()
	if ret, err := C.go_rdma_connect(id.p, &c); ret != 0 {
		return callError("rdma_connect", err)
	}
	return nil
}

// NotifyEstablished tells the CM that the QP has received (rdma_notify with
// IBV_EVENT_COMM_EST): the connection is up even though the handshake's
// last message, the dialer's RTU, has not arrived. ESTABLISHED follows.
// It fails (EINVAL, EISCONN) once the connection is established.
func (id *CMID) NotifyEstablished() error {
	if ret, err := C.rdma_notify(id.p, C.IBV_EVENT_COMM_EST); ret != 0 {
		return callError("rdma_notify", err)
	}
	return nil
}

// Accept accepts a connect request on this (new) id; ESTABLISHED follows.
func (id *CMID) Accept(cp ConnParam) error {
	if len(cp.PrivateData) > MaxAcceptPrivateData {
		return fmt.Errorf("rdma_accept: %d bytes of private data, at most %d fit: %w",
			len(cp.PrivateData), MaxAcceptPrivateData, syscall.EINVAL)
	}
	c, free := cp.toC()
	defer free()
	if ret, err := C.rdma_accept(id.p, &c); ret != 0 {
		return callError("rdma_accept", err)
	}
	return nil
}

// Reject rejects a connect request, sending privateData to the requester.
func (id *CMID) Reject(privateData []byte) error {
	if len(privateData) > MaxRejectPrivateData {
		return fmt.Errorf("rdma_reject: %d bytes of private data, at most %d fit: %w",
			len(privateData), MaxRejectPrivateData, syscall.EINVAL)
	}
	var p unsafe.Pointer
	if len(privateData) > 0 {
		p = C.CBytes(privateData)
		defer C.free(p)
	}
	if ret, err := C.rdma_reject(id.p, p, C.uint8_t(len(privateData))); ret != 0 {
		return callError("rdma_reject", err)
	}
	return nil
}

// Disconnect disconnects the connection. On InfiniBand and RoCE its QP
// moves to the error state and outstanding work requests are flushed; on
// iWARP it moves to SQD (a graceful close) only: see FailQP.
func (id *CMID) Disconnect() error {
	if err := injectedDisconnectFault(); err != nil {
		return err
	}
	if ret, err := C.rdma_disconnect(id.p); ret != 0 {
		return callError("rdma_disconnect", err)
	}
	return nil
}

// FailQP moves the id's QP to the error state (a no-op without a QP, and
// allowed from any state): the device flushes every work request it has
// been given. A receive that userspace writes into a queue the device
// maps (siw's, which takes no system call) after the QP failed is never
// seen by the device, so it never completes.
func (id *CMID) FailQP() error {
	if id.p.qp == nil {
		return nil
	}
	if err := injectedQPMoveFault(); err != nil {
		return err
	}
	var attr C.struct_ibv_qp_attr
	attr.qp_state = C.IBV_QPS_ERR
	return retErrno("ibv_modify_qp(ERR)", C.ibv_modify_qp(id.p.qp, &attr, C.IBV_QP_STATE))
}

// Context is the device context the id is bound to (nil before binding or
// address resolution).
func (id *CMID) Context() *Context {
	if id.p.verbs == nil {
		return nil
	}
	return &Context{p: id.p.verbs}
}

// Devices are the RDMA devices librdmacm found (rdma_get_devices), whose
// contexts librdmacm opens and keeps open for the life of the process.
func Devices() []*Context {
	var n C.int
	list := C.rdma_get_devices(&n)
	if list == nil {
		return nil
	}
	defer C.rdma_free_devices(list)
	devs := make([]*Context, 0, int(n))
	for _, p := range unsafe.Slice(list, int(n)) {
		devs = append(devs, &Context{p: p})
	}
	return devs
}

// LocalAddr and RemoteAddr are the id's bound and peer addresses.
func (id *CMID) LocalAddr() net.Addr {
	return sockaddrToAddr(C.rdma_get_local_addr(id.p))
}

// OnLoopback says whether id is bound to a loopback address, whatever
// name gave it. rdma_cm binds one with no device, as it binds a wildcard.
func (id *CMID) OnLoopback() bool {
	a, ok := id.LocalAddr().(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}

// RemoteAddr is the peer's address.
func (id *CMID) RemoteAddr() net.Addr {
	return sockaddrToAddr(C.rdma_get_peer_addr(id.p))
}

func sockaddrToAddr(sa *C.struct_sockaddr) net.Addr {
	if sa == nil {
		return nil
	}
	switch sa.sa_family {
	case C.AF_INET:
		in := (*C.struct_sockaddr_in)(unsafe.Pointer(sa))
		ip := C.GoBytes(unsafe.Pointer(&in.sin_addr), 4)
		port := int(C.ntohs(in.sin_port))
		return &net.TCPAddr{IP: net.IP(ip), Port: port}
	case C.AF_INET6:
		in6 := (*C.struct_sockaddr_in6)(unsafe.Pointer(sa))
		ip := C.GoBytes(unsafe.Pointer(&in6.sin6_addr), 16)
		port := int(C.ntohs(in6.sin6_port))
		return &net.TCPAddr{IP: net.IP(ip), Port: port}
	}
	return nil
}

// AddrInfo is the result list of rdma_getaddrinfo; only the first entry is
// used, as librdmacm's own examples do.
type AddrInfo struct{ p *C.struct_rdma_addrinfo }

// GetAddrInfo resolves host and port in port space ps. passive asks for an
// address to bind and listen on (RAI_PASSIVE); host may then be empty (any
// address). A port number out of 0-65535 is refused as net refuses it.
func GetAddrInfo(host, port string, passive bool, ps PortSpace) (*AddrInfo, error) {
	if err := checkPort(port); err != nil {
		return nil, err
	}
	var hints C.struct_rdma_addrinfo
	hints.ai_port_space = C.int(ps)
	if passive {
		hints.ai_flags = C.RAI_PASSIVE
	}
	var chost *C.char
	if host != "" {
		chost = C.CString(host)
		defer C.free(unsafe.Pointer(chost))
	}
	cport := C.CString(port)
	defer C.free(unsafe.Pointer(cport))
	var res *C.struct_rdma_addrinfo
	ret, err := C.rdma_getaddrinfo(chost, cport, &hints, &res)
	switch {
	case ret == 0:
		return &AddrInfo{p: res}, nil
	case ret == -1: // librdmacm's own failure, errno set
		return nil, fmt.Errorf("rdma_getaddrinfo %q: %w", host, err)
	default: // getaddrinfo(3)'s EAI_* code, passed through
		return nil, &net.DNSError{Err: C.GoString(C.gai_strerror(ret)), Name: host,
			IsNotFound: ret == C.EAI_NONAME, IsTemporary: ret == C.EAI_AGAIN}
	}
}

// Free releases the list.
func (ai *AddrInfo) Free() { C.rdma_freeaddrinfo(ai.p) }

// checkPort refuses a port number out of 0-65535 with net's error for
// it. getaddrinfo(3) would take the number modulo 65536 instead (99999
// is port 34463), and a listener would come up on a port nobody asked
// for. A name (a service of /etc/services) is getaddrinfo's to resolve.
func checkPort(port string) error {
	n, err := strconv.ParseInt(port, 10, 32)
	if errors.Is(err, strconv.ErrSyntax) {
		return nil // a name, or empty: any port
	}
	if err != nil || n < 0 || n > 65535 {
		return &net.AddrError{Err: "invalid port", Addr: port}
	}
	return nil
}
