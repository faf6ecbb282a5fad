// The credit model is built without the race detector only, and make
// test-host runs it on its own: it is one goroutine exploring millions of
// states, in which the detector has no race to find and only costs time
// and memory.

//go:build !race

package msg

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The credit model: two sides that follow creditState's rules, every
// order of their sends, deliveries and application releases. A side's
// application has some messages of data to send (want), releases at
// most a few of those it receives (rel; it holds the rest for ever) and
// may come to owe the peer a confirmation (a rendezvous done).
//
// A side may also be a stream's (rdmanet's Conn): its data follows the
// stream's hold rule (holdingLocked, at the holdAt its peer's hello
// gives). A side's application may drain, as a stream's reader does: it
// releases every message it receives, each in its own time, before it
// waits for more; its hello says so.
//
// The two properties checked are the ones a Conn must keep:
//   - no deadlock: data whose peer has room for it, or a confirmation,
//     never waits in a state where nothing else can happen either;
//   - no chatter: control messages and their deliveries alone never
//     cycle, which is two sides trading credit messages for ever.

// modelMsg is a message on its way: data or control, the credits it
// grants, its FlagWantsCredit, and its sender's room for data (what
// Header.Released tells: its depth plus the data it released in all).
type modelMsg struct {
	data   bool
	ask    bool
	grants int8
	room   int8
}

// packed is mm in 14 bits, which keeps a state, a key of the model's map
// of millions, small: grants and room in 6 bits each (a count of the
// model's depth at most, and room twice that), then ask and data.
func (mm modelMsg) packed() uint16 {
	if mm.grants < 0 || mm.grants > 63 || mm.room < 0 || mm.room > 63 {
		panic(fmt.Sprintf("model message %+v out of its packing's range", mm))
	}
	p := uint16(mm.grants) | uint16(mm.room)<<6
	if mm.ask {
		p |= 1 << 12
	}
	if mm.data {
		p |= 1 << 13
	}
	return p
}

func unpackMsg(p uint16) modelMsg {
	return modelMsg{grants: int8(p & 63), room: int8(p >> 6 & 63), ask: p&(1<<12) != 0, data: p&(1<<13) != 0}
}

// modelQueue is one direction's messages in flight, in order, packed. A
// side holds at most depth credits, so depth bounds it.
type modelQueue struct {
	n int8
	m [modelMaxDepth]uint16
}

const modelMaxDepth = 8

// modelSide is one side's counts (see creditState for their meaning).
type modelSide struct {
	credits, peerCredits  int8
	toGrantData           int8 // of the receives to grant, released data's
	toGrantControl        int8 // of the receives to grant, control messages'
	held                  int8 // data the application holds
	want                  int8 // data the application has yet to send
	rel                   int8 // data the application will still release
	confirm, confirmLater int8 // confirmations owed now, and later
	peerRoom              int8
	sent, received        int8 // data in all
	peerAsks, asked       bool
	// stream: this side's data is held, not sent, while its credits are
	// at or below holdAt. drains: its application releases every message
	// it receives (rel is not counted down), and its hello says it reads
	// as a stream.
	stream, drains bool
}

type modelState struct {
	side [2]modelSide
	q    [2]modelQueue // q[i]: from side i to the other
}

// String shows st with its messages in flight unpacked, for a failure's
// message.
func (st modelState) String() string {
	var b strings.Builder
	for i := range 2 {
		fmt.Fprintf(&b, "side %d %+v, in flight to the peer [", i, st.side[i])
		for j, p := range st.q[i].m[:st.q[i].n] {
			if j > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%+v", unpackMsg(p))
		}
		b.WriteString("]; ")
	}
	return strings.TrimSuffix(b.String(), "; ")
}

type creditModel struct{ depth int }

// holdAt is Conn.holdAt facing peer, of the model's depth.
func (m creditModel) holdAt(peer modelSide) int8 {
	return int8(holdAt(hello{recvDepth: m.depth, streamReader: peer.drains}))
}

// rules is what creditState sees on side i; side 0 dialed.
func (m creditModel) rules(x modelSide, i int) creditState {
	return creditState{
		credits:     int(x.credits),
		toGrant:     int(x.toGrantData + x.toGrantControl),
		grantAt:     m.depth / 2,
		released:    x.toGrantData > 0,
		peerCredits: int(x.peerCredits),
		peerWants:   x.peerAsks,
		dataWaits:   x.want > 0,
		peerRoom:    int(x.peerRoom),
		dialer:      i == 0,
	}
}

// send has side i take a credit for mm, stamp it as stampLocked does and
// queue it.
func (m creditModel) send(st *modelState, i int, mm modelMsg) {
	x := &st.side[i]
	x.credits--
	mm.grants = x.toGrantData + x.toGrantControl
	x.peerCredits += mm.grants
	x.toGrantData, x.toGrantControl = 0, 0
	mm.room = int8(m.depth) + x.received - x.held
	x.asked = m.rules(*x, i).wantsCredit()
	mm.ask = x.asked
	q := &st.q[i]
	q.m[q.n] = mm.packed()
	q.n++
}

