package verbs

import (
	"errors"
	"testing"
)

// A batch grows from nothing as requests come, keeps every request it was
// given across each move, and refuses one past its limits without losing
// those before it.
func TestBatchGrowsAndKeepsRequests(t *testing.T) {
	const maxWR, maxSGE = 100, 150
	b := NewSendBatch(maxWR, maxSGE)
	defer b.Free()
	if b.c != nil {
		t.Fatal("a new batch holds C memory before its first request")
	}
	sges := func(i int) []SGE { // 0, 1 or 2 entries, addresses naming the request
		out := make([]SGE, i%3)
		for j := range out {
			out[j] = SGE{Addr: uint64(i*10 + j), Len: 1}
		}
		return out
	}
	for i := range maxWR {
		if err := b.Add(&SendWR{WRID: uint64(i), SGE: sges(i)}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if err := b.Add(&SendWR{WRID: maxWR}); !errors.Is(err, ErrBatchFull) {
		t.Fatalf("request past the limit: got %v, want ErrBatchFull", err)
	}
	if b.capWR > maxWR || b.capSGE > maxSGE {
		t.Fatalf("room %d/%d exceeds the limits %d/%d", b.capWR, b.capSGE, maxWR, maxSGE)
	}
	for i := range maxWR {
		id, addrs := b.request(i)
		want := sges(i)
		if id != uint64(i) || len(addrs) != len(want) {
			t.Fatalf("request %d: id %d with %d entries, want id %d with %d", i, id, len(addrs), i, len(want))
		}
		for j, a := range addrs {
			if a != want[j].Addr {
				t.Fatalf("request %d entry %d: address %d, want %d", i, j, a, want[j].Addr)
			}
		}
	}
	b.seal()
	if err := b.Add(&SendWR{WRID: 7, SGE: sges(2)}); err != nil {
		t.Fatalf("after seal: %v", err)
	}
	if id, addrs := b.request(0); id != 7 || len(addrs) != 2 || addrs[1] != 21 {
		t.Fatalf("after seal: request 0 is id %d, entries %v", id, addrs)
	}
}

// The entry limit is checked before anything is copied: a request that
// does not fit leaves the batch as it was.
func TestBatchEntryLimit(t *testing.T) {
	b := NewSendBatch(4, 4)
	defer b.Free()
	three := []SGE{{Addr: 1}, {Addr: 2}, {Addr: 3}}
	if err := b.Add(&SendWR{WRID: 1, SGE: three}); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(&SendWR{WRID: 2, SGE: three[:2]}); !errors.Is(err, ErrBatchFull) {
		t.Fatalf("5 entries in a batch of 4: got %v, want ErrBatchFull", err)
	}
	if b.n != 1 || b.nsge != 3 {
		t.Fatalf("the refused request changed the batch: %d requests, %d entries", b.n, b.nsge)
	}
	if err := b.Add(&SendWR{WRID: 3, SGE: three[:1]}); err != nil {
		t.Fatalf("a request that fits after a refusal: %v", err)
	}
}
