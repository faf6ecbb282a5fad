// Package asyncevent reads the asynchronous events of a device
// (ibv_get_async_event) on Go's netpoller and hands each to the device's
// watchers: a QP's or CQ's failure, a port going down or up, the device's
// own failure. Left unread, these events would go unnoticed: a CQ that
// overran loses completions without a failed one to say so, and a QP can
// fail with no work posted to flush.
//
// One goroutine per device context reads while the context has a watcher:
// the first Watch starts it, the last stop ends it and waits for it.
package asyncevent

import (
	"sync"
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

	// mu guards watchers and is held while an event is handed out, so
	// that a watcher's stop returns only once its func is not running.
	mu       sync.Mutex
	watchers map[*watcher]struct{}
}

type watcher struct{ on func(verbs.AsyncEvent) }

var (
	// lifeMu orders starting and stopping readers.
	lifeMu  sync.Mutex
	readers = map[uintptr]*reader{} // by Context.Key
)

// Watch calls on with every asynchronous event of dev, from the reader's
// goroutine, until stop is called. on must not wait for anything that
// waits for stop. stop returns once on is not running and never will be
// again; call it once.
func Watch(dev *verbs.Context, on func(verbs.AsyncEvent)) (stop func(), err error) {
	lifeMu.Lock()
	defer lifeMu.Unlock()
	r := readers[dev.Key()]
	if r == nil {
		if r, err = start(dev); err != nil {
			return nil, err
		}
		readers[dev.Key()] = r
	}
	w := &watcher{on: on}
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
// (the device went away): then its watchers hear nothing more, as they
// would from a device with nothing to report, and learn of the end from
// their own objects.
func (r *reader) read() {
	defer close(r.done)
	for r.wait.Wait() == nil && r.getErr == nil {
		r.mu.Lock()
		for w := range r.watchers {
			w.on(r.ev)
		}
		r.mu.Unlock()
	}
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
	delete(readers, r.dev.Key())
	r.wait.Close()
	<-r.done
}

// LogPort logs ev to log if it is about port of device dev: the
// port going down at warn level, coming back at info level, anything else
// about it at debug level. RC retries carry a connection across a port
// that comes back within the transport's retry time, and a connection
// fails by itself if it does not, so a port's state is only logged.
func LogPort(log zerolog.Logger, ev verbs.AsyncEvent, port int, dev *verbs.Context) {
	if ev.Port != port {
		return
	}
	switch ev.Type {
	case verbs.AsyncPortErr:
		log.Warn().Str("device", dev.Name()).Int("port", port).Msg("the port went down (IBV_EVENT_PORT_ERR)")
	case verbs.AsyncPortActive:
		log.Info().Str("device", dev.Name()).Int("port", port).Msg("the port is up again (IBV_EVENT_PORT_ACTIVE)")
	default:
		log.Debug().Str("device", dev.Name()).Int("port", port).Stringer("event", ev.Type).Msg("asynchronous event")
	}
}
