package bufpool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Access is what the peer may do to a Region.
type Access int

// Remote access rights. Combine with |.
const (
	RemoteRead   Access = 1 << iota // the peer may RDMA READ (rdma_reg_read)
	RemoteWrite                     // the peer may RDMA WRITE (rdma_reg_write)
	RemoteAtomic                    // the peer may compare-and-swap and fetch-and-add
)

// Remote describes a region to the peer: where it is and the key that
// opens it. Send it in a message; its binary form is RemoteSize bytes.
type Remote struct {
	Addr uint64 // the region's address in the peer's memory
	RKey uint32 // the key the peer registered it with
	Len  uint64 // its length in bytes
}

// RemoteSize is the length of Remote's binary encoding.
const RemoteSize = 20

// AppendBinary appends the 20-byte little-endian encoding: Addr, RKey, Len.
func (r Remote) AppendBinary(b []byte) ([]byte, error) {
	b = binary.LittleEndian.AppendUint64(b, r.Addr)
	b = binary.LittleEndian.AppendUint32(b, r.RKey)
	return binary.LittleEndian.AppendUint64(b, r.Len), nil
}

// MarshalBinary encodes the descriptor (see AppendBinary).
func (r Remote) MarshalBinary() ([]byte, error) { return r.AppendBinary(make([]byte, 0, RemoteSize)) }

// UnmarshalBinary decodes a descriptor; b must be exactly RemoteSize bytes.
func (r *Remote) UnmarshalBinary(b []byte) error {
	if len(b) != RemoteSize {
		return fmt.Errorf("bufpool: a Remote is %d bytes, got %d: %w", RemoteSize, len(b), syscall.EINVAL)
	}
	r.Addr = binary.LittleEndian.Uint64(b)
	r.RKey = binary.LittleEndian.Uint32(b[8:])
	r.Len = binary.LittleEndian.Uint64(b[12:])
	return nil
}

// Slice names [off, off+n) of the remote region.
func (r Remote) Slice(off, n int) (Remote, error) {
	if off < 0 || n < 0 || uint64(off)+uint64(n) > uint64(r.Len) {
		return Remote{}, fmt.Errorf("%w: [%d, %d) of a %d-byte remote region", ErrRange, off, off+n, r.Len)
	}
	return Remote{Addr: r.Addr + uint64(off), RKey: r.RKey, Len: uint64(n)}, nil
}

// Region is memory registered with exactly the remote access asked for.
type Region struct {
	pd     *seam.Domain
	access Access
	mem    []byte
	mr     *verbs.MR
	buf    Buffer
	mu     sync.Mutex
	closed bool
}

// NewRegion maps size bytes and registers them for local use plus access:
// RemoteRead alone is rdma_reg_read, RemoteWrite alone rdma_reg_write.
func NewRegion(pd *PD, size int, access Access) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("bufpool: region size %d must be positive: %w", size, syscall.EINVAL)
	}
	if access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 {
		return nil, fmt.Errorf("bufpool: unknown access bits %#x: %w", int(access&^(RemoteRead|RemoteWrite|RemoteAtomic)), syscall.EINVAL)
	}
	if err := pd.acquire(); err != nil {
		return nil, err
	}
	flags := verbs.AccessLocalWrite
	if access&RemoteRead != 0 {
		flags |= verbs.AccessRemoteRead
	}
	if access&RemoteWrite != 0 {
		flags |= verbs.AccessRemoteWrite
	}
	if access&RemoteAtomic != 0 {
		flags |= verbs.AccessRemoteAtomic
	}
	mem, err := mapPages(size)
	if err != nil {
		pd.d.Release()
		return nil, err
	}
	mr, err := pd.d.PD().RegMR(unsafe.Pointer(unsafe.SliceData(mem)), len(mem), flags)
	if err != nil {
		unix.Munmap(mem)
		pd.d.Release()
		return nil, registrationError(fmt.Sprintf("a region of %d bytes", size), err)
	}
	r := &Region{pd: pd.d, access: access, mem: mem, mr: mr}
	r.buf = Buffer{data: mem[:size:size], lkey: mr.LKey(), pd: pd.d}
	r.buf.out.Store(true)
	return r, nil
}

// Access is the remote access the region was registered for.
func (r *Region) Access() Access {
	if !r.made() {
		return 0
	}
	return r.access
}

// made says whether r was made by NewRegion. A nil or zero Region's Close
// fails with EINVAL, and it has no memory: its Buffer is nil, its Bytes
// and Remote are empty.
func (r *Region) made() bool { return r != nil && r.mr != nil }

// Bytes is the region's memory.
func (r *Region) Bytes() []byte {
	if !r.made() {
		return nil
	}
	return r.buf.data
}

// Buffer is the region as a local buffer, for posting it in work requests.
func (r *Region) Buffer() *Buffer {
	if !r.made() {
		return nil
	}
	return &r.buf
}

// Remote is the descriptor the peer needs to access the region.
func (r *Region) Remote() Remote {
	if !r.made() {
		return Remote{}
	}
	return Remote{Addr: r.mr.Addr(), RKey: r.mr.RKey(), Len: uint64(len(r.buf.data))}
}

// Close deregisters the region (its rkey stops working at once) and unmaps
// it. The caller must know that no local work request still uses it.
// Idempotent.
func (r *Region) Close() error {
	if !r.made() {
		return fmt.Errorf("bufpool: a Region not made by NewRegion: %w", syscall.EINVAL)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	r.buf.out.Store(false) // posts of it are refused from now on
	return errors.Join(r.mr.Dereg(), unix.Munmap(r.mem), r.pd.Release())
}
