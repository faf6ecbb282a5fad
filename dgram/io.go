package dgram

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Message is one datagram of ReadBatch or WriteBatch.
type Message struct {
	// Buf is the payload to send, or where a received payload goes.
	Buf []byte
	// Addr is the destination (an *Addr) to send to, or the sender of a
	// received datagram.
	Addr net.Addr
	// N is how many bytes of Buf a received datagram filled.
	N int
	// Truncated: the received datagram was longer than Buf, whose length
	// is all that was kept (as UDP's MSG_TRUNC).
	Truncated bool
	// Imm is 32 bits of immediate data, sent with the datagram when
	// HasImm is set, or received with it.
	Imm    uint32
	HasImm bool
}

// registered is a fixed set of equal buffers of registered memory that the
// Conn takes out of their pool for its whole life: slot i of a queue is
// buffer i, named by a scatter/gather entry made once.
type registered struct {
	pool *bufpool.Pool
	bufs []*bufpool.Buffer
	sges []verbs.SGE
}

func (r *registered) init(pd *bufpool.PD, n, size int) error {
	pool, err := bufpool.New(pd, bufpool.Size(size), bufpool.Count(n))
	if err != nil {
		return err
	}
	r.pool = pool
	for range n {
		b, ok := pool.TryGet()
		if !ok {
			return errors.New("dgram: a new pool has fewer buffers than asked")
		}
		sge, _, err := seam.BufferSGE(b, 0, size)
		if err != nil {
			return err
		}
		r.bufs = append(r.bufs, b)
		r.sges = append(r.sges, sge)
	}
	return nil
}

// release gives every buffer back and closes the pool; the device must no
// longer use them (the QP is destroyed). Idempotent.
func (r *registered) release() {
	if r.pool == nil {
		return
	}
	for _, b := range r.bufs {
		r.pool.Put(b)
	}
	r.pool.Close()
	r.pool, r.bufs, r.sges = nil, nil, nil
}

// receiver is the receive side: every slot's buffer is posted unless a
// reader is copying out of it. recvMu guards it.
type receiver struct {
	registered
	batch  *verbs.RecvBatch
	ready  []verbs.WC // polled completions not yet read, oldest first
	head   int
	repost []uint32 // slots read and not yet posted again
	wr     verbs.RecvWR
}

func (r *receiver) init(pd *bufpool.PD, n, size int) error {
	r.batch = verbs.NewRecvBatch(n, n)
	r.ready = make([]verbs.WC, 0, n)
	r.repost = make([]uint32, 0, n)
	r.wr.SGE = make([]verbs.SGE, 1)
	return r.registered.init(pd, n, size)
}

func (r *receiver) release() {
	r.registered.release()
	if r.batch != nil {
		r.batch.Free()
		r.batch = nil
	}
}

// postAll posts every slot: at start.
func (r *receiver) postAll(id *verbs.CMID) error {
	for i := range r.bufs {
		r.repost = append(r.repost, uint32(i))
	}
	return r.flush(id)
}

// flush posts the slots read since the last flush, in one call.
func (r *receiver) flush(id *verbs.CMID) error {
	if len(r.repost) == 0 {
		return nil
	}
	for _, s := range r.repost {
		r.wr.WRID = uint64(s)
		r.wr.SGE[0] = r.sges[s]
		if err := r.batch.Add(&r.wr); err != nil {
			return err
		}
	}
	r.repost = r.repost[:0]
	return verbs.Post(id, nil, r.batch, nil)
}

// poll moves the CQ's completions to ready.
func (r *receiver) poll(cq *verbs.CQ) (int, error) {
	n, err := cq.Poll()
	for i := range n {
		r.ready = append(r.ready, cq.At(i))
	}
	return n, err
}

// ReadFrom reads one datagram into p and returns its length and sender (an
// *Addr, which WriteTo answers). A datagram longer than p is cut to fit, as
// on a UDP socket; ReadBatch says when. It waits until a datagram arrives,
// the read deadline passes, or the Conn is closed.
func (c *Conn) ReadFrom(p []byte) (int, net.Addr, error) {
	if !c.ok() {
		return 0, nil, syscall.EINVAL
	}
	m := [1]Message{{Buf: p}}
	if _, err := c.readBatch(m[:], "read", nil); err != nil {
		return 0, nil, err
	}
	return m[0].N, m[0].Addr, nil
}

