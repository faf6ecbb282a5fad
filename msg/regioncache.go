package msg

import (
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
// bytes it was sent before. At most limit bytes are kept; the rest is
// closed when given back, and everything when the connection ends.
type regionCache struct {
	pd    *bufpool.PD
	limit int

	mu     sync.Mutex
	free   map[regionKey][]*bufpool.Region
	held   int // bytes in free
	closed bool
	hits   uint64
	misses uint64
}

type regionKey struct {
	size   int
	access bufpool.Access
}

func newRegionCache(pd *bufpool.PD, limit int) *regionCache {
	return &regionCache{pd: pd, limit: limit, free: map[regionKey][]*bufpool.Region{}}
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
	key := regionKey{regionClass(n), access}
	if key.size > rc.limit {
		key.size = n
	}
	rc.mu.Lock()
	if list := rc.free[key]; len(list) > 0 && !rc.closed {
		r := list[len(list)-1]
		rc.free[key] = list[:len(list)-1]
		rc.held -= key.size
		rc.hits++
		rc.mu.Unlock()
		return r, nil
	}
	rc.misses++
	rc.mu.Unlock()
	return bufpool.NewRegion(rc.pd, key.size, access)
}

// put gives back a region from get that no work request uses any more.
func (rc *regionCache) put(r *bufpool.Region, access bufpool.Access) {
	key := regionKey{len(r.Bytes()), access}
	rc.mu.Lock()
	if rc.closed || rc.held+key.size > rc.limit {
		rc.mu.Unlock()
		r.Close()
		return
	}
	rc.free[key] = append(rc.free[key], r)
	rc.held += key.size
	rc.mu.Unlock()
}

// close closes every cached region; regions given back later are closed
// then.
func (rc *regionCache) close() {
	rc.mu.Lock()
	free := rc.free
	rc.free, rc.held, rc.closed = nil, 0, true
	rc.mu.Unlock()
	for _, list := range free {
		for _, r := range list {
			r.Close()
		}
	}
}

// counts is the cache's hits and misses.
func (rc *regionCache) counts() (hits, misses uint64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.hits, rc.misses
}