// step is one transition: control says it is a control message sent or
// a delivery, which alone must not cycle; optional, a release that an
// application that holds messages may never make (one that drains
// always does, in time).
type step struct {
	next              modelState
	control, optional bool
}

func (m creditModel) steps(st modelState, out []step) []step {
	for i := range 2 {
		x := st.side[i]
		r := m.rules(x, i)
		if x.held > 0 && (x.rel > 0 || x.drains) { // the application releases a message
			n := st
			n.side[i].held--
			if !x.drains {
				n.side[i].rel--
			}
			n.side[i].toGrantData++
			out = append(out, step{next: n, optional: !x.drains})
		}
		// A stream's message that a write does not fill is held while
		// its credits are at or below holdAt (holdingLocked): facing a
		// stream's reader, while that peer owes half its receives or
		// more. A write that fills it sends it anyway; the model leaves
		// that out, the worst case for a last write.
		held := x.stream && x.credits <= m.holdAt(st.side[1-i])
		if x.want > 0 && r.dataMayGo() && !held { // a send
			n := st
			n.side[i].want--
			n.side[i].peerRoom--
			n.side[i].sent++
			m.send(&n, i, modelMsg{data: true})
			out = append(out, step{next: n})
		}
		if x.confirmLater > 0 {
			n := st
			n.side[i].confirmLater--
			n.side[i].confirm++
			out = append(out, step{next: n})
		}
		// Data that may go carries the credits owed, and goes first: a
		// Send that waits for a credit (controlLoop's creditWaiters), or
		// a stream's message no longer held (the control loop posts it
		// before it looks at what it owes). A held message waits for the
		// credits themselves.
		sendWaits := x.want > 0 && !held
		if r.controlOwed(x.confirm > 0, x.asked, sendWaits) && r.mayControl() {
			n := st
			if n.side[i].confirm > 0 {
				n.side[i].confirm--
			}
			m.send(&n, i, modelMsg{})
			out = append(out, step{next: n, control: true})
		}
		if q := st.q[i]; q.n > 0 { // the peer receives the oldest
			n := st
			mm := unpackMsg(q.m[0])
			copy(n.q[i].m[:], q.m[1:q.n])
			n.q[i].n--
			n.q[i].m[n.q[i].n] = 0
			y := &n.side[1-i]
			y.credits += mm.grants
			y.peerCredits--
			y.peerAsks = mm.ask
			y.peerRoom = mm.room - y.sent
			if mm.data {
				y.received++
				y.held++
			} else {
				y.toGrantControl++ // reposted at once
			}
			out = append(out, step{next: n, control: true})
		}
	}
	return out
}

// stuck says st is a deadlock: nothing but releases an application may
// never make can happen, yet a side has data the peer has room for, or a
// confirmation to send.
func (m creditModel) stuck(st modelState, steps []step) bool {
	for _, s := range steps {
		if !s.optional {
			return false
		}
	}
	for i := range 2 {
		peerFree := m.depth - int(st.side[1-i].held)
		if st.side[i].want > 0 && peerFree > dataReserve || st.side[i].confirm > 0 && peerFree > 0 {
			return true
		}
	}
	return false
}

// explore visits every state reachable from the starts and reports a
// deadlock or a cycle of control steps alone, whichever it meets first.
//
// It is one search that looks each step's state up once. A state waits
// in queue until it is expanded: its steps made and checked for a
// deadlock. A state is expanded as a frame of a depth-first search of
// the control steps alone, whose path is the states whose control steps
// are still being followed: a control step to a state on the path closes
// a cycle. A control step to a state not yet expanded extends the path;
// any other step queues its state, where a later search starts from it
// unless one reached it first.
func (m creditModel) explore(starts []modelState) (states int, err error) {
	const (
		queued   = iota + 1 // reached, not yet expanded
		onPath              // expanded, its control steps still followed
		finished            // expanded, no control cycle through it
	)
	mark := make(map[modelState]uint8)
	queue := append([]modelState(nil), starts...)
	for _, s := range starts {
		mark[s] = queued
	}
	// The control steps a frame of path has yet to follow are
	// pending[from:], below those of the frames above it.
	type frame struct {
		st   modelState
		from int
	}
	var path []frame
	var pending []modelState
	var buf []step
	expand := func(st modelState) error {
		mark[st] = onPath
		path = append(path, frame{st, len(pending)})
		buf = m.steps(st, buf[:0])
		if m.stuck(st, buf) {
			return fmt.Errorf("deadlock: %v", st)
		}
		for _, s := range buf {
			switch {
			case s.control:
				pending = append(pending, s.next)
			case mark[s.next] == 0:
				mark[s.next] = queued
				queue = append(queue, s.next)
			}
		}
		return nil
	}
	for len(queue) > 0 {
		st := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		if mark[st] != queued {
			continue // a search from another state expanded it
		}
		if err := expand(st); err != nil {
			return len(mark), err
		}
		for len(path) > 0 {
			top := path[len(path)-1]
			if len(pending) == top.from {
				mark[top.st] = finished
				path = path[:len(path)-1]
				continue
			}
			next := pending[len(pending)-1]
			pending = pending[:len(pending)-1]
			switch mark[next] {
			case onPath:
				return len(mark), fmt.Errorf("control messages alone cycle through %v", next)
			case 0, queued:
				if err := expand(next); err != nil {
					return len(mark), err
				}
			}
		}
	}
	return len(mark), nil
}

