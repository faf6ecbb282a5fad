package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

var sizes = []int{1, 64, 4 << 10, 64 << 10, 1 << 20}

// pattern fills b with bytes that depend on seed and position.
func pattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed*13 + i>>8)
	}
}

func TestSendRecvSizes(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	spool := newPool(t, p.server, 1<<20, 2)
	cpool := newPool(t, p.client, 1<<20, 2)
	for i, n := range sizes {
		for _, withImm := range []bool{false, true} {
			t.Run(fmt.Sprintf("%dB/imm=%v", n, withImm), func(t *testing.T) {
				if withImm && rxetest.IWARP() {
					requireNoImmediateData(t, p.client, cpool, n)
					return
				}
				rb, _ := spool.TryGet()
				defer spool.Put(rb)
				require.NoError(t, p.server.PostRecv(i, rb))
				sb, _ := cpool.TryGet()
				defer cpool.Put(sb)
				pattern(sb.Bytes()[:n], i)
				if withImm {
					require.NoError(t, p.client.PostSendImm("send", sb, n, uint32(0xA0000000+n)))
				} else {
					require.NoError(t, p.client.PostSend("send", sb, n))
				}
				sc := next(t, p.client)
				require.NoError(t, sc.Err)
				require.Equal(t, "send", sc.Context)
				require.Equal(t, endpoint.OpSend, sc.Op)

				rc := next(t, p.server)
				require.NoError(t, rc.Err)
				require.Equal(t, i, rc.Context)
				require.Equal(t, n, rc.Len)
				require.Same(t, rb, rc.Buffer)
				require.True(t, bytes.Equal(sb.Bytes()[:n], rb.Bytes()[:n]), "payload differs")
				require.Equal(t, withImm, rc.HasImm)
				if withImm {
					require.Equal(t, uint32(0xA0000000+n), rc.Imm)
				}
			})
		}
	}
}

// exchangeRegion makes a region on the server and gives the client its
// descriptor the way an application would: in a message.
func exchangeRegion(t *testing.T, ctx context.Context, p *pair, size int, access bufpool.Access) (*bufpool.Region, bufpool.Remote) {
	t.Helper()
	region, err := bufpool.NewRegion(p.server.PD(), size, access)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, region.Close()) })

	spool := newPool(t, p.server, 64, 1)
	cpool := newPool(t, p.client, 64, 1)
	rb, _ := cpool.TryGet()
	require.NoError(t, p.client.PostRecv("desc", rb))
	sb, _ := spool.TryGet()
	enc, err := region.Remote().AppendBinary(sb.Bytes()[:0])
	require.NoError(t, err)
	require.NoError(t, p.server.PostSend("desc", sb, len(enc)))
	require.NoError(t, next(t, p.server).Err)
	c := next(t, p.client)
	require.NoError(t, c.Err)
	var remote bufpool.Remote
	require.NoError(t, remote.UnmarshalBinary(rb.Bytes()[:c.Len]))
	require.Equal(t, region.Remote(), remote)
	require.NoError(t, spool.Put(sb))
	require.NoError(t, cpool.Put(rb))
	return region, remote
}

func TestWriteReadSizes(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	region, remote := exchangeRegion(t, ctx, p, 1<<20, bufpool.RemoteRead|bufpool.RemoteWrite)
	pool := newPool(t, p.client, 1<<20, 2)
	wb, _ := pool.TryGet()
	rb, _ := pool.TryGet()
	for i, n := range sizes {
		t.Run(fmt.Sprintf("%dB", n), func(t *testing.T) {
			pattern(wb.Bytes()[:n], i+100)
			require.NoError(t, p.client.PostWrite("write", wb, n, remote))
			c := next(t, p.client)
			require.NoError(t, c.Err)
			require.Equal(t, endpoint.OpWrite, c.Op)
			require.True(t, bytes.Equal(wb.Bytes()[:n], region.Bytes()[:n]), "region differs after write")

			clear(rb.Bytes()[:n])
			require.NoError(t, p.client.PostRead("read", rb, n, remote))
			c = next(t, p.client)
			require.NoError(t, c.Err)
			require.Equal(t, endpoint.OpRead, c.Op)
			require.True(t, bytes.Equal(wb.Bytes()[:n], rb.Bytes()[:n]), "read back differs")
		})
	}
	require.NoError(t, pool.Put(wb))
	require.NoError(t, pool.Put(rb))
}