// Read reads the next datagram from Dial's peer into p; datagrams from
// anybody else are dropped, as on a connected UDP socket. On a Conn from
// Listen it reads from anybody.
func (c *Conn) Read(p []byte) (int, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	m := [1]Message{{Buf: p}}
	if _, err := c.readBatch(m[:], "read", c.peer); err != nil {
		return 0, err
	}
	return m[0].N, nil
}

// ReadBatch reads at least one and at most len(ms) datagrams, each into
// its Message's Buf, and returns how many. It waits only for the first.
func (c *Conn) ReadBatch(ms []Message) (int, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	return c.readBatch(ms, "read", nil)
}

func (c *Conn) readBatch(ms []Message, op string, from *Addr) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	for {
		if c.closed.Load() {
			return 0, c.opError(op, net.ErrClosed)
		}
		got := c.takeReady(ms, from)
		if err := c.rx.flush(c.id); err != nil {
			return got, c.opError(op, err)
		}
		if got > 0 {
			return got, nil
		}
		if err := c.failed(); err != nil {
			return 0, c.opError(op, err)
		}
		if deadlinePassed(&c.recv) {
			return 0, c.opError(op, os.ErrDeadlineExceeded)
		}
		poll := func() (int, error) { return c.rx.poll(c.recv.cq) }
		n, err := poll()
		if n == 0 && err == nil {
			n, err = c.recv.await(poll)
		}
		if err != nil && n == 0 {
			return 0, c.opError(op, c.waitError(err))
		}
	}
}

// takeReady copies ready datagrams into ms and queues their slots for
// posting again. recvMu is held.
func (c *Conn) takeReady(ms []Message, from *Addr) int {
	r := &c.rx
	got := 0
	for got < len(ms) && r.head < len(r.ready) {
		wc := &r.ready[r.head]
		r.head++
		slot := uint32(wc.WRID)
		r.repost = append(r.repost, slot)
		if wc.Status != verbs.WCSuccess {
			if wc.Status != verbs.WCWRFlushErr {
				c.log.Warn().Stringer("status", wc.Status).Msg("dgram: a receive failed")
				c.stats.discarded.Add(1)
			}
			continue
		}
		buf := r.bufs[slot].Bytes()
		src, toGroup, ok := grhSource(buf[:verbs.GRHSize])
		if wc.Flags&verbs.WCGRH == 0 || !ok {
			c.log.Debug().Msg("dgram: a datagram without a readable GRH: dropped")
			c.stats.discarded.Add(1)
			continue
		}
		sender := &Addr{IP: src, QPN: wc.SrcQP, QKey: c.local.QKey}
		if from != nil && !from.sameQP(sender) {
			c.stats.discarded.Add(1)
			continue
		}
		if !toGroup {
			// A group's datagram cannot make the handle that answers
			// its sender: rdma-core does not look multicast GIDs up.
			c.paths.learn(keyOf(src), wc, buf[:verbs.GRHSize], c.sendsDone)
		}
		payload := buf[verbs.GRHSize:wc.ByteLen]
		m := &ms[got]
		m.N = copy(m.Buf, payload)
		m.Truncated = m.N < len(payload)
		c.stats.datagramsReceived.Add(1)
		c.stats.bytesReceived.Add(uint64(len(payload)))
		if m.Truncated {
			c.stats.trunc.Add(1)
		}
		m.Addr = sender
		m.HasImm = wc.Flags&verbs.WCWithImm != 0
		m.Imm = 0
		if m.HasImm {
			m.Imm = wc.Imm
		}
		got++
	}
	if r.head == len(r.ready) {
		r.ready, r.head = r.ready[:0], 0
	}
	return got
}

// deadlinePassed reports whether q's deadline has passed: a call that
// finds nothing to do fails then without waiting.
func deadlinePassed(q *queue) bool {
	return q.deadline.Load() != 0 && time.Now().UnixNano() >= q.deadline.Load()
}

// sender is the send side: a slot per datagram in flight, taken in order
// and given back in order (a UD send queue completes in order), most of
// them unsignaled. sendMu guards it, but done, which the peer cache reads.
type sender struct {
	registered
	batch       *verbs.SendBatch
	idle        []uint32 // slots not in flight
	inflight    []flight // FIFO of slots in flight
	head        int
	unsignaled  int // unsignaled sends since the last signaled one
	signalEvery int
	seq         uint64        // sends posted, ever; a send's WRID is its seq
	done        atomic.Uint64 // seq of the last send known complete
	maxInline   int
	err         error             // a send failed: the QP is in the error state
	whyFailed   func(error) error // a send's failure, naming the port if it is down
	wr          verbs.SendWR
	touched     []*path
}

