package seam

import "errors"

// Ended is err, why a connection ended, as every error of a connection that
// is over must be: matching closed (endpoint.ErrClosed, which msg.ErrClosed
// is). err is returned as it is when it matches closed already; otherwise
// the result matches both, errors.As finds what err holds (a device's
// *endpoint.CompletionError, a malformed message's cause), and its text is
// err's.
func Ended(err, closed error) error {
	if err == nil || errors.Is(err, closed) {
		return err
	}
	return &endedError{err: err, closed: closed}
}

type endedError struct{ err, closed error }

func (e *endedError) Error() string   { return e.err.Error() }
func (e *endedError) Unwrap() []error { return []error{e.err, e.closed} }

// Closed is a closed channel: the Done of a connection value that was
// never made (nil or zero), which ended before it began.
var Closed <-chan struct{} = ClosedChan[struct{}]()

// ClosedChan is a closed channel of T: what a value that ended before it
// began hands out for a channel its callers read until it is closed.
func ClosedChan[T any]() chan T {
	c := make(chan T)
	close(c)
	return c
}