// requireNoImmediateData: on iWARP a send or write with immediate data is
// refused with ErrNotSupported before anything is posted.
func requireNoImmediateData(t *testing.T, ep *endpoint.Endpoint, pool *bufpool.Pool, n int) {
	t.Helper()
	b, _ := pool.TryGet()
	defer pool.Put(b)
	require.ErrorIs(t, ep.PostSendImm("imm", b, n, 7), endpoint.ErrNotSupported)
	require.ErrorIs(t, ep.PostWriteImm("imm", b, n, bufpool.Remote{Addr: 4096, RKey: 1, Len: uint64(n)}, 7), endpoint.ErrNotSupported)
	select {
	case c := <-ep.Completions():
		t.Fatalf("a refused post completed: %+v", c)
	default:
	}
}

func TestWriteWithImm(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	if rxetest.IWARP() {
		requireNoImmediateData(t, p.client, newPool(t, p.client, 64<<10, 1), 64<<10)
		return
	}
	region, remote := exchangeRegion(t, ctx, p, 64<<10, bufpool.RemoteWrite)
	spool := newPool(t, p.server, 64, 1)
	cpool := newPool(t, p.client, 64<<10, 1)
	rb, _ := spool.TryGet()
	require.NoError(t, p.server.PostRecv("imm-recv", rb))
	wb, _ := cpool.TryGet()
	pattern(wb.Bytes(), 5)
	require.NoError(t, p.client.PostWriteImm("write-imm", wb, 64<<10, remote, 0xDEADBEEF))
	require.NoError(t, next(t, p.client).Err)
	c := next(t, p.server)
	require.NoError(t, c.Err)
	require.Equal(t, "imm-recv", c.Context)
	require.Equal(t, endpoint.OpRecvWriteImm, c.Op)
	require.True(t, c.HasImm)
	require.Equal(t, uint32(0xDEADBEEF), c.Imm)
	require.Equal(t, 64<<10, c.Len, "byte_len of a write-with-imm receive is the write's length")
	require.True(t, bytes.Equal(wb.Bytes(), region.Bytes()))
	require.NoError(t, spool.Put(rb))
	require.NoError(t, cpool.Put(wb))
}

func TestScatterGather(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	cpool := newPool(t, p.client, 4096, 4)
	spool := newPool(t, p.server, 4096, 4)
	var src [3]*bufpool.Buffer
	var segs []bufpool.Segment
	var want []byte
	for i, n := range []int{100, 3000, 7} {
		src[i], _ = cpool.TryGet()
		pattern(src[i].Bytes()[:n], i)
		s, err := src[i].Segment(0, n)
		require.NoError(t, err)
		segs = append(segs, s)
		want = append(want, src[i].Bytes()[:n]...)
	}
	// The receive scatters over two buffers: 1000 bytes, then the rest.
	r1, _ := spool.TryGet()
	r2, _ := spool.TryGet()
	s1, _ := r1.Segment(0, 1000)
	s2, _ := r2.Segment(0, 4096)
	require.NoError(t, p.server.PostRecvv("recvv", []bufpool.Segment{s1, s2}))
	require.NoError(t, p.client.PostSendv("sendv", segs))
	require.NoError(t, next(t, p.client).Err)
	c := next(t, p.server)
	require.NoError(t, c.Err)
	require.Equal(t, len(want), c.Len)
	got := append(append([]byte{}, r1.Bytes()[:1000]...), r2.Bytes()[:len(want)-1000]...)
	require.Equal(t, want, got)

	// Gather-write into a region, then scatter-read it back.
	region, remote := exchangeRegion(t, ctx, p, 8192, bufpool.RemoteRead|bufpool.RemoteWrite)
	require.NoError(t, p.client.PostWritev("writev", segs, remote))
	require.NoError(t, next(t, p.client).Err)
	require.Equal(t, want, region.Bytes()[:len(want)])
	d1, _ := cpool.TryGet()
	t1, _ := d1.Segment(0, 2000)
	t2, _ := src[0].Segment(0, len(want)-2000) // reuse a source buffer as the second target
	if rxetest.IWARP() {                       // siw's READ sink takes one segment (max_sge_rd 1)
		require.ErrorIs(t, p.client.PostReadv("readv", []bufpool.Segment{t1, t2}, remote), endpoint.ErrNotSupported)
		whole, _ := d1.Segment(0, len(want))
		require.NoError(t, p.client.PostReadv("read", []bufpool.Segment{whole}, remote))
		require.NoError(t, next(t, p.client).Err)
		require.Equal(t, want, d1.Bytes()[:len(want)])
	} else {
		require.NoError(t, p.client.PostReadv("readv", []bufpool.Segment{t1, t2}, remote))
		require.NoError(t, next(t, p.client).Err)
		require.Equal(t, want, append(append([]byte{}, d1.Bytes()[:2000]...), src[0].Bytes()[:len(want)-2000]...))
	}
	for _, b := range []*bufpool.Buffer{src[0], src[1], src[2], d1} {
		require.NoError(t, cpool.Put(b))
	}
	require.NoError(t, spool.Put(r1))
	require.NoError(t, spool.Put(r2))
}

