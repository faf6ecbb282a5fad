package endpoint

// Stats counts what an endpoint did since it was created. The counts only
// grow; a rate is the difference of two snapshots over their interval.
type Stats struct {
	SendRequests  uint64 // work requests posted to the send queue: sends, writes, reads, atomics
	RecvRequests  uint64 // receives posted (not those of a shared receive queue)
	SendDoorbells uint64 // calls that posted send-queue work: one ibv_post_send each
	// SignaledSends counts the send-queue work requests posted signaled:
	// each comes back as a CQ entry of its own, and in event mode as a
	// wake-up; an unsignaled one comes back with the next signaled one.
	SignaledSends uint64
	RecvDoorbells uint64 // calls that posted receives: one ibv_post_recv each
	// Completions counts the work requests the device handed back, each
	// once: signaled or not (an unsignaled send comes back with the
	// signaled one after it), delivered or Silent, succeeded, failed or
	// flushed. Those Close completes itself after the QP is gone are not
	// counted.
	Completions uint64
	// Failed counts those the device failed (not flushed, not failed by
	// Close), and RNRRetryExceeded those of them that found no receive
	// posted at the peer (StatusRNRRetryExc).
	Failed           uint64
	RNRRetryExceeded uint64
	// CQEvents counts the completion events taken from the CQ's channel:
	// each is one wake-up of a goroutine that slept on it (event or
	// hybrid polling). Completions per event is what each wake-up
	// carried.
	CQEvents uint64
}

// SendsPerDoorbell is how many send-queue work requests each doorbell
// carried on average: what batching (PostBatch) saved. 0 before any send.
func (s Stats) SendsPerDoorbell() float64 {
	if s.SendDoorbells == 0 {
		return 0
	}
	return float64(s.SendRequests) / float64(s.SendDoorbells)
}

// CompletionsPerEvent is how many completions each CQ event carried on
// average: what one wake-up was worth. 0 before any event (busy polling
// takes none).
func (s Stats) CompletionsPerEvent() float64 {
	if s.CQEvents == 0 {
		return 0
	}
	return float64(s.Completions) / float64(s.CQEvents)
}

// Stats is a snapshot of the endpoint's counters; safe to call at any
// time, also after Close.
func (ep *Endpoint) Stats() Stats {
	if !ep.made() {
		return Stats{}
	}
	ep.mu.Lock()
	s := ep.stats
	ep.mu.Unlock()
	s.CQEvents = ep.poller.events.Load()
	return s
}

// countPosted adds a post call's work requests to the counters: the send
// slots it posted and how many receives; ep.mu is held.
func (ep *Endpoint) countPosted(sends []uint32, recvs int) {
	if len(sends) > 0 {
		ep.stats.SendRequests += uint64(len(sends))
		ep.stats.SendDoorbells++
	}
	for _, idx := range sends {
		if ep.sends.slots[idx].signaled {
			ep.stats.SignaledSends++
		}
	}
	if recvs > 0 {
		ep.stats.RecvRequests += uint64(recvs)
		ep.stats.RecvDoorbells++
	}
}

// countCompleted counts one completion; ep.mu is held.
func (ep *Endpoint) countCompleted(err error) {
	ep.stats.Completions++
	if ce, ok := err.(*CompletionError); ok && ce.Status != StatusFlushed && ce.closedBy == nil {
		ep.stats.Failed++
		if ce.Status == StatusRNRRetryExc {
			ep.stats.RNRRetryExceeded++
		}
	}
}
