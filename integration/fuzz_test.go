package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

// fuzzConn is the connection FuzzPostRequest posts on: made once per
// process (a fuzz worker runs many inputs), and made again when an input's
// work request failed on the device and took the connection down.
type fuzzConn struct {
	p        *pair
	pool     *bufpool.Pool   // the client's buffers
	local    *bufpool.Region // a client region, posted as a buffer
	remote   *bufpool.Region // the server's region the client reads, writes and updates
	srvPool  *bufpool.Pool   // the server's receive and send buffers
	srvRecvs int             // receives the server has posted
	// pending are the contexts of posts that will deliver a completion and
	// have not yet: each must come back exactly once, at the latest when
	// the connection is closed. silent are those of silent posts, which
	// deliver one only if they fail.
	pending, silent map[int]bool
	next            int
	// notify is the Notify channel of inputs that ask for one; roomy, so
	// that a flush at close never waits for a reader.
	notify chan endpoint.Completion
}

var fuzzed *fuzzConn

// fuzzConnection returns the process's connection, made anew if the last
// one is gone. It outlives single inputs: FuzzPostRequest's cleanup closes
// the last one.
func fuzzConnection(t *testing.T, addr string) *fuzzConn {
	if fuzzed != nil {
		select {
		case <-fuzzed.p.client.Done():
			fuzzed.close(t)
			fuzzed = nil
		case <-fuzzed.p.server.Done():
			fuzzed.close(t)
			fuzzed = nil
		default:
			return fuzzed
		}
	}
	ctx := context.Background()
	fc := &fuzzConn{pending: map[int]bool{}, silent: map[int]bool{}, notify: make(chan endpoint.Completion, 64)}
	l, client, server, err := dialPair(ctx, addr)
	require.NoError(t, err)
	fc.p = &pair{client: client, server: server, listener: l}
	fc.pool, err = bufpool.New(client.PD(), bufpool.Size(4096), bufpool.Count(4))
	require.NoError(t, err)
	fc.local, err = bufpool.NewRegion(client.PD(), 4096, 0)
	require.NoError(t, err)
	fc.remote, err = bufpool.NewRegion(server.PD(), 4096, bufpool.RemoteRead|bufpool.RemoteWrite|bufpool.RemoteAtomic)
	require.NoError(t, err)
	fc.srvPool, err = bufpool.New(server.PD(), bufpool.Size(4096), bufpool.Count(serverRecvs+8))
	require.NoError(t, err)
	fuzzed = fc
	return fc
}

// close ends the connection and checks that every pending context came
// back exactly once and every buffer went home.
func (fc *fuzzConn) close(t testing.TB) {
	for _, side := range []*endpoint.Endpoint{fc.p.client, fc.p.server} {
		require.NoError(t, side.CloseAndDrain(func(c endpoint.Completion) {
			fc.delivered(t, c)
			fc.putHome(c)
		}))
	}
	for len(fc.notify) > 0 {
		c := <-fc.notify
		fc.delivered(t, c)
		fc.putHome(c)
	}
	require.Empty(t, fc.pending, "posted contexts that never came back")
	require.Zero(t, fc.pool.Stats().Out, "client buffers not back")
	require.Zero(t, fc.srvPool.Stats().Out, "server buffers not back")
	require.NoError(t, fc.pool.Close())
	require.NoError(t, fc.srvPool.Close())
	require.NoError(t, fc.local.Close())
	require.NoError(t, fc.remote.Close())
	require.NoError(t, fc.p.listener.Close())
}

// putHome puts a flushed completion's buffer back in its pool.
func (fc *fuzzConn) putHome(c endpoint.Completion) {
	if c.Buffer != nil && c.Buffer != fc.local.Buffer() {
		for _, p := range []*bufpool.Pool{fc.pool, fc.srvPool} {
			if p.Put(c.Buffer) == nil {
				return
			}
		}
	}
}

// serverRecvs is how many receives the server keeps posted for the
// client's sends and writes with immediate data.
const serverRecvs = 64

