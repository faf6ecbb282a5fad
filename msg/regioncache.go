package msg

import (
	"container/list"
	"math/bits"
	"sync"

	"github.com/go-rdma/rdmacm/bufpool"
)

// minRegionClass is the smallest rendezvous region: every message above the
// inline size fits, and small ones share one class.
const minRegionClass = 64 << 10

// regionCache keeps a connection's rendezvous regions, and those its
// one-sided operations stage their bytes in, registered from one use to
// the next: mapping, faulting in and registering a region for each
// message costs more than moving it. A region is sized to a power of
// two at least minRegionClass, unless it is larger than the cache keeps,
// and used for one message or operation at a time. It is
// memory bufpool mapped, never Go heap memory, and stays registered only
// for this connection's own protection domain: the peer can reach a cached
// region (send regions are readable with their rkey) but finds in it only
// bytes it was sent before. The regions kept wait in the cache's budget,
// which bounds them together with those of the caches that share it;
// everything is closed when the connection ends.
type regionCache struct {
	pd     *bufpool.PD
	budget *regionBudget

	// Under budget.mu.
	free   map[regionKey][]*list.Element // of budget.kept, most recent last
	closed bool
	hits   uint64
	misses uint64
}

type regionKey struct {
	size   int
	access bufpool.Access
}

// regionBudget bounds the bytes of the regions that the caches sharing it
// keep, together: those of one Dial's connection, or of every connection
// one Listener accepts, so that a server of many connections pins at most
// limit bytes of idle regions however many there are. When a region given
// back would pass the bound, the regions kept longest, whichever
// connection's, are closed to make room.
type regionBudget struct {
	limit int

	mu   sync.Mutex
	held int       // bytes in kept
	kept list.List // of *keptRegion, the least recently given back first
}

type keptRegion struct {
	cache  *regionCache
	key    regionKey
	region *bufpool.Region
}

func newRegionCache(pd *bufpool.PD, budget *regionBudget) *regionCache {
	return &regionCache{pd: pd, budget: budget, free: map[regionKey][]*list.Element{}}
}

// regionClass is the size of the region that holds n bytes.
func regionClass(n int) int {
	if n <= minRegionClass {
		return minRegionClass
	}
	return 1 << bits.Len(uint(n-1))
}

// get returns a region of at least n bytes registered for access: a cached
// one, or a new one. A region larger than the cache keeps is made of n
// bytes exactly: rounding it up to its class would only pin more memory.
func (rc *regionCache) get(n int, access bufpool.Access) (*bufpool.Region, error) {
	b := rc.budget
	key := regionKey{regionClass(n), access}
	if key.size > b.limit {
		key.size = n
	}
	b.mu.Lock()
	if free := rc.free[key]; len(free) > 0 && !rc.closed {
		e := free[len(free)-1]
		rc.free[key] = free[:len(free)-1]
		b.kept.Remove(e)
		b.held -= key.size
		rc.hits++
		b.mu.Unlock()
		return e.Value.(*keptRegion).region, nil
	}
	rc.misses++
	b.mu.Unlock()
	return bufpool.NewRegion(rc.pd, key.size, access)
}

// put gives back a region from get that no work request uses any more.
func (rc *regionCache) put(r *bufpool.Region, access bufpool.Access) {
	b := rc.budget
	key := regionKey{len(r.Bytes()), access}
	b.mu.Lock()
	if rc.closed || key.size > b.limit {
		b.mu.Unlock()
		r.Close()
		return
	}
	var evicted []*bufpool.Region
	for b.held+key.size > b.limit {
		e := b.kept.Front()
		k := e.Value.(*keptRegion)
		k.cache.forgetLocked(k.key, e)
		evicted = append(evicted, k.region)
	}
	e := b.kept.PushBack(&keptRegion{cache: rc, key: key, region: r})
	rc.free[key] = append(rc.free[key], e)
	b.held += key.size
	b.mu.Unlock()
	for _, r := range evicted {
		r.Close()
	}
}

// forgetLocked takes e, a region of rc's kept under key, out of rc and its
// budget; the caller closes the region. budget.mu is held.
func (rc *regionCache) forgetLocked(key regionKey, e *list.Element) {
	free := rc.free[key]
	for i := range free {
		if free[i] == e {
			rc.free[key] = append(free[:i], free[i+1:]...)
			break
		}
	}
	rc.budget.kept.Remove(e)
	rc.budget.held -= key.size
}

// close closes every region rc keeps; regions given back later are closed
// then.
func (rc *regionCache) close() {
	b := rc.budget
	b.mu.Lock()
	var regions []*bufpool.Region
	for key, free := range rc.free {
		for _, e := range free {
			b.kept.Remove(e)
			b.held -= key.size
			regions = append(regions, e.Value.(*keptRegion).region)
		}
	}
	rc.free, rc.closed = nil, true
	b.mu.Unlock()
	for _, r := range regions {
		r.Close()
	}
}

// counts is the cache's hits and misses.
func (rc *regionCache) counts() (hits, misses uint64) {
	rc.budget.mu.Lock()
	defer rc.budget.mu.Unlock()
	return rc.hits, rc.misses
}
