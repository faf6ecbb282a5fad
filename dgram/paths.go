package dgram

import (
	"errors"
	"net"
	"sync"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// path is the address handle of one destination port (a GID). Sends name
// it until they complete; lastSeq is the last send that did.
type path struct {
	ah      *verbs.AH // nil when making it failed (sends there get ErrNoPath)
	pinned  bool      // resolved or a joined group: kept until Close or LeaveGroup
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
	learnt int
	paths  map[gidKey]*path
	peers  map[string]*Addr // Resolve's answers by "host:port"
	groups map[gidKey]*group
}

func (pc *pathCache) init(max int) {
	pc.max = max
	pc.paths = make(map[gidKey]*path)
	pc.peers = make(map[string]*Addr)
	pc.groups = make(map[gidKey]*group)
}

// lookup returns the path to k, or nil (also when making it failed).
func (pc *pathCache) lookup(k gidKey) *path {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if p := pc.paths[k]; p != nil && p.ah != nil {
		return p
	}
	return nil
}

// touch records that send seq names p. sendMu is held.
func (pc *pathCache) touch(p *path, seq uint64) {
	pc.mu.Lock()
	p.lastSeq = seq
	pc.mu.Unlock()
}

// learn makes the path to a sender the first time it is seen. When there
// are max learnt paths, it first evicts those no send in flight names:
// done, asked only then, gives the last send known complete.
func (pc *pathCache) learn(k gidKey, done func() uint64, make func() (*verbs.AH, error)) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.paths == nil || pc.paths[k] != nil {
		return
	}
	if pc.learnt >= pc.max {
		pc.evict(done())
	}
	ah, _ := make() // a failure is remembered as a path with no handle
	pc.paths[k] = &path{ah: ah}
	pc.learnt++
}

// evict frees learnt paths, the least recently written to first (one
// never written to before any), until fewer than max remain. Paths that
// a send in flight names (lastSeq past done) stay, even if the cache then
// holds more than max. mu is held.
//
// Each eviction scans the cache: it runs only when a new sender arrives
// at a full cache, and a scan of max entries costs less than the address
// handle made for it.
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
		if victim.ah != nil {
			victim.ah.Destroy()
		}
		delete(pc.paths, oldest)
		pc.learnt--
	}
}

// pin keeps the path to k, made with ah unless one exists (ah is then
// destroyed), until unpin.
func (pc *pathCache) pin(k gidKey, ah *verbs.AH) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	p := pc.paths[k]
	switch {
	case p == nil:
		pc.paths[k] = &path{ah: ah, pinned: true}
		return
	case p.ah == nil:
		p.ah = ah
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
		if p.ah != nil {
			p.ah.Destroy()
		}
	}
	pc.paths = nil
}
