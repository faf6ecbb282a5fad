package verbs

/*
#include <infiniband/verbs.h>
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// AsyncEventType is libibverbs' enum ibv_event_type: what an asynchronous
// event of a device is about.
type AsyncEventType int

// The asynchronous events the library acts on or reports.
const (
	AsyncCQErr       AsyncEventType = C.IBV_EVENT_CQ_ERR        // a CQ overran: completions were lost
	AsyncQPFatal     AsyncEventType = C.IBV_EVENT_QP_FATAL      // a QP failed: its work queues stopped
	AsyncQPReqErr    AsyncEventType = C.IBV_EVENT_QP_REQ_ERR    // a request from the peer broke the transport's rules
	AsyncQPAccessErr AsyncEventType = C.IBV_EVENT_QP_ACCESS_ERR // the peer's request broke a local access right
	AsyncPortActive  AsyncEventType = C.IBV_EVENT_PORT_ACTIVE
	AsyncPortErr     AsyncEventType = C.IBV_EVENT_PORT_ERR
	AsyncDeviceFatal AsyncEventType = C.IBV_EVENT_DEVICE_FATAL
	asyncLIDChange   AsyncEventType = C.IBV_EVENT_LID_CHANGE
	asyncPKeyChange  AsyncEventType = C.IBV_EVENT_PKEY_CHANGE
	asyncSMChange    AsyncEventType = C.IBV_EVENT_SM_CHANGE
	asyncClientRereg AsyncEventType = C.IBV_EVENT_CLIENT_REREGISTER
	AsyncGIDChange   AsyncEventType = C.IBV_EVENT_GID_CHANGE // the port's address table (RoCE's GIDs) changed
)

// String is libibverbs' description of the event (ibv_event_type_str).
func (t AsyncEventType) String() string {
	return C.GoString(C.ibv_event_type_str(C.enum_ibv_event_type(t)))
}

// EndsQP says whether the event leaves its QP in the error state.
func (t AsyncEventType) EndsQP() bool {
	return t == AsyncQPFatal || t == AsyncQPReqErr || t == AsyncQPAccessErr
}

// AsyncEvent is one asynchronous event of a device, copied out and acked.
type AsyncEvent struct {
	Type AsyncEventType
	// Element is the QPKey or CQ Key of the QP or CQ the event is about
	// (an SRQ's or a work queue's address for theirs); 0 for a port's or
	// the device's events.
	Element uintptr
	// Port is the port a port's event is about (from 1); 0 otherwise.
	Port int
}

// PrepareAsync makes the context's asynchronous event descriptor
// non-blocking, as GetAsyncEvent and the netpoller need, and returns it.
// The descriptor is the context's, open while the context is.
func (c *Context) PrepareAsync() (int, error) {
	fd := c.p.async_fd
	if err := setNonblock(fd); err != nil {
		return -1, callError("making the async event descriptor non-blocking", err)
	}
	return int(fd), nil
}

// GetAsyncEvent takes the next asynchronous event without waiting
// (syscall.EAGAIN when there is none; PrepareAsync first) and acks it at
// once: destroying a QP, CQ or SRQ waits until every event read for it is
// acked, and the caller needs nothing more of the event than its copy.
func (c *Context) GetAsyncEvent() (AsyncEvent, error) {
	if err := c.injectedAsyncFault(); err != nil {
		return AsyncEvent{}, err
	}
	var ev C.struct_ibv_async_event
	if ret, err := C.ibv_get_async_event(c.p, &ev); ret != 0 {
		if err == syscall.EAGAIN {
			return AsyncEvent{}, err
		}
		return AsyncEvent{}, callError("ibv_get_async_event", err)
	}
	out := AsyncEvent{Type: AsyncEventType(ev.event_type)}
	switch out.Type {
	case AsyncPortActive, AsyncPortErr, asyncLIDChange, asyncPKeyChange, asyncSMChange,
		asyncClientRereg, AsyncGIDChange:
		out.Port = int(*(*C.int)(unsafe.Pointer(&ev.element)))
	case AsyncDeviceFatal:
	default: // the union holds the QP's, CQ's, SRQ's or WQ's address
		out.Element = *(*uintptr)(unsafe.Pointer(&ev.element))
	}
	C.ibv_ack_async_event(&ev)
	return injectedRewrite(out), nil
}

// Name is the device's name (rxe0, siw0, mlx5_0, ...).
func (c *Context) Name() string { return C.GoString(C.ibv_get_device_name(c.p.device)) }

// Key identifies the CQ in AsyncEvent.Element.
func (cq *CQ) Key() uintptr { return uintptr(unsafe.Pointer(cq.p)) }

// QPKey identifies the id's QP in AsyncEvent.Element (CreateQP first).
func (id *CMID) QPKey() uintptr { return uintptr(unsafe.Pointer(id.p.qp)) }
