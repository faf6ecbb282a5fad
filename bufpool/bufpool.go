// Package bufpool owns registered memory: message pools of fixed-size
// buffers registered once for sends and receives (rdma_reg_msgs: local
// access only), and regions registered for the peer's RDMA READ, WRITE or
// atomics (rdma_reg_read / rdma_reg_write), described to the peer by a Remote.
//
// All of it is page-aligned mmap memory, never Go heap memory: the device
// reads and writes it while Go code runs, and the Go garbage collector must
// neither move nor free it. A buffer handed to an endpoint's Post* belongs to
// the device until that post's completion comes back.
//
// An argument out of range, and a value this package did not make (a nil
// or zero PD, Pool, Region or Buffer), are refused with an error matching
// syscall.EINVAL: bufpool lies below package endpoint, whose ErrInvalid
// the other packages use.
package bufpool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/go-rdma/rdmacm/internal/lookup"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Errors callers match with errors.Is.
var (
	// ErrClosed: the pool (or region, or protection domain) is closed.
	// It matches net.ErrClosed too.
	ErrClosed        = fmt.Errorf("bufpool: closed: %w", net.ErrClosed)
	ErrDoublePut     = errors.New("bufpool: buffer put twice (it is already back in its pool)")
	ErrForeignBuffer = errors.New("bufpool: buffer does not belong to this pool")
	ErrRange         = errors.New("bufpool: range outside the buffer")
	// ErrPosted: Put of a buffer a work request still uses; it is the
	// device's until that request's completion comes back.
	ErrPosted = errors.New("bufpool: the buffer is posted: it is the device's until its completion comes back")
)

// PD is a protection domain: memory and queue pairs meet only within one,
// so a peer can reach only the regions registered in its connection's PD.
// Every connection gets a PD of its own unless it is asked to share one
// (cm.WithPD, and a listener's shared receive queue): pools and regions are
// then per connection, and a peer with a guessed rkey still cannot reach
// another connection's memory. Get one from an endpoint (Endpoint.PD), or
// open one for a device before any connection (OpenPD) and share it with
// the connections made later (cm.WithPD).
//
// The protection domain lives as long as anything uses it: it is freed
// when the last endpoint, pool, region and shared receive queue on it, and
// the PD OpenPD returned, are closed, in any order. Making a pool or region
// on a PD whose users are all closed fails with ErrClosed.
type PD struct {
	d *seam.Domain
	// opened: OpenPD made it, and Close gives back its reference.
	opened    bool
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// OpenPD opens a protection domain on the RDMA device that has the local
// address host (an IP address or a name; not a wildcard or loopback), so
// that pools and regions can be made before the first connection. Give it
// to the connections that use them with cm.WithPD, on the same device, and
// Close it when done: it is freed once its pools, regions and endpoints
// are closed too. A name is looked up with net's resolver, under ctx, and
// its IPv4 address taken if it has one, as cm.Listen takes it.
func OpenPD(ctx context.Context, host string) (*PD, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	addr, err := lookup.PreferIPv4(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("bufpool: open a PD on %s: %w", host, err)
	}
	ai, err := verbs.GetAddrInfo(addr, "0", true, verbs.PortSpaceTCP)
	if err != nil {
		return nil, fmt.Errorf("bufpool: open a PD on %s: %w", host, err)
	}
	defer ai.Free()
	// Binding an id to the address finds its device (rdma_create_ep);
	// librdmacm keeps the device open after the id is gone.
	id, err := verbs.CreateEP(ai)
	if err != nil {
		return nil, fmt.Errorf("bufpool: open a PD on %s: %w", host, err)
	}
	defer id.DestroyEP()
	dev := id.Context()
	if dev == nil {
		return nil, fmt.Errorf("bufpool: open a PD on %s: the address of one RDMA device's interface is needed, not a wildcard or loopback", host)
	}
	d, err := seam.NewDomain(dev)
	if err != nil {
		return nil, fmt.Errorf("bufpool: open a PD on %s: %w", host, err)
	}
	return &PD{d: d, opened: true}, nil
}

// Close gives back the reference OpenPD took; the protection domain is
// freed once its pools, regions and endpoints are closed too. A PD from
// Endpoint.PD is the endpoint's: closing it is refused. Idempotent.
func (p *PD) Close() error {
	if p == nil || p.d == nil {
		return fmt.Errorf("bufpool: a PD not made by OpenPD or an endpoint: %w", syscall.EINVAL)
	}
	if !p.opened {
		return errors.New("bufpool: this PD is an endpoint's: close the endpoint instead")
	}
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		p.closeErr = p.d.Release()
	})
	return p.closeErr
}