type flight struct {
	slot uint32
	seq  uint64
}

func (s *sender) init(pd *bufpool.PD, n, mtu, maxInline int) error {
	s.batch = verbs.NewSendBatch(n, n)
	s.idle = make([]uint32, n)
	for i := range s.idle {
		s.idle[i] = uint32(n - 1 - i)
	}
	s.inflight = make([]flight, 0, n)
	s.signalEvery = max(1, n/4)
	s.maxInline = maxInline
	s.wr.SGE = make([]verbs.SGE, 1)
	return s.registered.init(pd, n, max(mtu, 1))
}

func (s *sender) release() {
	s.registered.release()
	if s.batch != nil {
		s.batch.Free()
		s.batch = nil
	}
}

// reclaim polls the send CQ and gives back the slots of every send up to
// each signaled one that completed.
func (s *sender) reclaim(cq *verbs.CQ) (int, error) {
	n, err := cq.Poll()
	for i := range n {
		wc := cq.At(i)
		if wc.Status != verbs.WCSuccess && s.err == nil {
			s.err = s.whyFailed(fmt.Errorf("dgram: a send failed (%v, vendor error %#x): %w", wc.Status, wc.VendorErr, endpoint.ErrClosed))
		}
		for s.head < len(s.inflight) && s.inflight[s.head].seq <= wc.WRID {
			s.idle = append(s.idle, s.inflight[s.head].slot)
			s.head++
		}
		s.done.Store(wc.WRID)
	}
	if s.head == len(s.inflight) {
		s.inflight, s.head = s.inflight[:0], 0
	}
	return n, err
}

