// Package asyncevent reads the asynchronous events of a device
// (ibv_get_async_event) on Go's netpoller and hands each to the device's
// watchers: a QP's or CQ's failure, a port going down or up, the device's
// own failure. Left unread, these events would go unnoticed: a CQ that
// overran loses completions without a failed one to say so, and a QP can
// fail with no work posted to flush.
//
// One goroutine per device context reads while the context has a watcher:
// the first Watch starts it, the last stop ends it and waits for it. A
// reader whose read fails tells its watchers' logs and stops; the next
// Watch on the context starts another.
package asyncevent

import (
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/internal/fdwait"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// reader is one device context's event reader and its watchers.
type reader struct {
	dev  *verbs.Context
	wait *fdwait.Waiter
	done chan struct{} // closed when read returns

	// what the last take found
	ev     verbs.AsyncEvent
	getErr error

	stopping atomic.Bool // the last watcher stopped it: a failed Wait is no loss
	dead     atomic.Bool // a read failed: read has returned

	// mu guards watchers and is held while an event is handed out, so
	// that a watcher's stop returns only once its func is not running.
	mu       sync.Mutex
	watchers map[*watcher]struct{}
}

type watcher struct {
	on  func(verbs.AsyncEvent)
	log zerolog.Logger
}

var (
	// lifeMu orders starting and stopping readers.
	lifeMu  sync.Mutex
	readers = map[uintptr]*reader{} // by Context.Key
)

// Watch calls on with every asynchronous event of dev, from the reader's
// goroutine, until stop is called. on must not wait for anything that
// waits for stop. stop returns once on is not running and never will be
// again; call it once. If the events can no longer be read, log says so
// at error level, and on hears nothing more.
func Watch(dev *verbs.Context, on func(verbs.AsyncEvent), log zerolog.Logger) (stop func(), err error) {
	lifeMu.Lock()
	defer lifeMu.Unlock()
	r := readers[dev.Key()]
	if r == nil || r.dead.Load() {
		if r, err = start(dev); err != nil {
			return nil, err
		}
		readers[dev.Key()] = r
	}
	w := &watcher{on: on, log: log}
	r.mu.Lock()
	r.watchers[w] = struct{}{}
	r.mu.Unlock()
	return func() { r.unwatch(w) }, nil
}

func start(dev *verbs.Context) (*reader, error) {
	fd, err := dev.PrepareAsync()
	if err != nil {
		return nil, err
	}
	r := &reader{dev: dev, done: make(chan struct{}), watchers: map[*watcher]struct{}{}}
	if r.wait, err = fdwait.New(fd, "async event descriptor of "+dev.Name(), r.take); err != nil {
		return nil, err
	}
	go r.read()
	return r, nil
}

// take is the non-blocking read fdwait calls: false when no event is pending.
func (r *reader) take() bool {
	r.ev, r.getErr = r.dev.GetAsyncEvent()
	return r.getErr != syscall.EAGAIN
}

// read hands out events until the last watcher stops it, or a read fails
// (the device went away, say). Then each watcher's log says that its
// device's failures will go unnoticed, which is all that changes: each
// connection still learns of its own end from its own objects. The
// reader is dead from then on, and the next Watch starts another.
func (r *reader) read() {
	defer close(r.done)
	var err error
	for {
		if err = r.wait.Wait(); err == nil {
			err = r.getErr
		}
		if err != nil {
			break
		}
		r.mu.Lock()
		for w := range r.watchers {
			w.on(r.ev)
		}
		r.mu.Unlock()
	}
	if r.stopping.Load() {
		return
	}
	r.dead.Store(true)
	r.mu.Lock()
	for w := range r.watchers {
		w.log.Error().Err(err).Str("device", r.dev.Name()).
			Msg("the device's asynchronous events can no longer be read: a CQ overrun, a QP's or the device's failure goes unnoticed")
	}
	r.mu.Unlock()
}

// unwatch removes w; the last watcher stops the reader and waits for it.
func (r *reader) unwatch(w *watcher) {
	lifeMu.Lock()
	defer lifeMu.Unlock()
	r.mu.Lock()
	delete(r.watchers, w)
	last := len(r.watchers) == 0
	r.mu.Unlock()
	if !last {
		return
	}
	if readers[r.dev.Key()] == r { // a dead one may have a successor
		delete(readers, r.dev.Key())
	}
	r.stopping.Store(true)
	r.wait.Close()
	<-r.done
}

// LogPort logs ev to log if it is about port of device dev: the
// port going down at warn level, coming back and a change of its GID
// table at info level, anything else about it at debug level. RC retries
// carry a connection across a port that comes back within the
// transport's retry time, and a connection fails by itself if it does
// not, so a port's state is only logged. A GID table change is logged
// for what may follow it: RoCE derives the table from the netdev's
// addresses, and when they change (its MAC address, say) Soft-RoCE
// re-creates every entry, and a connection made on the old entry fails
// its next request with a bare local QP operation error, though its port
// is active and its IP address assigned.
func LogPort(log zerolog.Logger, ev verbs.AsyncEvent, port int, dev *verbs.Context) {
	if ev.Port != port {
		return
	}
	switch ev.Type {
	case verbs.AsyncPortErr:
		log.Warn().Str("device", dev.Name()).Int("port", port).Msg("the port went down (IBV_EVENT_PORT_ERR)")
	case verbs.AsyncPortActive:
		log.Info().Str("device", dev.Name()).Int("port", port).Msg("the port is up again (IBV_EVENT_PORT_ACTIVE)")
	case verbs.AsyncGIDChange:
		log.Info().Str("device", dev.Name()).Int("port", port).
			Msg("the port's GID table changed (IBV_EVENT_GID_CHANGE): a connection whose source GID entry was re-created fails its next request")
	default:
		log.Debug().Str("device", dev.Name()).Int("port", port).Stringer("event", ev.Type).Msg("asynchronous event")
	}
}