// starts are the model's first states: both sides with every credit, and
// each application with something to send or not, and some releases.
func (m creditModel) starts() []modelState {
	var out []modelState
	d := int8(m.depth)
	for wantA := int8(0); wantA <= d; wantA++ {
		for wantB := int8(0); wantB <= d; wantB++ {
			for confirm := int8(0); confirm <= 1; confirm++ {
				for relA := int8(0); relA <= 2; relA++ {
					for relB := int8(0); relB <= 2; relB++ {
						var st modelState
						for i, want := range []int8{wantA, wantB} {
							st.side[i] = modelSide{credits: d, peerCredits: d, peerRoom: d, want: want, confirmLater: confirm}
						}
						st.side[0].rel, st.side[1].rel = relA, relB
						out = append(out, st)
					}
				}
			}
		}
	}
	return out
}

// TestCreditRulesSettle runs creditState's rules in the model at the
// smallest receive depth a Conn accepts: no deadlock, no chatter.
func TestCreditRulesSettle(t *testing.T) {
	m := creditModel{depth: minRecvDepth}
	states, err := m.explore(m.starts())
	require.NoError(t, err)
	t.Logf("%d states at depth %d", states, m.depth)
	require.Greater(t, states, 1000)
}

// streamStarts are the first states of two sides with every credit, each
// with some messages to send, where streams says which are streams
// (rdmanet's Conn, whose reader releases all it gets). A side that is not
// faces a stream as a msg peer whose application reads messages,
// releases a few and holds the rest.
func (m creditModel) streamStarts(streams [2]bool) []modelState {
	var out []modelState
	d := int8(m.depth)
	maxRel := int8(2)
	if streams[0] && streams[1] {
		maxRel = 0 // streams release everything: rel means nothing
	}
	for wantA := int8(0); wantA <= d; wantA++ {
		for wantB := int8(0); wantB <= d; wantB++ {
			for rel := int8(0); rel <= maxRel; rel++ {
				var st modelState
				for i, want := range []int8{wantA, wantB} {
					st.side[i] = modelSide{credits: d, peerCredits: d, peerRoom: d, want: want}
					if streams[i] {
						st.side[i].stream, st.side[i].drains = true, true
					} else {
						st.side[i].rel = rel
					}
				}
				out = append(out, st)
			}
		}
	}
	return out
}

// TestStreamHoldSettles runs the credit rules with the stream's hold rule
// in the model: a held message always leaves once the peer has read what
// it had, and control messages alone never cycle. At depth 8 holding
// begins above the reserve (holdAt 4). At depth 7 the rounding of "half
// the peer's receives" decides: holding once the peer owed 3 of 7 (holdAt
// 4) let the two sides trade one-credit messages while a reader held two
// messages; holding once it owes 4 (holdAt 3, the reserve) leaves the
// stream waiting only for credits, and the rules settle.
//
// A stream also faces msg peers whose application holds messages (either
// side dialing), at depth 8, where holding would begin above the reserve.
// Holding for half of such a peer's receives deadlocked there: the peer
// held four of the stream's messages and waited for more, and the
// stream's last one, with a credit free, waited for those four; facing
// it, a stream holds nothing beyond the reserve (holdAt).
func TestStreamHoldSettles(t *testing.T) {
	type run struct {
		name    string
		depth   int
		streams [2]bool // side 0 dials
	}
	for _, r := range []run{
		{"two streams", 7, [2]bool{true, true}},
		{"two streams", 8, [2]bool{true, true}},
		{"a stream dialing a msg peer", 8, [2]bool{true, false}},
		{"a msg peer dialing a stream", 8, [2]bool{false, true}},
	} {
		m := creditModel{depth: r.depth}
		states, err := m.explore(m.streamStarts(r.streams))
		require.NoError(t, err, "%s, depth %d", r.name, r.depth)
		t.Logf("%s: %d states at depth %d", r.name, states, r.depth)
		require.Greater(t, states, 1000)
	}
}
