package msg

import (
	"errors"
	"testing"
	"time"
)

// TestSilenceRule: silence past the timeout ends the connection only while
// the peer could have sent: it has a credit and no rendezvous read is in
// flight either way (its messages wait behind that READ or its responses).
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