// delivered accounts for a completion of the client's: its context must be
// pending, or silent and failed.
func (fc *fuzzConn) delivered(t testing.TB, c endpoint.Completion) (id int) {
	id, ok := c.Context.(int)
	switch {
	case !ok:
		return 0
	case fc.pending[id]:
		delete(fc.pending, id)
	case fc.silent[id]:
		require.Error(t, c.Err, "a silent post that succeeded delivered a completion")
		delete(fc.silent, id)
	default:
		t.Fatalf("context %d delivered twice or never posted", id)
	}
	return id
}

// FuzzPostRequest builds arbitrary Requests (any op, buffer, length,
// segments, remote, immediate data, atomic operands and flags) and posts
// them on a real endpoint: a post either succeeds, and its completion comes
// back exactly once, or is refused with a typed error and posts nothing;
// never a panic, a lost context, a leaked buffer or verbs resource.
func FuzzPostRequest(f *testing.F) {
	rxetest.CheckResources(f)
	addr := rxetest.Addr(f)
	f.Cleanup(func() {
		if fuzzed != nil {
			fuzzed.close(f)
			fuzzed = nil
		}
	})
	// Seeds: op, buffer kind (and 4: a Notify channel), length, segments, segment offset and length,
	// remote kind, imm flag, imm, compare, swap, add, flags.
	f.Add(uint8(endpoint.OpSend), uint8(1), int64(64), uint8(0), int64(0), int64(0), uint8(0), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(0))
	f.Add(uint8(endpoint.OpSend), uint8(1), int64(8), uint8(0), int64(0), int64(0), uint8(0), false, uint32(7), uint64(0), uint64(0), uint64(0), uint8(0))
	f.Add(uint8(endpoint.OpRecv), uint8(1), int64(0), uint8(0), int64(0), int64(0), uint8(0), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(endpoint.Silent))
	f.Add(uint8(endpoint.OpWrite), uint8(2), int64(4096), uint8(0), int64(0), int64(0), uint8(1), true, uint32(9), uint64(0), uint64(0), uint64(0), uint8(endpoint.Solicited))
	f.Add(uint8(endpoint.OpRead), uint8(0), int64(0), uint8(3), int64(100), int64(900), uint8(2), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(endpoint.Fence))
	f.Add(uint8(endpoint.OpCompareAndSwap), uint8(1), int64(8), uint8(0), int64(0), int64(0), uint8(1), false, uint32(0), uint64(0), uint64(5), uint64(0), uint8(0))
	f.Add(uint8(endpoint.OpFetchAndAdd), uint8(1), int64(8), uint8(0), int64(0), int64(0), uint8(1), false, uint32(0), uint64(0), uint64(0), uint64(3), uint8(endpoint.Unsignaled))
	f.Add(uint8(endpoint.OpFetchAndAdd), uint8(1), int64(8), uint8(0), int64(0), int64(0), uint8(1), false, uint32(0), uint64(1), uint64(0), uint64(3), uint8(0))
	f.Add(uint8(endpoint.OpSend), uint8(3), int64(16), uint8(0), int64(0), int64(0), uint8(0), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(endpoint.Inline|endpoint.NoInline))
	f.Add(uint8(endpoint.OpWrite), uint8(1), int64(64), uint8(0), int64(0), int64(0), uint8(3), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(0))
	f.Add(uint8(endpoint.OpRead), uint8(5), int64(64), uint8(0), int64(0), int64(0), uint8(1), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(0))
	f.Add(uint8(9), uint8(1), int64(-1), uint8(9), int64(-5), int64(1<<40), uint8(0), true, uint32(1), uint64(1), uint64(1), uint64(1), uint8(0xff))
	// A send of two whole buffers, longer than the server's receive: it
	// fails the server's side too, whose posts are refused from then on
	// while its Done waits out its grace; the send after it meets that.
	f.Add(uint8(endpoint.OpSend), uint8(0), int64(0), uint8(2), int64(0), int64(4096), uint8(0), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(0))
	f.Add(uint8(endpoint.OpSend), uint8(1), int64(64), uint8(0), int64(0), int64(0), uint8(0), false, uint32(0), uint64(0), uint64(0), uint64(0), uint8(0))
	f.Fuzz(func(t *testing.T, op, bufKind uint8, length int64, nsegs uint8, segOff, segLen int64,
		remoteKind uint8, hasImm bool, imm uint32, compare, swap, add uint64, flags uint8) {
		fc := fuzzConnection(t, addr)
		r := endpoint.Request{Op: endpoint.Op(op % 8), Length: int(length), HasImm: hasImm, Imm: imm,
			Compare: compare, Swap: swap, Add: add, Flags: endpoint.Flags(flags)}
		var held *bufpool.Buffer // a pool buffer this input took
		if bufKind&4 != 0 {
			r.Notify = fc.notify
		}
		switch bufKind % 4 {
		case 1:
			held, _ = fc.pool.TryGet()
			r.Buffer = held
		case 2:
			r.Buffer = fc.local.Buffer()
		case 3: // a buffer already put back in its pool
			b, _ := fc.pool.TryGet()
			require.NoError(t, fc.pool.Put(b))
			r.Buffer = b
		}
		for i := range int(nsegs % 8) {
			if i == 0 && held == nil {
				held, _ = fc.pool.TryGet()
			}
			s, err := held.Segment(int(segOff), int(segLen)) // the zero Segment when out of range
			if err != nil {
				require.ErrorIs(t, err, bufpool.ErrRange)
			}
			r.Segments = append(r.Segments, s)
		}
		switch remoteKind % 4 {
		case 1:
			r.Remote = fc.remote.Remote()
		case 2:
			r.Remote, _ = fc.remote.Remote().Slice(int(segOff%4096), int(segLen%64))
		case 3: // memory the client was never given
			r.Remote = bufpool.Remote{Addr: compare, RKey: imm, Len: add}
		}
		fc.post(t, r)
		if held == nil {
			return
		}
		err := fc.pool.Put(held)
		if errors.Is(err, bufpool.ErrPosted) {
			// Only a silent request on a connection that ended before a
			// later signaled completion is still posted: closing the
			// connection flushes it back, and close puts its buffer home.
			select {
			case <-fc.p.client.Done():
			default:
				t.Fatalf("the buffer is still posted on a live connection")
			}
			fc.close(t)
			fuzzed = nil
			return
		}
		require.NoError(t, err, "the buffer came back from its completion")
	})
}

