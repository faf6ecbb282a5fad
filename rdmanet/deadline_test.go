package rdmanet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDeadlinePastEndsTheContextAtOnce(t *testing.T) {
	var d deadline
	d.init()
	ctx := d.context()
	d.set(time.Now().Add(-time.Second))
	require.Error(t, ctx.Err())
	require.Same(t, ctx, d.context(), "later calls see the same ended context")
}

// Moving a deadline that has not passed keeps the context: a call waiting
// on it waits until the new time, not the old one.
func TestDeadlineExtendedBeforeItPassed(t *testing.T) {
	var d deadline
	d.init()
	d.set(time.Now().Add(20 * time.Millisecond))
	ctx := d.context()
	d.set(time.Now().Add(time.Hour))
	time.Sleep(60 * time.Millisecond)
	require.NoError(t, ctx.Err(), "the old time fired")
	require.Same(t, ctx, d.context())
	d.set(time.Now().Add(10 * time.Millisecond))
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the new time never fired")
	}
}

// After a deadline passed, a new one (or none) gives a fresh context.
func TestDeadlineResetAfterItPassed(t *testing.T) {
	var d deadline
	d.init()
	d.set(time.Now().Add(-time.Second))
	old := d.context()
	d.set(time.Time{})
	require.NotSame(t, old, d.context())
	require.NoError(t, d.context().Err())
	d.stop()
}

// Once stopped (the connection closed), a deadline arms no timer: a
// SetDeadline that raced with Close leaves nothing behind.
func TestDeadlineStoppedArmsNothing(t *testing.T) {
	var d deadline
	d.init()
	d.stop()
	d.set(time.Now().Add(time.Hour))
	require.Nil(t, d.timer)
	d.set(time.Now().Add(-time.Second))
	require.NoError(t, d.context().Err(), "a stopped deadline does not expire")
}
