package dgram

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// path is the way to one destination port (a GID). A learnt path's
// address handle is made on the first write there, from what its sender's
// datagram said: a Conn that only reads makes none. Sends name the handle
// until they complete; lastSeq is the last send that did.
type path struct {
	ah      *verbs.AH     // nil until made
	sender  *verbs.Sender // a learnt path's, until its handle is made
	pinned  bool          // resolved or a joined group: kept until Close or LeaveGroup
	lastSeq uint64
}

// group is a joined multicast group: the id that joined it and what its
// MULTICAST_JOIN event said.
type group struct {
	id   *verbs.CMID
	ud   *verbs.UDParam
	ip   net.IP
	addr *Addr
}

// pathCache holds the Conn's address handles by destination GID: pinned
// ones for resolved peers and groups, and at most max learnt from
// received datagrams, evicted when no send in flight names them.
type pathCache struct {
	mu     sync.Mutex
	max    int
	makeAH func(*verbs.Sender) (*verbs.AH, error)
	learnt int
	paths  map[gidKey]*path
	peers  map[string]*Addr // Resolve's answers by "host:port"
	groups map[gidKey]*group
}

func (pc *pathCache) init(max int, makeAH func(*verbs.Sender) (*verbs.AH, error)) {
	pc.max = max
	pc.makeAH = makeAH
	pc.paths = make(map[gidKey]*path)
	pc.peers = make(map[string]*Addr)
	pc.groups = make(map[gidKey]*group)
}

// lookup returns the path to k for the write that will post send next,
// making its address handle if this is the first write there. The path
// counts as in flight from now, so that no eviction frees the handle
// before the send that names it is posted (a writer may wait for a free
// slot in between). sendMu is held. A handle that cannot be made is tried
// again on the next write.
func (pc *pathCache) lookup(k gidKey, next uint64) (*path, error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	p := pc.paths[k]
	if p == nil {
		return nil, ErrNoPath
	}
	if p.ah == nil {
		ah, err := pc.makeAH(p.sender)
		if err != nil {
			return nil, fmt.Errorf("dgram: the address handle of a peer learnt from its datagram: %w", err)
		}
		p.ah, p.sender = ah, nil
	}
	p.lastSeq = max(p.lastSeq, next)
	return p, nil
}

// touch records that send seq names p. sendMu is held.
func (pc *pathCache) touch(p *path, seq uint64) {
	pc.mu.Lock()
	p.lastSeq = seq
	pc.mu.Unlock()
}

// learn records the path to a datagram's sender the first time it is
// seen (wc and grh are its completion and GRH). When there are max learnt
// paths, it first evicts those no send in flight names: done, asked only
// then, gives the last send known complete.
func (pc *pathCache) learn(k gidKey, wc *verbs.WC, grh []byte, done func() uint64) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.paths == nil || pc.paths[k] != nil {
		return
	}
	if pc.learnt >= pc.max {
		pc.evict(done())
	}
	pc.paths[k] = &path{sender: verbs.SenderOf(wc, grh)}
	pc.learnt++
}

// evict frees learnt paths, the least recently written to first (one
// never written to before any), until fewer than max remain. Paths that
// a send in flight names (lastSeq past done) stay, even if the cache then
// holds more than max. mu is held.
//
// Each eviction scans the cache: it runs only when a new sender arrives
// at a full cache, and a scan of max entries costs less than making an
// address handle.
func (pc *pathCache) evict(done uint64) {
	for pc.learnt >= pc.max {
		var oldest gidKey
		var victim *path
		for k, p := range pc.paths {
			if p.pinned || p.lastSeq > done {
				continue
			}
			if victim == nil || p.lastSeq < victim.lastSeq {
				oldest, victim = k, p
			}
		}
		if victim == nil {
			return
		}
		victim.ah.Destroy()
		delete(pc.paths, oldest)
		pc.learnt--
	}
}

// pin keeps the path to k, made with ah unless one exists (ah is then
// destroyed), until removeGroup or free.
func (pc *pathCache) pin(k gidKey, ah *verbs.AH) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	p := pc.paths[k]
	switch {
	case p == nil:
		pc.paths[k] = &path{ah: ah, pinned: true}
		return
	case p.ah == nil:
		p.ah, p.sender = ah, nil
	default:
		ah.Destroy()
	}
	if !p.pinned {
		p.pinned = true
		pc.learnt--
	}
}

// peer returns Resolve's earlier answer for addr, if any.
func (pc *pathCache) peer(addr string) *Addr {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.peers[addr]
}

func (pc *pathCache) addPeer(addr string, a *Addr, ah *verbs.AH) {
	pc.pin(keyOf(a.IP), ah)
	pc.mu.Lock()
	pc.peers[addr] = a
	pc.mu.Unlock()
}

// joined returns the group at k, if joined.
func (pc *pathCache) joined(k gidKey) *group {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.groups[k]
}

func (pc *pathCache) addGroup(g *group, ah *verbs.AH) {
	k := keyOf(g.ip)
	pc.pin(k, ah)
	pc.mu.Lock()
	pc.groups[k] = g
	pc.mu.Unlock()
}

// removeGroup forgets the group at k and lets its path be evicted (at once
// if no send in flight names it).
func (pc *pathCache) removeGroup(k gidKey, done uint64) *group {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	g := pc.groups[k]
	if g == nil {
		return nil
	}
	delete(pc.groups, k)
	if p := pc.paths[k]; p != nil && p.pinned {
		p.pinned = false
		if p.lastSeq <= done {
			p.ah.Destroy()
			delete(pc.paths, k)
		} else {
			pc.learnt++
		}
	}
	return g
}

// leave detaches qpID's QP from the group, leaves it and destroys its id.
func (g *group) leave(qpID *verbs.CMID) error {
	return errors.Join(qpID.DetachMulticast(g.ud), g.id.LeaveMulticast(g.ip), g.id.Destroy())
}

// leaveAll leaves every group: at Close, before the QP is destroyed.
func (pc *pathCache) leaveAll(qpID *verbs.CMID) error {
	pc.mu.Lock()
	groups := pc.groups
	pc.groups = map[gidKey]*group{}
	pc.mu.Unlock()
	var errs []error
	for _, g := range groups {
		errs = append(errs, g.leave(qpID))
	}
	return errors.Join(errs...)
}

// free destroys every address handle: at Close, after the QP. Idempotent.
func (pc *pathCache) free() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for _, p := range pc.paths {
		p.ah.Destroy()
	}
	pc.paths = nil
}
