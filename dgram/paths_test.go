package dgram

import (
	"net"
	"testing"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// TestPeerCacheEvictsLeastRecentlyWrittenTo: a full cache of learnt
// paths frees the one written to least recently (never, before any),
// keeps one a send in flight names and pinned ones, and grows past its
// bound rather than free a path in use. The address handles are nil
// here, as for a path whose handle could not be made.
func TestPeerCacheEvictsLeastRecentlyWrittenTo(t *testing.T) {
	var pc pathCache
	pc.init(3)
	noAH := func() (*verbs.AH, error) { return nil, nil }
	upTo := func(seq uint64) func() uint64 { return func() uint64 { return seq } }
	key := func(i int) gidKey { return keyOf(net.IPv4(10, 0, 0, byte(i))) }
	for i := 1; i <= 3; i++ {
		pc.learn(key(i), upTo(0), noAH)
	}
	pc.pin(key(9), nil) // Resolve's: never evicted, never counted
	written := func(i int, seq uint64) {
		t.Helper()
		p := pc.paths[key(i)]
		if p == nil {
			t.Fatalf("the path to 10.0.0.%d was evicted before a write", i)
		}
		pc.touch(p, seq)
	}
	written(1, 7)
	written(2, 5)
	written(3, 9) // in flight: only 8 sends are done

	pc.learn(key(4), upTo(8), noAH) // 2 goes: written to before 1; 3 is in flight
	requireCached(t, &pc, []int{1, 3, 4, 9}, []int{2})
	pc.learn(key(5), upTo(8), noAH) // 4, never written to, goes before 1
	requireCached(t, &pc, []int{1, 3, 5, 9}, []int{2, 4})

	written(1, 12)
	written(5, 11)
	pc.learn(key(6), upTo(8), noAH) // all three in flight: the cache grows
	requireCached(t, &pc, []int{1, 3, 5, 6, 9}, nil)
	if pc.learnt != 4 {
		t.Fatalf("%d learnt paths counted, want 4", pc.learnt)
	}
	pc.learn(key(7), upTo(12), noAH) // back to the bound: 6, then 3 (oldest first)
	requireCached(t, &pc, []int{1, 5, 7, 9}, []int{3, 6})
}

func requireCached(t *testing.T, pc *pathCache, kept, evicted []int) {
	t.Helper()
	for _, i := range kept {
		if pc.paths[keyOf(net.IPv4(10, 0, 0, byte(i)))] == nil {
			t.Errorf("the path to 10.0.0.%d was evicted; want it kept", i)
		}
	}
	for _, i := range evicted {
		if pc.paths[keyOf(net.IPv4(10, 0, 0, byte(i)))] != nil {
			t.Errorf("the path to 10.0.0.%d is cached; want it evicted", i)
		}
	}
}