func TestAtomics(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	region, remote := exchangeRegion(t, ctx, p, 64, bufpool.RemoteAtomic|bufpool.RemoteRead)
	word := region.Bytes()[8:16]
	binary.NativeEndian.PutUint64(word, 100)
	w, err := remote.Slice(8, 8)
	require.NoError(t, err)
	pool := newPool(t, p.client, 8, 1)
	b, _ := pool.TryGet()
	old := func() uint64 { return binary.NativeEndian.Uint64(b.Bytes()) }
	if rxetest.IWARP() { // iWARP has no atomics: refused before posting
		require.ErrorIs(t, p.client.PostFetchAndAdd("faa", b, w, 5), endpoint.ErrNoAtomics)
		require.ErrorIs(t, p.client.PostCompareAndSwap("cas", b, w, 100, 7), endpoint.ErrNotSupported)
		require.Equal(t, uint64(100), binary.NativeEndian.Uint64(word))
		require.NoError(t, pool.Put(b), "nothing was posted")
		return
	}

	require.NoError(t, p.client.PostFetchAndAdd("faa", b, w, 5))
	c := next(t, p.client)
	require.NoError(t, c.Err)
	require.Equal(t, endpoint.OpFetchAndAdd, c.Op)
	require.Equal(t, uint64(100), old())
	require.Equal(t, uint64(105), binary.NativeEndian.Uint64(word))

	require.NoError(t, p.client.PostCompareAndSwap("cas-hit", b, w, 105, 7))
	require.NoError(t, next(t, p.client).Err)
	require.Equal(t, uint64(105), old())
	require.Equal(t, uint64(7), binary.NativeEndian.Uint64(word))

	require.NoError(t, p.client.PostCompareAndSwap("cas-miss", b, w, 999, 1))
	require.NoError(t, next(t, p.client).Err)
	require.Equal(t, uint64(7), old(), "a failed compare returns the current value")
	require.Equal(t, uint64(7), binary.NativeEndian.Uint64(word), "a failed compare changes nothing")

	misaligned, _ := remote.Slice(4, 8)
	err = p.client.PostFetchAndAdd("bad", b, misaligned, 1)
	require.ErrorIs(t, err, endpoint.ErrInvalid)
	require.NoError(t, pool.Put(b))
}

// TestBatchUnsignaledInline posts many sends in one call, most unsignaled
// and inline, and checks every context comes back exactly once.
func TestBatchUnsignaledInline(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	const n = 32
	spool := newPool(t, p.server, 64, n)
	cpool := newPool(t, p.client, 64, n)
	var recvs, sends []endpoint.Request
	for i := range n {
		rb, _ := spool.TryGet()
		recvs = append(recvs, endpoint.Request{Op: endpoint.OpRecv, Context: i, Buffer: rb, Length: rb.Len()})
		sb, _ := cpool.TryGet()
		binary.LittleEndian.PutUint64(sb.Bytes(), uint64(i))
		r := endpoint.Request{Op: endpoint.OpSend, Context: 1000 + i, Buffer: sb, Length: 8}
		r.Flags = endpoint.Unsignaled | endpoint.Inline
		sends = append(sends, r)
	}
	require.NoError(t, p.server.PostBatch(recvs))
	require.NoError(t, p.client.PostBatch(sends))
	st := p.client.Stats()
	require.Equal(t, uint64(n), st.SendRequests)
	require.Equal(t, uint64(1), st.SendDoorbells, "one batch, one doorbell")
	// The endpoint signals one in SignalEvery, so that they come back.
	require.Positive(t, st.SignaledSends)
	require.Less(t, st.SignaledSends, uint64(n/2), "most were posted unsignaled")
	seen := map[any]int{}
	for range n {
		c := next(t, p.client)
		require.NoError(t, c.Err)
		seen[c.Context]++
		require.NoError(t, cpool.Put(c.Buffer))
	}
	for i := range n {
		require.Equal(t, 1, seen[1000+i], "send %d context", i)
		c := next(t, p.server)
		require.NoError(t, c.Err)
		require.Equal(t, i, c.Context, "receives complete in order")
		require.Equal(t, uint64(i), binary.LittleEndian.Uint64(c.Buffer.Bytes()))
		require.NoError(t, spool.Put(c.Buffer))
	}

	// Inline beyond the QP's inline size is refused before posting.
	big, _ := cpool.TryGet()
	if p.client.MaxInline() < big.Len() {
		err := p.client.PostSend("too-big", big, p.client.MaxInline()+1, endpoint.Inline)
		require.ErrorIs(t, err, endpoint.ErrInvalid)
	}
	require.ErrorIs(t, p.client.PostSend("over", big, big.Len()+1), endpoint.ErrInvalid)
	require.NoError(t, cpool.Put(big))
}

