package endpoint

import (
	"context"
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

// TestHandOffKeepsOrder: a completion is handed to the polling caller of
// Next only when nothing precedes it; otherwise it goes behind the others.
func TestHandOffKeepsOrder(t *testing.T) {
	ep := &Endpoint{}
	ep.queue.init(4)
	q := &ep.queue
	q.mu.Lock()
	q.handWanted = true
	q.emit(Completion{Context: 1})
	q.emit(Completion{Context: 2}) // the hand is taken: the channel
	require.False(t, q.handWanted)
	require.Equal(t, 1, q.handOff.Context)
	require.Equal(t, 1, len(q.out))

	q.handWanted = true // 2 waits in the channel: 3 must not overtake it
	q.emit(Completion{Context: 3})
	require.True(t, q.handWanted)
	q.handWanted = false
	q.mu.Unlock()
	require.Equal(t, 2, (<-q.out).Context)
	require.Equal(t, 3, (<-q.out).Context)
}

// TestNextAnsweredByTheChannelCountsAsPolling: a busy-polling caller that
// always finds a completion waiting must still make the completion
// goroutine stand aside (else the two take turns for every completion).
func TestNextAnsweredByTheChannelCountsAsPolling(t *testing.T) {
	ep := &Endpoint{mode: PollBusy, done: make(chan struct{})}
	ep.queue.init(4)
	ep.queue.out <- Completion{Context: "ready"}
	require.False(t, ep.poller.callersPolling(), "no Next yet")
	c, err := ep.Next(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ready", c.Context)
	require.True(t, ep.poller.callersPolling(), "a Next answered by the channel")
	require.False(t, ep.poller.callersPolling(), "no Next since the last look")
}

// TestKickEndsStandingAside: a hybrid caller that gave up spinning kicks
// the completion goroutine and waits for it; the goroutine must poll at
// once, not stand aside again because of that caller's Next call.
func TestKickEndsStandingAside(t *testing.T) {
	ep := &Endpoint{mode: PollHybrid, poller: cqPoller{kick: make(chan struct{}, 1)}}
	ep.poller.nextCalls.Add(1) // a Next that spun
	ep.poller.wake()           // and left without a completion
	ep.poller.standAside()     // returns at once on the kick
	require.False(t, ep.poller.callersPolling(), "the kicking caller waits: poll now")
	ep.poller.nextCalls.Add(1) // a later Next still counts
	require.True(t, ep.poller.callersPolling())
}

// TestNotifyTakesItsCompletion: a completion for a request's Notify goes
// there, not to the channel; when Notify is full it waits in the queue
// and the delivery goroutine hands it over once there is room.
func TestNotifyTakesItsCompletion(t *testing.T) {
	ep := &Endpoint{}
	ep.queue.init(4)
	go ep.deliverLoop()
	mine := make(chan Completion, 1)
	q := &ep.queue
	q.mu.Lock()
	q.emit(Completion{Context: "a", to: mine})
	q.emit(Completion{Context: "b", to: mine}) // mine is full: queued
	q.emit(Completion{Context: "other"})       // in order behind b, as documented
	q.mu.Unlock()
	q.notify()
	got := <-mine
	require.Equal(t, "a", got.Context)
	require.Nil(t, got.to, "the reader does not see where it was sent")
	require.Equal(t, "b", (<-mine).Context)
	require.Equal(t, "other", (<-q.out).Context)
	q.mu.Lock()
	q.closed = true
	close(q.ended)
	q.mu.Unlock()
	q.notify()
	_, open := <-q.out
	require.False(t, open)
}
