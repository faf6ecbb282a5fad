package msg

import (
	"errors"
	"testing"
	"time"
)

// TestSilenceRule: silence past the timeout ends the connection only while
// the peer could have sent: it has two credits (it spends its last only
// with credits to grant) and no rendezvous read is in flight either way
// (its messages wait behind that READ or its responses).
func TestSilenceRule(t *testing.T) {
	start := time.Unix(1000, 0)
	later := start.Add(3 * time.Second)
	newConn := func() *Conn {
		return &Conn{o: options{recvDepth: 4, keepaliveTimeout: 2 * time.Second}, lastRecv: start,
			rvSend: map[uint64]*pendingRendezvous{}}
	}

	c := newConn()
	if err := c.checkSilence(later); !errors.Is(err, ErrPeerSilent) || !errors.Is(err, ErrClosed) {
		t.Fatalf("silent peer with credits: got %v, want ErrPeerSilent and ErrClosed", err)
	}

	c = newConn()
	c.receivedTotal = 4 // the peer used every credit: this side holds it back
	if err := c.checkSilence(later); err != nil {
		t.Fatalf("peer without credits: got %v, want nil", err)
	}

	c = newConn()
	c.receivedTotal = 3 // the peer has its last credit, perhaps nothing to grant
	if err := c.checkSilence(later); err != nil {
		t.Fatalf("peer with its last credit: got %v, want nil", err)
	}
	c.granted = 1 // now it has two: silence counts from then
	if err := c.checkSilence(later.Add(3 * time.Second)); !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("silent peer with two credits: got %v, want ErrPeerSilent", err)
	}

	c = newConn()
	c.rvSend[1] = &pendingRendezvous{}
	if err := c.checkSilence(later); err != nil {
		t.Fatalf("peer reading a rendezvous region: got %v, want nil", err)
	}
	delete(c.rvSend, 1) // the read is done: silence counts again, from then
	if err := c.checkSilence(later.Add(time.Second)); err != nil {
		t.Fatalf("1 s after the read: got %v, want nil", err)
	}
	if err := c.checkSilence(later.Add(3 * time.Second)); !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("3 s after the read: got %v, want ErrPeerSilent", err)
	}

	c = newConn()
	c.reading = 1 // this side reads one of the peer's regions
	if err := c.checkSilence(later); err != nil {
		t.Fatalf("reading the peer's rendezvous region: got %v, want nil", err)
	}
	c.reading = 0
	if err := c.checkSilence(later.Add(3 * time.Second)); !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("3 s after our read: got %v, want ErrPeerSilent", err)
	}
}

// tick is how often tickingConn's control loop checks (half its keepalive).
const tick = 500 * time.Millisecond

// tickingConn is a connection whose peer was last heard at start, with a
// 1 s keepalive and a 3 s timeout.
func tickingConn() (c *Conn, start time.Time) {
	start = time.Unix(1000, 0)
	o := options{recvDepth: 4, keepalive: 2 * tick, keepaliveTimeout: 3 * time.Second}
	return &Conn{o: o, checkEvery: o.checkEvery(o.keepalive),
		lastRecv: start, rvSend: map[uint64]*pendingRendezvous{}}, start
}

// TestSilenceRuleSkipsOwnStalls: time in which this side did not run (its
// checks came far apart) is not the peer's silence, and a peer that stays
// silent once this side runs again is still caught.
func TestSilenceRuleSkipsOwnStalls(t *testing.T) {
	c, start := tickingConn()
	at := start
	check := func() error { return c.checkSilence(at) }
	for ; !at.After(start.Add(1500 * time.Millisecond)); at = at.Add(tick) {
		if err := check(); err != nil {
			t.Fatalf("%v of silence: got %v, want nil", at.Sub(start), err)
		}
	}
	at = at.Add(30 * time.Second) // the next tick came 30 s late: this process was stopped
	if err := check(); err != nil {
		t.Fatalf("first check after this side stalled 30 s: got %v, want nil", err)
	}
	// 1.5 s of silence before the stall and one tick after it: the peer
	// has 1 s left, so the third tick from here finds it silent.
	for range 2 {
		at = at.Add(tick)
		if err := check(); err != nil {
			t.Fatalf("%v: got %v, want nil", at.Sub(start), err)
		}
	}
	at = at.Add(tick)
	if err := check(); !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("peer still silent 3.5 s of running time on: got %v, want ErrPeerSilent", err)
	}
}

// TestSilenceRuleStallThenMessage: a message taken right after this side's
// stall ends the silence; the stall is not discounted again on top of it,
// so a peer silent from then on is caught a timeout later.
func TestSilenceRuleStallThenMessage(t *testing.T) {
	c, start := tickingConn()
	if err := c.checkSilence(start); err != nil {
		t.Fatal(err)
	}
	at := start.Add(20 * time.Second) // stopped for 20 s
	c.lastRecv = at.Add(-10 * time.Millisecond)
	heard := c.lastRecv
	for ; !at.After(heard.Add(3 * time.Second)); at = at.Add(tick) {
		if err := c.checkSilence(at); err != nil {
			t.Fatalf("%v after the message: got %v, want nil", at.Sub(heard), err)
		}
	}
	if err := c.checkSilence(at); !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("%v after the message: got %v, want ErrPeerSilent", at.Sub(heard), err)
	}
}

// TestKeepaliveKeepsToThePeer: a side sends keepalives at least every half
// of the silence the peer tolerates (its hello), though not more often
// than minPeerKeepalive for the peer alone, sooner if its own interval
// says so, and never only when neither asks; its control loop
// checks twice as often, or, sending none, four times per own timeout.
func TestKeepaliveKeepsToThePeer(t *testing.T) {
	s := time.Second
	for _, c := range []struct{ own, peerSilence, want time.Duration }{
		{2 * s, 10 * s, 2 * s},
		{2 * s, 2 * s, s},
		{0, 10 * s, 5 * s},
		{time.Minute, 10 * s, 5 * s},
		{2 * s, 0, 2 * s},
		{0, 0, 0},
		{2 * s, time.Millisecond, minPeerKeepalive}, // no more often than that for the peer
		{0, time.Nanosecond, minPeerKeepalive},
		{time.Millisecond, time.Second, time.Millisecond}, // this side's own choice
	} {
		if got := keepaliveEvery(c.own, c.peerSilence); got != c.want {
			t.Errorf("own %v, peer's silence %v: every %v, want %v", c.own, c.peerSilence, got, c.want)
		}
	}
	o := options{keepaliveTimeout: 8 * s}
	if got := o.checkEvery(2 * s); got != s {
		t.Errorf("sending every 2 s: checks every %v, want 1s", got)
	}
	if got := o.checkEvery(0); got != 2*s {
		t.Errorf("sending none, 8 s timeout: checks every %v, want 2s", got)
	}
	if got := (options{}).checkEvery(0); got != 0 {
		t.Errorf("neither: checks every %v, want never", got)
	}
}