// TestSilentSendsDeliverNothing posts 300 silent sends (more than the send
// queue holds, so their slots must come back without a Completion) and one
// ordinary send: the peer receives all of them, in order, and the sender
// gets exactly one Completion, the ordinary send's. No send is posted
// before the peer has a receive for it (iWARP has no RNR retry).
func TestSilentSendsDeliverNothing(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	const n = 300
	spool := newPool(t, p.server, 64, 64)
	cpool := newPool(t, p.client, 64, 1)
	sb, _ := cpool.TryGet()
	for range 64 {
		rb, _ := spool.TryGet()
		require.NoError(t, p.server.PostRecv(nil, rb))
	}
	got := 0
	take := func(c endpoint.Completion) {
		require.NoError(t, c.Err)
		require.Equal(t, uint64(got), binary.LittleEndian.Uint64(c.Buffer.Bytes()), "in order")
		got++
		require.NoError(t, p.server.PostRecv(nil, c.Buffer))
	}
	for i := range n + 1 {
		for i-got >= 64 { // every receive holds a message: wait for one to be reposted
			take(next(t, p.server))
		}
		binary.LittleEndian.PutUint64(sb.Bytes(), uint64(i))
		var err error
		for {
			if i < n {
				err = p.client.PostSend("silent", sb, 8, endpoint.Silent, endpoint.Inline)
			} else {
				err = p.client.PostSend("last", sb, 8, endpoint.Inline)
			}
			if !errors.Is(err, endpoint.ErrQueueFull) {
				break
			}
			time.Sleep(time.Millisecond) // the completion goroutine frees slots
		}
		require.NoError(t, err)
		// Keep the peer's receives posted: take and repost what arrived.
		for {
			select {
			case c := <-p.server.Completions():
				take(c)
				continue
			default:
			}
			break
		}
	}
	for got < n+1 {
		take(next(t, p.server))
	}
	c := next(t, p.client)
	require.NoError(t, c.Err)
	require.Equal(t, "last", c.Context, "only the ordinary send completes")
	select {
	case c := <-p.client.Completions():
		t.Fatalf("unexpected completion %+v", c)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, cpool.Put(sb))
	require.NoError(t, p.server.Close())
	for c := range p.server.Completions() { // the flushed receives
		require.ErrorIs(t, c.Err, endpoint.ErrClosed)
		require.NoError(t, spool.Put(c.Buffer))
	}
}

// TestQueueFullThenClose fills the send queue (the peer has no receive, so
// the sends wait in RNR retry, for ever with retry count 7), checks the
// next post is refused, then checks Close hands every pending context back
// with ErrClosed, exactly once.
func TestQueueFullThenClose(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, withQueueDepth(4), cm.WithRNRRetry(7))
	if rxetest.IWARP() { // no RNR retry holds the sends: the first one ends the connection
		requireUnreceivedSendEndsConnection(t, p)
		return
	}
	pool := newPool(t, p.client, 64, 8)
	for i := range 4 {
		b, _ := pool.TryGet()
		require.NoError(t, p.client.PostSend(i, b, 8))
	}
	b, _ := pool.TryGet()
	require.ErrorIs(t, p.client.PostSend(99, b, 8), endpoint.ErrQueueFull)
	require.NoError(t, p.client.Close())
	require.NoError(t, p.client.Close(), "Close is idempotent")
	require.ErrorIs(t, p.client.PostSend(100, b, 8), endpoint.ErrClosed)
	seen := map[any]int{}
	for c := range p.client.Completions() {
		require.ErrorIs(t, c.Err, endpoint.ErrClosed, "context %v", c.Context)
		seen[c.Context]++
		require.NoError(t, pool.Put(c.Buffer))
	}
	require.Equal(t, map[any]int{0: 1, 1: 1, 2: 1, 3: 1}, seen)
	require.NoError(t, pool.Put(b))
	select {
	case <-p.server.Done():
	case <-ctx.Done():
		t.Fatal("the server never saw the client leave")
	}
	require.True(t, errors.Is(p.server.Err(), endpoint.ErrClosed))
}

