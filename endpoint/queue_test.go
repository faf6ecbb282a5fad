package endpoint

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCompletionQueueKeepsOrder: completions go straight into the channel
// while it has room, are queued once it is full, and come out in emit
// order either way; the channel closes after the last one once closed.
func TestCompletionQueueKeepsOrder(t *testing.T) {
	ep := &Endpoint{}
	ep.queue.init(4)
	done := make(chan struct{})
	go func() { defer close(done); ep.deliverLoop() }()

	q := &ep.queue
	emit := func(from, to int) {
		q.mu.Lock()
		for i := from; i < to; i++ {
			q.emit(Completion{Context: i})
		}
		q.mu.Unlock()
		q.notify()
	}
	emit(0, 3)
	require.Equal(t, 3, len(q.out), "with room, completions go straight into the channel")
	emit(3, 20) // past the channel's capacity: queued behind it
	for i := range 10 {
		require.Equal(t, i, (<-q.out).Context)
	}
	emit(20, 30) // while the delivery goroutine may still hold a batch
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.notify()
	for i := 10; i < 30; i++ {
		select {
		case c := <-q.out:
			require.Equal(t, i, c.Context)
		case <-time.After(5 * time.Second):
			t.Fatalf("completion %d never delivered", i)
		}
	}
	_, open := <-q.out
	require.False(t, open, "closed after the last completion")
	<-done
}