// post posts r and checks what follows: a refusal posts nothing; a post
// that is not silent delivers its completion exactly once.
func (fc *fuzzConn) post(t *testing.T, r endpoint.Request) {
	fc.next++
	id := fc.next
	r.Context = id
	// Receives on the server for the sends and writes with immediate data
	// the client may post. Each input consumes at most one, and its
	// completion is taken here or while waiting; many are posted so that
	// ones not yet taken never leave the server without.
	fc.takeServer()
	for fc.srvRecvs < serverRecvs {
		b, ok := fc.srvPool.TryGet()
		require.True(t, ok)
		if err := fc.p.server.PostRecv("srv-recv", b); err != nil {
			// An earlier input failed the server's side (a send longer
			// than its receive): its posts are refused from the failure
			// on, before its Done closes. The client's side fails with
			// it, and a later input makes a new connection.
			require.ErrorIs(t, err, endpoint.ErrClosed, "the server's receive")
			require.NoError(t, fc.srvPool.Put(b))
			break
		}
		fc.srvRecvs++
	}
	err := fc.p.client.PostBatch([]endpoint.Request{r})
	if err != nil {
		var ce *endpoint.CompletionError
		switch {
		case errors.Is(err, endpoint.ErrInvalid), errors.Is(err, endpoint.ErrNotSupported):
		case errors.As(err, &ce), errors.Is(err, endpoint.ErrClosed):
			// An earlier input's failure ended the connection; posts are refused.
		default:
			t.Fatalf("post of %s: untyped error %v", describe(r), err)
		}
		fc.expectNothing(t)
		return
	}
	if r.Op == endpoint.OpRecv {
		fc.serverSends(t) // a 0-byte message fits every receive
	}
	silent := r.Flags&endpoint.Silent != 0
	if silent {
		fc.silent[id] = true // it delivers only a failure
	} else {
		fc.pending[id] = true
	}
	if r.Flags&(endpoint.Unsignaled|endpoint.Silent) != 0 {
		// The device hands it back with the next signaled completion of
		// the send queue (then its buffer may go back to its pool): post
		// one, a 0-byte write, and wait for it.
		fc.next++
		flush := endpoint.Request{Op: endpoint.OpWrite, Context: fc.next, Buffer: fc.local.Buffer(), Remote: fc.remote.Remote()}
		if err := fc.p.client.PostBatch([]endpoint.Request{flush}); err != nil {
			// The connection ended (closing it hands the request back), or
			// the unsignaled request failed on the device and later posts
			// are refused with its error.
			var ce *endpoint.CompletionError
			if !errors.Is(err, endpoint.ErrClosed) {
				require.ErrorAs(t, err, &ce, "the signaled write after an unsignaled request")
			}
			return
		}
		fc.pending[fc.next] = true
		defer fc.waitFor(t, fc.next, "the signaled write after it")
	}
	if !silent {
		fc.waitFor(t, id, describe(r))
	}
}