// TestRNRRecoveryIsQuick sends to a peer with no receive posted, which
// refuses the message (RNR NAK: the device counter rises), posts the
// receive 20 ms later and expects the message soon after. The kernel CM
// leaves the RNR timer at 655 ms (with it this test saw 660 ms); cm's
// default is 20.48 ms (WithRNRTimer). The bound is far from both. The
// retry count is 7 (for ever), so that a slow guest cannot turn the wait
// into the bounded default's failure.
func TestRNRRecoveryIsQuick(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, cm.WithRNRRetry(7))
	if rxetest.IWARP() { // nothing to recover from: the refused send ends the connection
		requireUnreceivedSendEndsConnection(t, p)
		return
	}
	took := rnrRecovery(t, p)
	require.Less(t, took, 300*time.Millisecond, "the refused message waited for the 655 ms RNR timer")
	t.Logf("message arrived %v after its receive was posted", took)
}

// TestRNRTimerSetsTheWait: WithRNRTimer reaches the device. Set to 400 ms
// (the step of 491.52 ms), the refused message is sent again only after
// it: its receive, posted 20 ms after the refusal, fills well past the
// default timer's 20.48 ms, and past the 300 ms bound that
// TestRNRRecoveryIsQuick holds the default to.
func TestRNRTimerSetsTheWait(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, cm.WithRNRRetry(7), cm.WithRNRTimer(400*time.Millisecond))
	if rxetest.IWARP() { // no RNR: the refused send ends the connection
		requireUnreceivedSendEndsConnection(t, p)
		return
	}
	took := rnrRecovery(t, p)
	require.Greater(t, took, 300*time.Millisecond, "the refused message came back before the RNR timer set")
	t.Logf("message arrived %v after its receive was posted", took)
}

// rnrRecovery sends to p's server, which has no receive posted and so
// refuses the message (RNR NAK: the device counter rises), posts the
// receive 20 ms later and returns how long the message took to arrive
// from then.
func rnrRecovery(t *testing.T, p *pair) time.Duration {
	t.Helper()
	counter := "/sys/class/infiniband/" + rxetest.Device() + "/ports/1/hw_counters/rcvd_rnr_err"
	before := readCounter(t, counter)
	cpool, spool := newPool(t, p.client, 64, 1), newPool(t, p.server, 64, 1)
	b, _ := cpool.TryGet()
	require.NoError(t, p.client.PostSend("early", b, 8))
	time.Sleep(20 * time.Millisecond)
	require.Greater(t, readCounter(t, counter), before, "the send was not refused: no RNR to recover from")
	rb, _ := spool.TryGet()
	posted := time.Now()
	require.NoError(t, p.server.PostRecv("late", rb))
	c := next(t, p.server)
	took := time.Since(posted)
	require.NoError(t, c.Err)
	require.Equal(t, "late", c.Context)
	require.NoError(t, next(t, p.client).Err)
	require.NoError(t, cpool.Put(b))
	require.NoError(t, spool.Put(rb))
	return took
}

// readCounter reads one of the device's hw_counters.
func readCounter(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return n
}

// With one read in flight per direction, reads posted together still all
// complete, in order and with the right bytes: the QP holds back the ones
// beyond the depth instead of failing them.
func TestReadDepthOneQueuesTheRest(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, cm.WithReadDepth(1))
	const reads, size = 16, 4096
	region, remote := exchangeRegion(t, ctx, p, reads*size, bufpool.RemoteRead)
	pattern(region.Bytes(), 7)
	pool := newPool(t, p.client, size, reads)
	bufs := make([]*bufpool.Buffer, reads)
	for i := range bufs {
		bufs[i], _ = pool.TryGet()
		part, err := remote.Slice(i*size, size)
		require.NoError(t, err)
		require.NoError(t, p.client.PostRead(i, bufs[i], size, part))
	}
	for i := range bufs {
		c := next(t, p.client)
		require.NoError(t, c.Err)
		require.Equal(t, i, c.Context, "reads complete in order")
		require.True(t, bytes.Equal(region.Bytes()[i*size:(i+1)*size], bufs[i].Bytes()[:size]), "read %d differs", i)
		require.NoError(t, pool.Put(bufs[i]))
	}
}