func init() {
	seam.WrapPD = func(d *seam.Domain) any { return &PD{d: d} }
	seam.DomainOf = func(pd any) *seam.Domain {
		if p, _ := pd.(*PD); p != nil && !p.closed.Load() {
			return p.d
		}
		return nil
	}
	seam.BufferSGE = func(buf any, off, n int) (verbs.SGE, *seam.Domain, error) {
		return buf.(*Buffer).sge(off, n)
	}
	seam.SegmentSGE = func(seg any) (verbs.SGE, *seam.Domain, error) {
		s := seg.(*Segment)
		if s.buf == nil {
			return verbs.SGE{}, nil, fmt.Errorf("%w: the zero Segment (make one with Buffer.Segment)", ErrRange)
		}
		return s.buf.sge(s.off, s.n)
	}
	seam.Posted = func(buf any, delta int32) { buf.(*Buffer).posted.Add(delta) }
	seam.PutBack = func(buf any) {
		if b := buf.(*Buffer); b.pool != nil && b.out.Load() {
			b.pool.Put(b)
		}
	}
}

// acquire takes a reference on p's domain for a new pool or region.
func (p *PD) acquire() error {
	if p == nil || p.d == nil {
		return fmt.Errorf("bufpool: nil protection domain (take one from an endpoint's PD method, or OpenPD): %w", syscall.EINVAL)
	}
	if p.closed.Load() {
		return fmt.Errorf("%w: the protection domain was closed", ErrClosed)
	}
	if err := p.d.Acquire(); err != nil {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	return nil
}

// Segment names a range of a Buffer for a scatter/gather work request.
// Make one with Buffer.Segment; the zero Segment names nothing and is
// refused by every post.
type Segment struct {
	buf    *Buffer
	off, n int
}

// Len is the segment's length in bytes.
func (s Segment) Len() int { return s.n }

// Buffer is one registered buffer: a slice of a pool, or a whole Region.
type Buffer struct {
	data  []byte
	lkey  uint32
	pd    *seam.Domain
	pool  *Pool // nil for a region's buffer
	index int
	// out: the buffer is its holder's to post. A pool's buffer is out from
	// Get to Put; a region's from its making to its Close.
	out atomic.Bool
	// posted counts the work requests that name the buffer itself (not
	// through a Segment) and have not completed.
	posted atomic.Int32
}

// Bytes is the buffer's whole memory. Its length is the buffer size.
func (b *Buffer) Bytes() []byte {
	if b == nil {
		return nil
	}
	return b.data
}

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int {
	if b == nil {
		return 0
	}
	return len(b.data)
}

// Segment names [off, off+n) of the buffer for a work request.
func (b *Buffer) Segment(off, n int) (Segment, error) {
	if b == nil {
		return Segment{}, fmt.Errorf("bufpool: a segment of a nil Buffer: %w", syscall.EINVAL)
	}
	if off < 0 || n < 0 || off+n > len(b.data) || off+n < 0 {
		return Segment{}, fmt.Errorf("%w: [%d, %d) of a %d-byte buffer", ErrRange, off, off+n, len(b.data))
	}
	return Segment{buf: b, off: off, n: n}, nil
}

// sge is [off, off+n) as a work request names it, checked.
func (b *Buffer) sge(off, n int) (verbs.SGE, *seam.Domain, error) {
	if b == nil {
		return verbs.SGE{}, nil, fmt.Errorf("bufpool: a nil Buffer (a Region not made by NewRegion has none): %w", syscall.EINVAL)
	}
	if !b.out.Load() {
		if b.pool != nil {
			return verbs.SGE{}, nil, errors.New("bufpool: the buffer is back in its pool (Put): get it again before posting it")
		}
		return verbs.SGE{}, nil, fmt.Errorf("%w: the buffer's region was closed", ErrClosed)
	}
	if off < 0 || n < 0 || off+n > len(b.data) || off+n < 0 {
		return verbs.SGE{}, nil, fmt.Errorf("%w: [%d, %d) of a %d-byte buffer", ErrRange, off, off+n, len(b.data))
	}
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b.data)))) + uint64(off)
	return verbs.SGE{Addr: addr, Len: uint32(n), LKey: b.lkey}, b.pd, nil
}

// Options configure a Pool.
type options struct {
	size, count int
}

// Option configures New. A nil Option is ignored.
type Option func(*options)

// Size sets the size of each buffer in bytes (default 4096).
func Size(n int) Option { return func(o *options) { o.size = n } }

// Count sets the number of buffers (default 256).
func Count(n int) Option { return func(o *options) { o.count = n } }

// Pool is a fixed set of equal buffers cut from one registered region.
// Get and Put do not allocate.
type Pool struct {
	pd      *seam.Domain
	mem     []byte
	mr      *verbs.MR
	bufs    []Buffer
	free    chan *Buffer
	closing chan struct{}
	size    int

	mu       sync.Mutex
	closed   bool
	released bool
}

