package dgram

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/go-rdma/rdmacm/internal/verbs"
)

// TestPeerCacheEvictsLeastRecentlyWrittenTo: a full cache of learnt
// paths frees the one written to least recently (never, before any),
// keeps one a send in flight names and pinned ones, and grows past its
// bound rather than free a path in use. No write makes an address
// handle here, so eviction has none to destroy.
func TestPeerCacheEvictsLeastRecentlyWrittenTo(t *testing.T) {
	var pc pathCache
	pc.init(3, nil)
	upTo := func(seq uint64) func() uint64 { return func() uint64 { return seq } }
	key := func(i int) gidKey { return keyOf(net.IPv4(10, 0, 0, byte(i))) }
	for i := 1; i <= 3; i++ {
		learn(&pc, key(i), upTo(0))
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

	learn(&pc, key(4), upTo(8)) // 2 goes: written to before 1; 3 is in flight
	requireCached(t, &pc, []int{1, 3, 4, 9}, []int{2})
	learn(&pc, key(5), upTo(8)) // 4, never written to, goes before 1
	requireCached(t, &pc, []int{1, 3, 5, 9}, []int{2, 4})

	written(1, 12)
	written(5, 11)
	learn(&pc, key(6), upTo(8)) // all three in flight: the cache grows
	requireCached(t, &pc, []int{1, 3, 5, 6, 9}, nil)
	if pc.learnt != 4 {
		t.Fatalf("%d learnt paths counted, want 4", pc.learnt)
	}
	learn(&pc, key(7), upTo(12)) // back to the bound: 6, then 3 (oldest first)
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

// TestPeerCacheMakesHandlesOnWrite: learning a sender makes no address
// handle; the first write there makes it, once; a handle that cannot be
// made fails that write with the device's error and is tried again on
// the next; and a path a writer has looked up stays while it waits to
// post, however many sends are done.
func TestPeerCacheMakesHandlesOnWrite(t *testing.T) {
	var pc pathCache
	made := 0
	var fail error
	pc.init(1, func(s *verbs.Sender) (*verbs.AH, error) {
		if s == nil {
			t.Fatal("a handle made with no sender")
		}
		if fail != nil {
			return nil, fail
		}
		made++
		return &verbs.AH{}, nil
	})
	k1 := keyOf(net.IPv4(10, 0, 0, 1))
	learn(&pc, k1, func() uint64 { return 0 })
	if made != 0 {
		t.Fatalf("learning a sender made %d address handles, want none", made)
	}
	if _, err := pc.lookup(keyOf(net.IPv4(10, 0, 0, 2)), 1); !errors.Is(err, ErrNoPath) {
		t.Fatalf("lookup of an unknown peer: %v, want ErrNoPath", err)
	}

	fail = syscall.ENOMEM
	if _, err := pc.lookup(k1, 1); !errors.Is(err, syscall.ENOMEM) || errors.Is(err, ErrNoPath) {
		t.Fatalf("lookup whose handle failed: %v, want the device's ENOMEM", err)
	}
	fail = nil
	p, err := pc.lookup(k1, 1)
	if err != nil || p.ah == nil || made != 1 {
		t.Fatalf("lookup after the failure: %v, %d handles made; want one", err, made)
	}
	if _, err := pc.lookup(k1, 2); err != nil || made != 1 {
		t.Fatalf("a second lookup: %v, %d handles made; want the first", err, made)
	}

	// Looked up for send 2, not yet posted: a full cache keeps it even
	// when every send posted so far is done.
	learn(&pc, keyOf(net.IPv4(10, 0, 0, 3)), func() uint64 { return 1 })
	requireCached(t, &pc, []int{1, 3}, nil)
}

// learn learns a sender at k with an empty completion and GRH.
func learn(pc *pathCache, k gidKey, done func() uint64) {
	pc.learn(k, &verbs.WC{}, make([]byte, verbs.GRHSize), done)
}

// TestResolvingALearntPeerPinsItsPath: a peer learnt from its datagram and
// then resolved keeps one path, now pinned and no longer counted against
// the bound, so that the next sender learnt evicts nothing. The path
// takes Resolve's handle if no write had made one, and otherwise keeps
// its own, which sends in flight may name.
func TestResolvingALearntPeerPinsItsPath(t *testing.T) {
	var pc pathCache
	pc.init(1, func(*verbs.Sender) (*verbs.AH, error) { return &verbs.AH{}, nil })
	none := func() uint64 { return 0 }
	key := func(i int) gidKey { return keyOf(net.IPv4(10, 0, 0, byte(i))) }

	learn(&pc, key(1), none)
	resolved := &verbs.AH{}
	pc.pin(key(1), resolved)
	if p := pc.paths[key(1)]; !p.pinned || p.ah != resolved || p.sender != nil {
		t.Fatalf("a learnt path without a handle, resolved: %+v; want it pinned with Resolve's handle", p)
	}

	learn(&pc, key(2), none)
	written, err := pc.lookup(key(2), 1)
	if err != nil {
		t.Fatal(err)
	}
	ownAH := written.ah
	pc.pin(key(2), &verbs.AH{})
	if p := pc.paths[key(2)]; !p.pinned || p.ah != ownAH {
		t.Fatalf("a learnt path written to, resolved: %+v; want it pinned with its own handle", p)
	}
	if pc.learnt != 0 {
		t.Fatalf("%d learnt paths counted, want none: both were resolved", pc.learnt)
	}
	learn(&pc, key(3), none)
	requireCached(t, &pc, []int{1, 2, 3}, nil)
}
