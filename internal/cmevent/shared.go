package cmevent

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// The connected ids of a process (package cm's listeners, dialers and
// accepted connections) share one CM event channel, as librdmacm's own
// tools do: an id costs no channel of its own (an open of the rdma_cm
// device, a dup and a netpoller registration to make and undo), and one
// read serves a burst of events for many ids. One goroutine reads the
// channel and hands each event to the Queue of the id it is for. The
// channel lives while some Queue does: the first NewQueue opens it and
// starts that goroutine, the last Close stops it and destroys the channel.
//
// rdma_destroy_id waits until every event of the id that has been read is
// acked, so no event may stay held for an id about to be destroyed: a
// Queue acks what it holds when it stops, and the reader acks at once any
// event for an id no Queue takes.

// Event is one CM event taken from a Queue. The taker acks it.
type Event struct {
	*verbs.Event
	// Queue is, for a CONNECT_REQUEST, the queue of the request's new id
	// (Event.ID): its later events arrive there. The taker owns it.
	Queue *Queue
}

// Queue is one id's events on the shared channel. One goroutine at a time
// takes them (Next).
type Queue struct {
	s     *shared
	key   uintptr // the bound id's key; 0 before one is bound
	items []Event
	// stopped: Next fails, and events for the id are acked on arrival.
	stopped bool
	ready   chan struct{} // a token when items grew or the queue stopped
}

// shared is one open channel and its reader, the only goroutine that
// waits on it.
type shared struct {
	ch   *Channel
	done chan struct{} // closed when the reader returns

	mu     sync.Mutex
	queues map[uintptr]*Queue // by id key
	refs   int                // Queues not yet closed
	err    error              // the read error that stopped the reader
}

var (
	// lifeMu orders opening and closing the shared channel.
	lifeMu  sync.Mutex
	current *shared
)

// errStopped is what Next returns once the queue is stopped.
var errStopped = fmt.Errorf("cmevent: the queue stopped: %w", os.ErrClosed)

// NewQueue takes a share of the process's channel, opening it if no Queue
// holds it. Bind an id to the queue (CreateID, Adopt) before the id can
// have events; Close the queue when done.
func NewQueue() (*Queue, error) {
	lifeMu.Lock()
	defer lifeMu.Unlock()
	s := current
	if s != nil {
		s.mu.Lock()
		if s.err == nil {
			s.refs++
			s.mu.Unlock()
			return s.newQueue(), nil
		}
		s.mu.Unlock() // a broken channel: it goes with its last Queue
	}
	s, err := openShared()
	if err != nil {
		return nil, err
	}
	current = s
	s.refs = 1
	return s.newQueue(), nil
}

func openShared() (*shared, error) {
	ch, err := New()
	if err != nil {
		return nil, err
	}
	s := &shared{ch: ch, done: make(chan struct{}), queues: make(map[uintptr]*Queue)}
	go s.read()
	return s, nil
}

func (s *shared) newQueue() *Queue { return &Queue{s: s, ready: make(chan struct{}, 1)} }

// read hands out events until the channel closes (the last Queue went) or
// a read fails; then every Queue's Next reports the failure.
func (s *shared) read() {
	defer close(s.done)
	for {
		if err := s.ch.wait.Wait(); err != nil {
			return // closed by the last Queue's Close
		}
		ev, err := s.ch.taken()
		if err != nil {
			s.mu.Lock()
			s.err = err
			for _, q := range s.queues {
				q.wake()
			}
			s.mu.Unlock()
			return
		}
		s.dispatch(ev)
	}
}