// drain waits, at most for d, until every posted send has completed, so
// that Close does not cut off datagrams already written.
func (s *sender) drain(cq *verbs.CQ, d time.Duration) {
	for end := time.Now().Add(d); s.head < len(s.inflight) && time.Now().Before(end); {
		if n, err := s.reclaim(cq); err != nil {
			return
		} else if n == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// WriteTo sends p as one datagram to addr, an *Addr from Resolve,
// ReadFrom or JoinGroup. A datagram longer than MTU is refused
// (ErrMessageTooLarge) and an address with no path (ErrNoPath), before
// anything is sent. It returns once the datagram is posted; it waits only
// for a free send slot, until the write deadline. Once a write has seen
// the device fail an earlier send (the queue pair is then broken), it and
// every write after it fail with an error matching endpoint.ErrClosed but
// not net.ErrClosed (and endpoint.ErrPortDown, naming the port, when the
// port was down as the failure was found): the Conn can send no more, but
// only Close closes it.
func (c *Conn) WriteTo(p []byte, addr net.Addr) (int, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	m := [1]Message{{Buf: p, Addr: addr}}
	if _, err := c.writeBatch(m[:]); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Write sends p to Dial's peer. On a Conn from Listen, which has none, it
// fails with an error matching syscall.EDESTADDRREQ, as a write on an
// unconnected UDP socket does.
func (c *Conn) Write(p []byte) (int, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	if c.peer == nil {
		return 0, c.opError("write", fmt.Errorf("dgram: Write needs Dial's peer: use WriteTo: %w", syscall.EDESTADDRREQ))
	}
	return c.WriteTo(p, c.peer)
}

// WriteBatch sends each message's Buf to its Addr, with its immediate
// data when HasImm is set, in as few posts (doorbells) as the free send
// slots allow, and returns how many were sent. Every message is checked
// first: one too long or with no path fails the whole batch, unsent.
func (c *Conn) WriteBatch(ms []Message) (int, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	return c.writeBatch(ms)
}

func (c *Conn) writeBatch(ms []Message) (int, error) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	if err := c.failed(); err != nil {
		return 0, c.opError("write", err)
	}
	s := &c.tx
	paths := s.touched[:0]
	for i := range ms {
		p, err := c.check(&ms[i])
		if err != nil {
			return 0, err
		}
		paths = append(paths, p)
	}
	s.touched = paths
	sent := 0
	for sent < len(ms) {
		if len(s.idle) < len(ms)-sent {
			if _, err := s.reclaim(c.send.cq); err != nil {
				return sent, c.opError("write", err)
			}
		}
		// After the reclaim: the write that finds a send failed fails.
		if s.err != nil {
			return sent, c.opError("write", s.err)
		}
		if len(s.idle) == 0 {
			if deadlinePassed(&c.send) {
				return sent, c.opError("write", os.ErrDeadlineExceeded)
			}
			if _, err := c.send.await(func() (int, error) { return s.reclaim(c.send.cq) }); err != nil {
				return sent, c.opError("write", c.waitError(err))
			}
			continue
		}
		n, err := c.post(ms[sent:], paths[sent:])
		sent += n
		if err != nil {
			return sent, c.opError("write", err)
		}
	}
	return sent, nil
}

// countSent counts one post call that sent ms.
func (c *Conn) countSent(ms []Message) {
	var bytes uint64
	for i := range ms {
		bytes += uint64(len(ms[i].Buf))
	}
	c.stats.posts.Add(1)
	c.stats.datagramsSent.Add(uint64(len(ms)))
	c.stats.bytesSent.Add(bytes)
}

// sendsDone is the last send known complete, for the peer cache before it
// evicts. It first takes the sends that completed, unless a writer is
// busy (who will): writers take them only when they run short of slots,
// and every path written to since would look in flight. A failure is
// left for the next writer to find. It never waits for sendMu, so the
// reader may ask while it holds the cache's lock, which writers take
// under sendMu.
func (c *Conn) sendsDone() uint64 {
	if c.sendMu.TryLock() {
		c.tx.reclaim(c.send.cq)
		c.sendMu.Unlock()
	}
	return c.tx.done.Load()
}

// check refuses, before anything is posted, a message that cannot be
// sent. sendMu is held.
func (c *Conn) check(m *Message) (*path, error) {
	a, ok := m.Addr.(*Addr)
	if !ok || a == nil {
		return nil, c.opError("write", fmt.Errorf("%w: the destination is %T; want a *dgram.Addr from Resolve, ReadFrom or JoinGroup", endpoint.ErrInvalid, m.Addr))
	}
	if len(m.Buf) > c.mtu {
		return nil, &net.OpError{Op: "write", Net: Network, Source: c.local, Addr: a,
			Err: fmt.Errorf("%w: %d bytes, the MTU is %d", ErrMessageTooLarge, len(m.Buf), c.mtu)}
	}
	p, err := c.paths.lookup(keyOf(a.IP), c.tx.seq+1)
	if err != nil {
		return nil, &net.OpError{Op: "write", Net: Network, Source: c.local, Addr: a, Err: err}
	}
	return p, nil
}

// post posts as many of ms as there are free slots, in one call, and
// returns how many went. sendMu is held.
func (c *Conn) post(ms []Message, paths []*path) (int, error) {
	s := &c.tx
	k := min(len(ms), len(s.idle))
	first := s.seq
	for i := range k {
		m := &ms[i]
		a := m.Addr.(*Addr)
		slot := s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		s.seq++
		n := copy(s.bufs[slot].Bytes(), m.Buf)
		wr := &s.wr
		*wr = verbs.SendWR{WRID: s.seq, Opcode: verbs.WRSend, SGE: wr.SGE[:0],
			AH: paths[i].ah, RemoteQPN: a.QPN, RemoteQKey: a.QKey}
		if n > 0 {
			sge := s.sges[slot]
			sge.Len = uint32(n)
			wr.SGE = append(wr.SGE, sge)
		}
		if m.HasImm {
			wr.Opcode, wr.Imm = verbs.WRSendWithImm, m.Imm
		}
		if n <= s.maxInline {
			wr.Flags |= verbs.SendInline
		}
		s.unsignaled++
		// The last of every post is signaled, so that a writer short of
		// slots, and Close, learn when the whole post has gone.
		if s.unsignaled >= s.signalEvery || i == k-1 {
			wr.Flags |= verbs.SendSignaled
			s.unsignaled = 0
		}
		if err := s.batch.Add(wr); err != nil {
			return 0, err
		}
		s.inflight = append(s.inflight, flight{slot: slot, seq: s.seq})
		c.paths.touch(paths[i], s.seq)
	}
	err := verbs.Post(c.id, nil, nil, s.batch)
	posted := k
	if err != nil {
		// What the device refused, and all after it, never went: give
		// their slots back, newest first.
		posted = 0
		var pe *verbs.PostError
		if errors.As(err, &pe) {
			posted = pe.Index
		}
		for range k - posted {
			f := s.inflight[len(s.inflight)-1]
			s.inflight = s.inflight[:len(s.inflight)-1]
			s.idle = append(s.idle, f.slot)
		}
		s.seq = first + uint64(posted)
	}
	if posted > 0 {
		c.countSent(ms[:posted])
	}
	return posted, err
}
