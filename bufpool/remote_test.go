package bufpool

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/internal/seam"
)

func TestRemoteEncoding(t *testing.T) {
	r := Remote{Addr: 0x0102030405060708, RKey: 0x0a0b0c0d, Len: 1 << 20}
	b, err := r.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, RemoteSize)
	// The encoding is fixed: little-endian Addr, RKey, Len.
	require.Equal(t, []byte{8, 7, 6, 5, 4, 3, 2, 1, 0x0d, 0x0c, 0x0b, 0x0a, 0, 0, 0x10, 0, 0, 0, 0, 0}, b)
	var got Remote
	require.NoError(t, got.UnmarshalBinary(b))
	require.Equal(t, r, got)
	require.Error(t, got.UnmarshalBinary(b[:RemoteSize-1]), "a short descriptor is refused")
	require.Error(t, got.UnmarshalBinary(append(b, 0)), "a long descriptor is refused")
	require.Equal(t, r, got, "a refused decode changes nothing")
}

func TestRemoteSlice(t *testing.T) {
	r := Remote{Addr: 4096, RKey: 7, Len: 100}
	s, err := r.Slice(10, 90)
	require.NoError(t, err)
	require.Equal(t, Remote{Addr: 4106, RKey: 7, Len: 90}, s)
	for _, bad := range [][2]int{{-1, 1}, {0, 101}, {50, 51}, {0, -1}} {
		_, err := r.Slice(bad[0], bad[1])
		require.ErrorIs(t, err, ErrRange, "slice %v", bad)
	}
}

// A region larger than 4 GiB is described whole.
func TestRemoteDescribesLargeRegions(t *testing.T) {
	r := Remote{Addr: 1 << 40, RKey: 1, Len: 5 << 30}
	b, err := r.MarshalBinary()
	require.NoError(t, err)
	var got Remote
	require.NoError(t, got.UnmarshalBinary(b))
	require.Equal(t, r, got)
	s, err := r.Slice(4<<30, 1<<30)
	require.NoError(t, err)
	require.Equal(t, Remote{Addr: 1<<40 + 4<<30, RKey: 1, Len: 1 << 30}, s)
}

// A nil Option is ignored, as an option left unset: before, New panicked
// with a nil dereference applying it. The sizes are still checked first.
func TestNilOptionIsIgnored(t *testing.T) {
	_, err := New(nil, nil, Size(0))
	require.ErrorContains(t, err, "size 0 and count 256")
}

// A nil or zero PD, Pool or Region holds no memory: its calls fail with
// EINVAL and its accessors give zero values, without a panic or, for a
// Pool's Get, a wait for ever. A nil Buffer is empty and names no segment.
// Arguments out of range are refused with EINVAL too.
func TestNotMadeIsRefused(t *testing.T) {
	for name, p := range map[string]*Pool{"nil": nil, "zero": {}} {
		_, err := p.Get(context.Background())
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Pool %s: Get gave %v, want EINVAL", name, err)
		}
		if err := p.Close(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Pool %s: Close gave %v, want EINVAL", name, err)
		}
		if b, ok := p.TryGet(); b != nil || ok {
			t.Errorf("Pool %s: TryGet gave %v, %v", name, b, ok)
		}
		if p.BufferSize() != 0 || p.Stats() != (Stats{}) {
			t.Errorf("Pool %s: size %d, stats %+v, want none", name, p.BufferSize(), p.Stats())
		}
	}
	for name, p := range map[string]*PD{"nil": nil, "zero": {}} {
		if err := p.Close(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("PD %s: Close gave %v, want EINVAL", name, err)
		}
	}
	for name, r := range map[string]*Region{"nil": nil, "zero": {}} {
		if err := r.Close(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Region %s: Close gave %v, want EINVAL", name, err)
		}
		if r.Buffer() != nil || r.Bytes() != nil || r.Remote() != (Remote{}) || r.Access() != 0 {
			t.Errorf("Region %s: buffer %v, bytes %v, remote %+v, access %v, want none", name, r.Buffer(), r.Bytes(), r.Remote(), r.Access())
		}
	}
	for name, err := range map[string]error{
		"a pool on no PD":          second(New(nil, Size(64), Count(1))),
		"a pool of no buffers":     second(New(&PD{}, Size(64), Count(0))),
		"a region on no PD":        second(NewRegion(nil, 64, RemoteRead)),
		"an empty region":          second(NewRegion(&PD{}, 0, RemoteRead)),
		"unknown access":           second(NewRegion(&PD{}, 64, 1<<7)),
		"a Remote of wrong length": new(Remote).UnmarshalBinary([]byte{1}),
	} {
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s: %v, want EINVAL", name, err)
		}
	}
	var b *Buffer
	if _, err := b.Segment(0, 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("nil Buffer: Segment gave %v, want EINVAL", err)
	}
	if _, _, err := seam.BufferSGE(b, 0, 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("nil Buffer: its work request's SGE gave %v, want EINVAL", err)
	}
	if b.Bytes() != nil || b.Len() != 0 {
		t.Errorf("nil Buffer: bytes %v, length %d, want none", b.Bytes(), b.Len())
	}
}

// second is the error of a call that returns a value and an error.
func second[T any](_ T, err error) error { return err }