// New maps size*count bytes (rounded up to pages), registers them once for
// local access (rdma_reg_msgs) and cuts them into count buffers.
func New(pd *PD, opts ...Option) (*Pool, error) {
	o := options{size: 4096, count: 256}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.size <= 0 || o.count <= 0 || o.size > math.MaxInt32/o.count {
		return nil, fmt.Errorf("bufpool: size %d and count %d must both be positive, and their product below 2 GiB: %w", o.size, o.count, syscall.EINVAL)
	}
	if err := pd.acquire(); err != nil {
		return nil, err
	}
	mem, err := mapPages(o.size * o.count)
	if err != nil {
		pd.d.Release()
		return nil, err
	}
	mr, err := pd.d.PD().RegMsgs(unsafe.Pointer(unsafe.SliceData(mem)), len(mem))
	if err != nil {
		unix.Munmap(mem)
		pd.d.Release()
		return nil, registrationError(fmt.Sprintf("%d bytes", len(mem)), err)
	}
	p := &Pool{pd: pd.d, mem: mem, mr: mr, size: o.size, bufs: make([]Buffer, o.count),
		free: make(chan *Buffer, o.count), closing: make(chan struct{})}
	for i := range p.bufs {
		b := &p.bufs[i]
		*b = Buffer{data: mem[i*o.size : (i+1)*o.size : (i+1)*o.size], lkey: mr.LKey(), pd: pd.d, pool: p, index: i}
		p.free <- b
	}
	return p, nil
}

func mapPages(n int) ([]byte, error) {
	page := os.Getpagesize()
	n = (n + page - 1) / page * page
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("bufpool: mmap %d bytes: %w", n, err)
	}
	return mem, nil
}

// BufferSize is the size of each buffer.
func (p *Pool) BufferSize() int {
	if !p.made() {
		return 0
	}
	return p.size
}

// made says whether p was made by New. A nil or zero Pool's Get and Close
// fail with errPoolNotMade, and it has no buffers, instead of panicking
// or, for Get, waiting for ever.
func (p *Pool) made() bool { return p != nil && p.free != nil }

var errPoolNotMade = fmt.Errorf("bufpool: a Pool not made by New: %w", syscall.EINVAL)

// Get takes a buffer, waiting until one is free or ctx ends.
func (p *Pool) Get(ctx context.Context) (*Buffer, error) {
	if !p.made() {
		return nil, errPoolNotMade
	}
	select {
	case b := <-p.free:
		return p.take(b)
	default:
	}
	select {
	case b := <-p.free:
		return p.take(b)
	case <-p.closing:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TryGet takes a buffer if one is free.
func (p *Pool) TryGet() (*Buffer, bool) {
	if !p.made() {
		return nil, false
	}
	select {
	case b := <-p.free:
		b, err := p.take(b)
		return b, err == nil
	default:
		return nil, false
	}
}

func (p *Pool) take(b *Buffer) (*Buffer, error) {
	select {
	case <-p.closing:
		p.free <- b
		return nil, ErrClosed
	default:
	}
	b.out.Store(true)
	return b, nil
}

// Put returns a buffer to its pool. Putting a buffer twice, one of
// another pool, or one still posted to the device (named by a work request
// whose completion has not come back, except through a Segment) is refused
// with an error and changes nothing. After Close, Put still takes buffers
// back; the last one frees the memory.
func (p *Pool) Put(b *Buffer) error {
	if b == nil || b.pool != p {
		return ErrForeignBuffer
	}
	if b.posted.Load() > 0 {
		return ErrPosted
	}
	if !b.out.CompareAndSwap(true, false) {
		return ErrDoublePut
	}
	p.free <- b // never blocks: the channel holds every buffer
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed && len(p.free) == len(p.bufs) {
		return p.release()
	}
	return nil
}

// Stats is a snapshot of a pool.
type Stats struct {
	Size, Count, Free, Out int
}

// Stats returns how many buffers are free and out.
func (p *Pool) Stats() Stats {
	if !p.made() {
		return Stats{}
	}
	free := len(p.free)
	return Stats{Size: p.size, Count: len(p.bufs), Free: free, Out: len(p.bufs) - free}
}

// Close stops Get (waiters get ErrClosed). If every buffer is back, the
// memory is deregistered and unmapped now; otherwise that happens when the
// last buffer is Put, because a buffer still out may be posted to the
// device. Close is idempotent.
func (p *Pool) Close() error {
	if !p.made() {
		return errPoolNotMade
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	close(p.closing)
	if len(p.free) == len(p.bufs) {
		return p.release()
	}
	return nil
}

func (p *Pool) release() error {
	if p.released {
		return nil
	}
	p.released = true
	err := p.mr.Dereg()
	return errors.Join(err, unix.Munmap(p.mem), p.pd.Release())
}

// registrationError says which registration failed and, when the device
// refused for lack of lockable memory, how to raise the limit.
func registrationError(what string, err error) error {
	if errors.Is(err, unix.ENOMEM) {
		return fmt.Errorf("bufpool: registering %s: %w (raise the locked-memory limit: `ulimit -l unlimited`, "+
			"LimitMEMLOCK=infinity in a systemd unit, or CAP_IPC_LOCK; soft-iWARP (siw) applies the limit to root too)", what, err)
	}
	return fmt.Errorf("bufpool: registering %s: %w", what, err)
}