// dispatch queues ev for its id: a connect request for its listener's id,
// with a new Queue bound to the request's id, before the next read can
// bring that id's next event.
func (s *shared) dispatch(ev *verbs.Event) {
	request := ev.Type == verbs.EventConnectRequest
	key := ev.ID.Key()
	if request && ev.ListenID != nil {
		key = ev.ListenID.Key()
	}
	s.mu.Lock()
	q := s.queues[key]
	if q == nil || q.stopped {
		s.mu.Unlock()
		discard(Event{Event: ev})
		return
	}
	e := Event{Event: ev}
	if request {
		e.Queue = s.newQueue()
		e.Queue.key = ev.ID.Key()
		s.queues[e.Queue.key] = e.Queue
		s.refs++
	}
	q.items = append(q.items, e)
	q.wake()
	s.mu.Unlock()
}

// discard acks an event nobody takes; a connect request's new id is
// rejected and destroyed, and its queue, if it has one, closed.
func discard(e Event) {
	e.Ack()
	if e.Type != verbs.EventConnectRequest {
		return
	}
	e.ID.Reject(nil)
	if e.Queue != nil {
		e.Queue.Close(e.ID.Destroy)
	} else {
		e.ID.Destroy()
	}
}

// wake leaves a token for Next; s.mu is held.
func (q *Queue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// CreateID creates an id of port space ps on the shared channel, bound to q.
func (q *Queue) CreateID(ps verbs.PortSpace) (*verbs.CMID, error) {
	id, err := verbs.CreateID(q.s.ch.EC, ps)
	if err != nil {
		return nil, err
	}
	q.bind(id)
	return id, nil
}

// Adopt moves id's events to the shared channel (rdma_migrate_id) and
// binds it to q. id must have no events pending.
func (q *Queue) Adopt(id *verbs.CMID) error {
	if err := id.Migrate(q.s.ch.EC); err != nil {
		return err
	}
	q.bind(id)
	return nil
}

func (q *Queue) bind(id *verbs.CMID) {
	q.s.mu.Lock()
	q.key = id.Key()
	q.s.queues[q.key] = q
	q.s.mu.Unlock()
}

// Next returns the id's next event, waiting until ctx ends or the queue
// stops (an error matching os.ErrClosed). The caller acks the event.
func (q *Queue) Next(ctx context.Context) (Event, error) {
	for {
		q.s.mu.Lock()
		switch {
		case q.stopped:
			q.s.mu.Unlock()
			return Event{}, errStopped
		case len(q.items) > 0:
			e := q.items[0]
			q.items[0] = Event{}
			q.items = q.items[1:]
			q.s.mu.Unlock()
			return e, nil
		case q.s.err != nil:
			err := q.s.err
			q.s.mu.Unlock()
			return Event{}, fmt.Errorf("cmevent: reading the shared channel: %w", err)
		}
		q.s.mu.Unlock()
		select {
		case <-q.ready:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// StopWaiting makes a Next in progress, and every later one, fail with an
// error matching os.ErrClosed. The events the queue holds are acked (a
// connect request's new id rejected and destroyed), and later ones are
// acked as they arrive, so the id can be destroyed. Idempotent.
func (q *Queue) StopWaiting() {
	q.s.mu.Lock()
	if q.stopped {
		q.s.mu.Unlock()
		return
	}
	q.stopped = true
	held := q.items
	q.items = nil
	q.wake()
	q.s.mu.Unlock()
	for _, e := range held {
		discard(e)
	}
}

// Close stops the queue, calls destroyID (nil if no id was bound) now that
// none of the id's events is held, and gives up q's share of the channel:
// the last share closes it. It returns destroyID's error. Call it once.
func (q *Queue) Close(destroyID func() error) error {
	q.StopWaiting()
	var err error
	if destroyID != nil {
		err = destroyID()
	}
	s := q.s
	lifeMu.Lock()
	defer lifeMu.Unlock()
	s.mu.Lock()
	if q.key != 0 && s.queues[q.key] == q {
		delete(s.queues, q.key)
	}
	s.refs--
	last := s.refs == 0
	s.mu.Unlock()
	if last {
		if current == s {
			current = nil
		}
		s.ch.StopWaiting()
		<-s.done
		s.ch.Destroy()
	}
	return err
}