// waitFor reads the client's completions until id's has come, and the
// server's.
func (fc *fuzzConn) waitFor(t *testing.T, id int, what string) {
	// Completions on Notify and on the channel come in no order between
	// them: id's may have come while waiting for another.
	deadline := time.After(8 * time.Second) // within the fuzzing engine's 10 s per input
	completions, ended := fc.p.client.Completions(), fc.p.client.Done()
	var endGrace <-chan time.Time
	for fc.pending[id] {
		select {
		case c, ok := <-completions:
			if !ok { // after the Close below: id's goes to Notify
				completions = nil
				continue
			}
			fc.delivered(t, c)
		case c := <-fc.notify:
			fc.delivered(t, c)
		case c := <-fc.p.server.Completions():
			fc.serverCompleted(c)
		case <-ended:
			ended, endGrace = nil, time.After(time.Second)
		case <-endGrace:
			// The connection ended and the device did not flush id's
			// request. siw does not when it was posted after the peer's
			// terminate had failed the QP and before this side heard:
			// it stays in the send queue, which the device no longer
			// reads. Close hands it back, with ErrClosed.
			require.NoError(t, fc.p.client.Close())
		case <-deadline:
			t.Fatalf("no completion for %s within 8 s", what)
		}
	}
}

// serverSends sends a 0-byte message from the server.
func (fc *fuzzConn) serverSends(t *testing.T) {
	b, ok := fc.srvPool.TryGet()
	require.True(t, ok)
	if err := fc.p.server.PostSend("srv-send", b, 0); err != nil {
		require.NoError(t, fc.srvPool.Put(b))
	}
}

// takeServer takes the server's completions that are there.
func (fc *fuzzConn) takeServer() {
	for {
		select {
		case c := <-fc.p.server.Completions():
			fc.serverCompleted(c)
		default:
			return
		}
	}
}

func (fc *fuzzConn) serverCompleted(c endpoint.Completion) {
	if c.Context == "srv-recv" {
		fc.srvRecvs--
	}
	if c.Buffer != nil {
		fc.srvPool.Put(c.Buffer)
	}
}

// expectNothing checks that a refused post delivered nothing.
func (fc *fuzzConn) expectNothing(t *testing.T) {
	select {
	case c, ok := <-fc.p.client.Completions():
		if ok {
			fc.delivered(t, c) // fails for the refused post's context
		}
	default:
	}
}

func describe(r endpoint.Request) string {
	return fmt.Sprintf("%v (buffer %v, length %d, %d segments, remote %+v, imm %v/%d, flags %v)",
		r.Op, r.Buffer != nil, r.Length, len(r.Segments), r.Remote, r.HasImm, r.Imm, r.Flags)
}
