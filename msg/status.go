package msg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Code classifies a call's failure; it travels to the caller with the
// error's text. A Code is an error, so that a handler wraps one into what
// it returns and the caller matches it with errors.Is:
//
//	return nil, fmt.Errorf("no key %q: %w", k, msg.CodeNotFound) // handler
//	if errors.Is(err, msg.CodeNotFound) { ... }                  // caller
//
// Applications may define their own codes from CodeUser up.
type Code uint16

// Codes the library uses, and common ones for handlers.
const (
	CodeUnknown           Code = iota // the handler's error carries no code
	CodeInvalidArgument               // the request is malformed for the method
	CodeNotFound                      // what the request names does not exist
	CodeAlreadyExists                 // what the request would create exists
	CodePermissionDenied              // the caller may not do this
	CodeUnavailable                   // the service cannot serve now; retrying may help
	CodeDeadlineExceeded              // the handler's deadline passed
	CodeUnimplemented                 // no handler for the method (Mux)
	CodeInternal                      // the handler failed unexpectedly (it panicked)
	CodeResourceExhausted             // a limit was reached: the response is larger than the caller receives

	// CodeUser is the first code for applications' own.
	CodeUser Code = 1000
)

var codeNames = [...]string{"unknown", "invalid argument", "not found", "already exists",
	"permission denied", "unavailable", "deadline exceeded", "unimplemented", "internal",
	"resource exhausted"}

// String names the code.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code %d", uint16(c))
}

// Error is the code's name, so that a Code can be wrapped and matched.
func (c Code) Error() string { return "msg: " + c.String() }

// RemoteError is a handler's error, as the caller sees it: the method, the
// code and the handler's error text. errors.Is(err, code) matches its Code.
type RemoteError struct {
	Method string
	Code   Code
	Msg    string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("msg: %s: remote error (%s): %s", e.Method, e.Code.String(), e.Msg)
}

// Is reports whether target is the error's Code.
func (e *RemoteError) Is(target error) bool {
	c, ok := target.(Code)
	return ok && c == e.Code
}

// codeOf is the code a handler's error carries: the Code it wraps, else
// CodeDeadlineExceeded for a passed deadline, else CodeUnknown.
func codeOf(err error) Code {
	var c Code
	switch {
	case errors.As(err, &c):
		return c
	case errors.Is(err, context.DeadlineExceeded):
		return CodeDeadlineExceeded
	}
	return CodeUnknown
}

// A TypeError message's payload: code u16, then the error's text.
func encodeError(err error) []byte {
	return append(binary.LittleEndian.AppendUint16(nil, uint16(codeOf(err))), err.Error()...)
}

func decodeError(method string, p []byte) error {
	if len(p) < 2 {
		return &RemoteError{Method: method, Code: CodeUnknown, Msg: string(p)}
	}
	return &RemoteError{Method: method, Code: Code(binary.LittleEndian.Uint16(p)), Msg: string(p[2:])}
}

// MethodFunc serves one method of a Mux; see Handler.
type MethodFunc func(ctx context.Context, req []byte) ([]byte, error)

// Mux routes calls by method, as net/http's ServeMux routes requests by
// path: register methods with Handle, serve with NewServer(mux.Serve). A
// call of a method nobody registered fails with CodeUnimplemented. Safe
// for concurrent use.
type Mux struct {
	mu      sync.RWMutex
	methods map[string]MethodFunc
}

// Handle registers f for method. An empty or over-long name (more than
// 255 bytes), a nil f, or a method already registered is refused with
// an error matching endpoint.ErrInvalid.
func (m *Mux) Handle(method string, f MethodFunc) error {
	if len(method) == 0 || len(method) > 255 || f == nil {
		return invalid("Mux.Handle: method %q (1 to 255 bytes) with a non-nil function", method)
	}
	if m == nil {
		return invalid("Mux.Handle: a nil Mux (use new(Mux) or a zero one)")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.methods[method]; dup {
		return invalid("Mux.Handle: method %q is registered already", method)
	}
	if m.methods == nil {
		m.methods = map[string]MethodFunc{}
	}
	m.methods[method] = f
	return nil
}

// Serve is the Mux as a Handler: it calls method's function.
func (m *Mux) Serve(ctx context.Context, method string, req []byte) ([]byte, error) {
	var f MethodFunc
	if m != nil { // a nil Mux serves no method
		m.mu.RLock()
		f = m.methods[method]
		m.mu.RUnlock()
	}
	if f == nil {
		return nil, fmt.Errorf("no method %q: %w", method, CodeUnimplemented)
	}
	return f(ctx, req)
}

type peerKey struct{}

// PeerAddr is the address of the caller whose call ctx belongs to, in a
// Handler; nil elsewhere.
func PeerAddr(ctx context.Context) net.Addr {
	a, _ := ctx.Value(peerKey{}).(net.Addr)
	return a
}
