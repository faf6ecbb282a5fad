package integration

import (
	"errors"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// rawQP is a queue pair made through internal/verbs on an id that resolved
// a route but never connected, with a registered page to point requests
// at: the state in which the devices' own refusals can be reached on
// purpose.
type rawQP struct {
	id  *verbs.CMID
	cq  *verbs.CQ
	sge verbs.SGE
}

// newRawQP makes one, taking one entry a request, freed when t ends.
func newRawQP(t *testing.T) *rawQP {
	t.Helper()
	ai, err := verbs.GetAddrInfo(rxetest.Addr(t), "7", false, verbs.PortSpaceTCP)
	require.NoError(t, err)
	defer ai.Free()
	id, err := verbs.CreateEP(ai) // resolves the address and route
	require.NoError(t, err)
	t.Cleanup(id.DestroyEP)
	dev := id.Context()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pd.Dealloc()) })
	page, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, syscall.Munmap(page)) })
	mr, err := pd.RegMsgs(unsafe.Pointer(&page[0]), len(page))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, mr.Dereg()) })
	cq, err := dev.NewCQ(16, nil, 16)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cq.Destroy()) })
	_, err = id.CreateQP(pd, verbs.QPInit{SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, id.DestroyQP()) })
	return &rawQP{id: id, cq: cq, sge: verbs.SGE{Addr: mr.Addr(), Len: 64, LKey: mr.LKey()}}
}

// send is a signaled send of n entries of the page.
func (q *rawQP) send(wrID uint64, n int) *verbs.SendWR {
	sges := make([]verbs.SGE, n)
	for i := range sges {
		sges[i] = q.sge
	}
	return &verbs.SendWR{WRID: wrID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGE: sges}
}

// post posts wrs in one call and returns the *verbs.PostError it must fail with.
func (q *rawQP) post(t *testing.T, wrs ...*verbs.SendWR) *verbs.PostError {
	t.Helper()
	entries := 0
	for _, wr := range wrs {
		entries += len(wr.SGE)
	}
	batch := verbs.NewSendBatch(len(wrs), entries)
	defer batch.Free()
	for _, wr := range wrs {
		require.NoError(t, batch.Add(wr))
	}
	err := verbs.Post(q.id, nil, nil, batch)
	pe, ok := errors.AsType[*verbs.PostError](err)
	require.Truef(t, ok, "want a *verbs.PostError, got %v", err)
	require.False(t, pe.Recv)
	return pe
}

// TestPostDoorbellRefusedAfterQueuing: rxe's and siw's providers write a
// post's requests into a queue the device maps, then ring the kernel's
// doorbell, which refuses a queue pair that cannot send (never connected:
// INIT on rxe, IDLE on siw). The call then fails naming no request,
// though every one was queued: Post must say that none was refused, not
// that none was posted, or its caller would free slots and buffers the
// device still holds and will complete.
func TestPostDoorbellRefusedAfterQueuing(t *testing.T) {
	rxetest.CheckResources(t)
	q := newRawQP(t)
	pe := q.post(t, q.send(1, 1), q.send(2, 1))
	require.Equal(t, 2, pe.Index, "both requests were queued: %v", pe)
	require.True(t, pe.Queued, "%v", pe)
	// siw's doorbell is a write(2) that fails with errno; rxe's provider
	// returns the errno of its own.
	want := syscall.EINVAL
	if rxetest.IWARP() {
		want = syscall.ENOTCONN
	}
	require.ErrorIs(t, pe, want)

	// The queued requests are the device's: rxe flushes them, each once,
	// when the queue pair fails. (siw flushes only its receive queue on
	// that move from IDLE; a connection's close flushes its send queue.)
	require.NoError(t, q.id.FailQP())
	if rxetest.IWARP() {
		return
	}
	var flushed []uint64
	deadline := time.Now().Add(5 * time.Second)
	for len(flushed) < 2 && time.Now().Before(deadline) {
		n, err := q.cq.Poll()
		require.NoError(t, err)
		for i := range n {
			wc := q.cq.At(i)
			require.Equal(t, verbs.WCWRFlushErr, wc.Status)
			flushed = append(flushed, wc.WRID)
		}
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, []uint64{1, 2}, flushed)
}

// TestPostReportsRequestProviderRefused: a request the provider refuses
// (more entries than a queue pair takes) behind one it queued, on a queue
// pair whose doorbell works (in the error state, which both devices
// accept). siw's provider then returns the doorbell's success over its
// refusal; Post must still name the refused request.
func TestPostReportsRequestProviderRefused(t *testing.T) {
	rxetest.CheckResources(t)
	q := newRawQP(t)
	require.NoError(t, q.id.FailQP())
	const tooMany = 7 // over siw's 6 entries a request, and the 1 this QP takes
	pe := q.post(t, q.send(1, 1), q.send(2, tooMany))
	require.Equal(t, 1, pe.Index, "%v", pe)
	require.False(t, pe.Queued)
	require.ErrorIs(t, pe, syscall.EINVAL)
}
