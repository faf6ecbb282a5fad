package dgram

import "sync/atomic"

// Stats counts what a Conn did since it was made. The counts only grow; a
// rate is the difference of two snapshots over their interval.
type Stats struct {
	// DatagramsSent and BytesSent count the datagrams posted to the
	// device and their payload bytes. Unreliable datagrams are not
	// acknowledged: a datagram sent may still be dropped on the way or
	// by a receiver with no receive posted.
	DatagramsSent, BytesSent uint64
	// Posts counts the post calls (doorbells) that sent them: a
	// WriteBatch posts as many as the free send slots take in one.
	Posts uint64
	// DatagramsReceived and BytesReceived count the datagrams handed to
	// readers and their payload bytes as they arrived, truncated or not.
	DatagramsReceived, BytesReceived uint64
	// Truncated counts the datagrams received longer than the reader's
	// buffer (Message.Truncated).
	Truncated uint64
	// Discarded counts the datagrams that arrived but reached no reader:
	// a failed receive, no readable sender address, or, on a Conn from
	// Dial, a sender other than its peer.
	Discarded uint64
}

// counters are a Conn's Stats, updated by readers and writers under
// their own direction's mutex and read by Stats under neither.
type counters struct {
	datagramsSent, bytesSent, posts         atomic.Uint64
	datagramsReceived, bytesReceived, trunc atomic.Uint64
	discarded                               atomic.Uint64
}

// Stats is a snapshot of the Conn's counters; safe to call at any time,
// also after Close.
func (c *Conn) Stats() Stats {
	if !c.ok() {
		return Stats{}
	}
	s := &c.stats
	return Stats{
		DatagramsSent: s.datagramsSent.Load(), BytesSent: s.bytesSent.Load(), Posts: s.posts.Load(),
		DatagramsReceived: s.datagramsReceived.Load(), BytesReceived: s.bytesReceived.Load(),
		Truncated: s.trunc.Load(), Discarded: s.discarded.Load(),
	}
}
