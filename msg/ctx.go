package msg

import (
	"context"
	"time"
)

// doneContext is a context that ends when done closes: for waits that
// belong to the connection, not to a caller.
type doneContext struct{ done <-chan struct{} }

func contextUntil(done <-chan struct{}) context.Context { return doneContext{done} }

func (d doneContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d doneContext) Done() <-chan struct{}       { return d.done }
func (d doneContext) Value(any) any               { return nil }

func (d doneContext) Err() error {
	select {
	case <-d.done:
		return context.Canceled
	default:
		return nil
	}
}
