package msg

import (
	"time"

	"github.com/go-rdma/rdmacm/endpoint"
)

// Stats counts what a connection did since it was made. The counts only
// grow; a rate is the difference of two snapshots over their interval.
type Stats struct {
	Endpoint endpoint.Stats // its queue pair's: posts, doorbells, completions
	// Every message on the wire, the protocol's own included; of those
	// sent, CreditMessagesSent carried nothing but credits (keepalives
	// are such messages too).
	MessagesSent, MessagesReceived uint64
	CreditMessagesSent             uint64
	// CreditWaits counts the sends that found no credit to spend and
	// waited for the peer to grant one: the peer read slowly, or the
	// receive depth is too small for the traffic.
	CreditWaits uint64
	// Messages that asked for credits (sent) and that the peer sent
	// asking (received): their sender's data waited for credits the
	// other side had to grant. A side asks only while the other's
	// receives have room for its data, so credit waits without asks mean
	// the peer's application holds the messages it received: it reads
	// slowly, or keeps them without releasing them.
	CreditAsksSent, CreditAsksReceived uint64
	// Messages larger than the inline size go by rendezvous: the receiver
	// reads them from the sender's memory with RDMA READ.
	RendezvousSent, RendezvousReceived           uint64
	RendezvousBytesSent, RendezvousBytesReceived uint64
	// Regions for rendezvous messages (both directions) and one-sided
	// operations taken from the connection's cache (hits) and mapped and
	// registered anew (misses) (WithRendezvousCache).
	RegionCacheHits, RegionCacheMisses uint64
	// KeepaliveRTT is the last keepalive's round trip (WithKeepalive):
	// from its post until the device completed it. On RC over InfiniBand
	// or RoCE a send completes when the peer's device acknowledges it, so
	// this is the link's round trip plus this side's completion path; on
	// iWARP a send completes once TCP has taken it, so it is the local
	// part only. 0 until a keepalive has completed.
	KeepaliveRTT time.Duration
}

// Stats is a snapshot of the connection's counters; safe to call at any
// time, also after Close.
func (c *Conn) Stats() Stats {
	if !c.made() {
		return Stats{}
	}
	c.mu.Lock()
	s := c.stats
	c.mu.Unlock()
	s.RegionCacheHits, s.RegionCacheMisses = c.rv.counts()
	s.Endpoint = c.ep.Stats()
	return s
}

// ClientStats counts a Client's calls.
type ClientStats struct {
	Calls         uint64 // calls made
	CallsInFlight int    // calls waiting for their response now
	Conn          Stats  // the client's connection's
}

// Stats is a snapshot of the client's counters.
func (cl *Client) Stats() ClientStats {
	if !cl.made() {
		return ClientStats{}
	}
	cl.mu.Lock()
	s := ClientStats{Calls: cl.nextID, CallsInFlight: len(cl.pending)}
	cl.mu.Unlock()
	s.Conn = cl.c.Stats()
	return s
}

// ServerStats counts a Server's calls and connections.
type ServerStats struct {
	// Calls answered, with a response or an error, counted once the
	// answer has gone to the connection; Errors are those answered with an
	// error. CallsInFlight are being handled or answered now.
	Calls, Errors uint64
	CallsInFlight int

	Conns []Stats // one for each connection open now
}

// Stats is a snapshot of the server's counters.
func (s *Server) Stats() ServerStats {
	if s == nil {
		return ServerStats{}
	}
	s.mu.Lock()
	st := ServerStats{Calls: s.calls, Errors: s.errors, CallsInFlight: s.active}
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		st.Conns = append(st.Conns, c.Stats())
	}
	return st
}
