package endpoint

import (
	"fmt"
	"time"

	"github.com/go-rdma/rdmacm/internal/asyncevent"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// deviceEvent is what an asynchronous event of the endpoint's device does
// to it (package asyncevent calls it for every event of the device).
//
// A CQ that overran has lost completions, so the contexts it owes can
// only come back from the close, and a device that failed completes
// nothing more: either ends the endpoint at once, as a failed CQ poll
// does (failHere). A QP that failed (IBV_EVENT_QP_FATAL, QP_REQ_ERR,
// QP_ACCESS_ERR) ends it as a failed work request does, after
// failureGrace, so that the CM's word on why comes first: the peer's
// going is what fails siw's QP here. Without the event, a QP that failed
// with nothing posted would leave the connection looking up.
//
// A change of its port's state is logged (asyncevent.LogPort).
func (ep *Endpoint) deviceEvent(ev verbs.AsyncEvent) {
	if !ep.live.Load() {
		return
	}
	dev := ep.id.Context()
	cause := func() error {
		return fmt.Errorf("%w (%s: %v): %w", ErrDeviceFailure, dev.Name(), ev.Type, ErrClosed)
	}
	switch {
	case ev.Type == verbs.AsyncCQErr && ev.Element == ep.cq.Key(), ev.Type == verbs.AsyncDeviceFatal:
		if err := cause(); ep.endWith(err) {
			ep.cfg.Logger.Error().Err(err).Msg("closing the endpoint")
		}
		ep.poller.wake()
	case ev.Type.EndsQP() && ev.Element == ep.id.QPKey():
		ep.qpFailedOnDevice(ep.whileLocalFault(cause()))
	default:
		asyncevent.LogPort(ep.cfg.Logger, ev, ep.id.PortNum(), dev)
	}
}

// qpFailedOnDevice ends the connection with cause after failureGrace,
// unless the CM's word, a failed work request or Close ends it first, as
// completionError does for a failed request: posts are refused with cause
// meanwhile, since the device completes nothing posted to a failed QP.
func (ep *Endpoint) qpFailedOnDevice(cause error) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closing || ep.failure != nil || ep.ended() {
		return
	}
	if ep.failing != nil {
		ep.failing.Stop() // an unexplained flush's: this explains it
	}
	ep.failure = cause
	ep.failing = time.AfterFunc(failureGrace, func() { ep.endFailed(cause) })
	ep.cfg.Logger.Debug().Err(cause).Msg("the QP failed")
}