// TestReadCompletesAfterItsData: a READ's completion comes once its bytes
// are in the sink, even when a send posted after it completes first (siw
// completes a send as TCP takes it, and a READ when its response has
// arrived); so does one asked for Unsignaled, which the endpoint posts
// signaled.
func TestReadCompletesAfterItsData(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	const size = 4 << 20
	region, remote := exchangeRegion(t, ctx, p, size, bufpool.RemoteRead)
	sinks := newPool(t, p.client, size, 1)
	sink, _ := sinks.TryGet()
	defer sinks.Put(sink)
	spool := newPool(t, p.client, 64, 1)
	sb, _ := spool.TryGet()
	defer spool.Put(sb)
	rpool := newPool(t, p.server, 64, 1)
	rb, _ := rpool.TryGet()
	defer rpool.Put(rb)
	for i, flags := range [][]endpoint.Flags{nil, {endpoint.Unsignaled}} {
		pattern(region.Bytes(), 20+i)
		clear(sink.Bytes())
		require.NoError(t, p.server.PostRecv("recv", rb))
		require.NoError(t, p.client.PostRead("read", sink, size, remote, flags...))
		require.NoError(t, p.client.PostSend("send", sb, 8))
		seen := map[any]int{}
		for range 2 {
			c := next(t, p.client)
			require.NoError(t, c.Err)
			seen[c.Context]++
			if c.Context == "read" {
				require.True(t, bytes.Equal(region.Bytes(), sink.Bytes()), "flags %v: the READ completed before its bytes were in the sink", flags)
			}
		}
		require.Equal(t, map[any]int{"read": 1, "send": 1}, seen, "flags %v", flags)
		require.NoError(t, next(t, p.server).Err)
	}
}

// TestNotifyWaitsForOneRequest: a request with a Notify channel delivers
// its completion there, exactly once, while the others keep arriving on
// Completions; Close flushes a pending one to its Notify too.
func TestNotifyWaitsForOneRequest(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	region, remote := exchangeRegion(t, ctx, p, 4096, bufpool.RemoteRead|bufpool.RemoteWrite)
	copy(region.Bytes(), "read me")
	pool := newPool(t, p.client, 64, 3)
	rb, _ := pool.TryGet()
	wb, _ := pool.TryGet()
	mine := make(chan endpoint.Completion, 1)
	elsewhere, err := remote.Slice(100, 8)
	require.NoError(t, err)
	require.NoError(t, p.client.PostBatch([]endpoint.Request{
		{Op: endpoint.OpWrite, Context: "write", Buffer: wb, Length: 8, Remote: elsewhere, Flags: endpoint.NoInline},
		{Op: endpoint.OpRead, Context: "read", Buffer: rb, Length: 7, Remote: remote, Notify: mine},
	}))
	select {
	case c := <-mine:
		require.NoError(t, c.Err)
		require.Equal(t, "read", c.Context)
		require.Same(t, rb, c.Buffer)
		require.Equal(t, "read me", string(rb.Bytes()[:7]))
	case <-time.After(20 * time.Second):
		t.Fatal("no completion on Notify")
	}
	c := next(t, p.client)
	require.Equal(t, "write", c.Context, "the other request's completion is on Completions")
	select {
	case c := <-mine:
		t.Fatalf("a second completion on Notify: %+v", c)
	case c := <-p.client.Completions():
		t.Fatalf("the Notify request also reached Completions: %+v", c)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, pool.Put(rb))
	require.NoError(t, pool.Put(wb))

	// A receive nobody sends to: Close flushes it to its Notify.
	spool := newPool(t, p.server, 64, 1)
	b, _ := spool.TryGet()
	flushed := make(chan endpoint.Completion, 1)
	require.NoError(t, p.server.PostBatch([]endpoint.Request{{Op: endpoint.OpRecv, Context: "waiting", Buffer: b, Notify: flushed}}))
	require.NoError(t, p.server.Close())
	select {
	case c := <-flushed:
		require.Equal(t, "waiting", c.Context)
		require.ErrorIs(t, c.Err, endpoint.ErrClosed)
		require.NoError(t, spool.Put(c.Buffer))
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not flush the receive to its Notify")
	}
}
