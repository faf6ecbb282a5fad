package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// TestHotPathsDoNotAllocate: pool Get/Put, and a post with its completion,
// allocate nothing in steady state.
func TestHotPathsDoNotAllocate(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	pool := newPool(t, p.client, 64, 16)
	allocs := testing.AllocsPerRun(1000, func() {
		b, _ := pool.Get(ctx)
		pool.Put(b)
	})
	require.Zero(t, allocs, "Get+Put allocates")

	region, remote := exchangeRegion(t, ctx, p, 4096, bufpool.RemoteWrite)
	_ = region
	b, _ := pool.TryGet()
	defer pool.Put(b)
	allocs = testing.AllocsPerRun(500, func() {
		if err := p.client.PostWrite(nil, b, 64, remote); err != nil {
			t.Fatal(err)
		}
		if c := <-p.client.Completions(); c.Err != nil {
			t.Fatal(c.Err)
		}
	})
	require.Zero(t, allocs, "PostWrite + its completion allocates")

	allocs = testing.AllocsPerRun(500, func() {
		if err := p.client.PostWrite(nil, b, 64, remote); err != nil {
			t.Fatal(err)
		}
		if c, err := p.client.Next(ctx); err != nil || c.Err != nil {
			t.Fatal(err, c.Err)
		}
	})
	require.Zero(t, allocs, "PostWrite + Next allocates")

	rpool := newPool(t, p.server, 64, 1)
	rb, _ := rpool.TryGet()
	defer rpool.Put(rb)
	allocs = testing.AllocsPerRun(500, func() {
		if err := p.server.PostRecv(nil, rb); err != nil {
			t.Fatal(err)
		}
		if err := p.client.PostSend(nil, b, 64); err != nil {
			t.Fatal(err)
		}
		if c := <-p.client.Completions(); c.Err != nil {
			t.Fatal(c.Err)
		}
		if c := <-p.server.Completions(); c.Err != nil || c.Len != 64 {
			t.Fatal(c.Err, c.Len)
		}
	})
	require.Zero(t, allocs, "PostRecv + PostSend + both completions allocate")
}

func BenchmarkPoolGetPut(b *testing.B) {
	ctx := context.Background()
	p := benchPair(b)
	pool, err := bufpool.New(p.client.PD(), bufpool.Size(4096), bufpool.Count(64))
	require.NoError(b, err)
	defer pool.Close()
	b.ReportAllocs()
	for b.Loop() {
		buf, _ := pool.Get(ctx)
		pool.Put(buf)
	}
}

// BenchmarkPostWrite64 posts 64-byte RDMA writes, keeping 16 in flight, and
// collects their completions.
func BenchmarkPostWrite64(b *testing.B) {
	p := benchPair(b)
	ctx := context.Background()
	pool, err := bufpool.New(p.client.PD(), bufpool.Size(64), bufpool.Count(1))
	require.NoError(b, err)
	defer pool.Close()
	region, err := bufpool.NewRegion(p.server.PD(), 4096, bufpool.RemoteWrite)
	require.NoError(b, err)
	defer region.Close()
	buf, _ := pool.Get(ctx)
	defer pool.Put(buf)
	remote := region.Remote() // in a real program it would travel in a message
	inflight := 0
	b.ReportAllocs()
	for b.Loop() {
		for inflight >= 16 {
			<-p.client.Completions()
			inflight--
		}
		if err := p.client.PostWrite(nil, buf, 64, remote); err != nil {
			b.Fatal(err)
		}
		inflight++
	}
	for ; inflight > 0; inflight-- {
		<-p.client.Completions()
	}
}

// BenchmarkPostSend64 sends 64-byte messages, keeping 16 in flight: each
// op is a send posted, its completion, the receive's completion at the
// peer and that receive posted again (the peer keeps 32 posted, so a send
// never finds none).
func BenchmarkPostSend64(b *testing.B) {
	p := benchPair(b)
	send, err := bufpool.New(p.client.PD(), bufpool.Size(64), bufpool.Count(1))
	require.NoError(b, err)
	defer send.Close()
	recv, err := bufpool.New(p.server.PD(), bufpool.Size(64), bufpool.Count(32))
	require.NoError(b, err)
	defer recv.Close()
	for range 32 {
		rb, _ := recv.TryGet()
		require.NoError(b, p.server.PostRecv(nil, rb))
	}
	buf, _ := send.TryGet()
	defer send.Put(buf)
	reap := func() {
		if c := <-p.client.Completions(); c.Err != nil {
			b.Fatal(c.Err)
		}
		c := <-p.server.Completions()
		if c.Err != nil {
			b.Fatal(c.Err)
		}
		if err := p.server.PostRecv(nil, c.Buffer); err != nil {
			b.Fatal(err)
		}
	}
	inflight := 0
	b.ReportAllocs()
	for b.Loop() {
		for inflight >= 16 {
			reap()
			inflight--
		}
		if err := p.client.PostSend(nil, buf, 64); err != nil {
			b.Fatal(err)
		}
		inflight++
	}
	for ; inflight > 0; inflight-- {
		reap()
	}
}

// BenchmarkRPCEcho: 64 B echo calls through msg.Client and msg.Server on
// one connection, from one caller and from 16. Both sides run in this
// process, so allocs/op is a call's allocations at both ends.
func BenchmarkRPCEcho(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			ctx := context.Background()
			cl, _, stop := rpcClient(b, ctx)
			req := make([]byte, 64)
			b.ReportAllocs()
			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := cl.Call(ctx, "echo", req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			stop()
		})
	}
}

// BenchmarkRPCLargeRequest sends 8 MiB requests whose response is 8
// bytes ("sum"): copied into the client's rendezvous region (Call), or
// lent from a region the caller registered (CallRegion), which the server
// reads straight from. b.SetBytes makes the MB/s the request's.
func BenchmarkRPCLargeRequest(b *testing.B) {
	const size = 8 << 20
	for _, lend := range []bool{false, true} {
		b.Run(map[bool]string{false: "Call", true: "CallRegion"}[lend], func(b *testing.B) {
			ctx := context.Background()
			cl, _, stop := rpcClient(b, ctx)
			region, err := bufpool.NewRegion(cl.PD(), size, bufpool.RemoteRead)
			require.NoError(b, err)
			req := region.Bytes()
			pattern(req, 1)
			want := sumWords(req)
			b.SetBytes(size)
			for b.Loop() {
				var got []byte
				if lend {
					got, err = cl.CallRegion(ctx, "sum", region, size)
				} else {
					got, err = cl.Call(ctx, "sum", req)
				}
				if err != nil || !bytes.Equal(got, want) {
					b.Fatalf("got %x, %v; want %x", got, err, want)
				}
			}
			b.StopTimer()
			stop()
			require.NoError(b, region.Close())
		})
	}
}

// BenchmarkRPCLargeResponse answers 8-byte requests with 8 MiB
// responses: returned by the handler, which the server copies into its
// rendezvous region, or lent from a region the handler registered
// (Respond), which the client reads straight from. b.SetBytes makes the
// MB/s the response's.
func BenchmarkRPCLargeResponse(b *testing.B) {
	const size = 8 << 20
	for _, lend := range []bool{false, true} {
		b.Run(map[bool]string{false: "Return", true: "Respond"}[lend], func(b *testing.B) {
			ctx := context.Background()
			pd, err := bufpool.OpenPD(ctx, rxetest.Addr(b))
			require.NoError(b, err)
			region, err := bufpool.NewRegion(pd, size, bufpool.RemoteRead)
			require.NoError(b, err)
			pattern(region.Bytes(), 5)
			resp := append([]byte(nil), region.Bytes()...)
			l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(b), "0"), msg.WithCMOptions(cm.WithPD(pd)))
			require.NoError(b, err)
			s := msg.NewServer(func(ctx context.Context, _ string, _ []byte) ([]byte, error) {
				if lend {
					return nil, msg.Respond(ctx, region, size)
				}
				return resp, nil
			})
			served := make(chan error, 1)
			go func() { served <- s.Serve(ctx, l) }()
			cl, err := msg.DialClient(ctx, l.Addr().String())
			require.NoError(b, err)
			b.SetBytes(size)
			for b.Loop() {
				got, err := cl.Call(ctx, "get", []byte("8 bytes!"))
				if err != nil || len(got) != size {
					b.Fatalf("got %d bytes, %v; want %d", len(got), err, size)
				}
			}
			b.StopTimer()
			require.NoError(b, cl.Close())
			require.NoError(b, s.Shutdown(ctx))
			require.ErrorIs(b, <-served, msg.ErrShutdown)
			require.NoError(b, region.Close())
			require.NoError(b, pd.Close())
		})
	}
}

// BenchmarkRdmanetCopy streams 64 KiB blocks through an rdmanet Conn with
// io.Copy at one end. Receiving, into a writer that drops them: through
// the Conn's WriteTo, which hands the receive buffers to the writer, or
// through Read into io.Copy's own 32 KiB buffer (the Conn hidden behind
// an io.Reader). Sending, from a source that copies each block out: through
// the Conn's ReadFrom, which has the source fill the send buffers, or
// through io.Copy's buffer and Write (the Conn hidden behind an
// io.Writer). b.SetBytes makes the MB/s the stream's.
func BenchmarkRdmanetCopy(b *testing.B) {
	const block = 64 << 10
	for _, side := range []string{"WriteTo", "Read", "ReadFrom", "Write"} {
		b.Run(side, func(b *testing.B) {
			c1, c2, stop, err := rdmanetPair(b)
			require.NoError(b, err)
			defer stop()
			src := &blockSource{block: make([]byte, block), left: int64(b.N) * block}
			var dst io.Writer = c1
			if side == "Write" {
				dst = struct{ io.Writer }{c1}
			}
			var from io.Reader = c2
			if side == "Read" {
				from = struct{ io.Reader }{c2}
			}
			b.SetBytes(block)
			b.ResetTimer()
			wrote := make(chan error, 1)
			go func() {
				var err error
				if side == "ReadFrom" || side == "Write" {
					_, err = io.Copy(dst, src)
				} else {
					for range b.N {
						if _, err = c1.Write(src.block); err != nil {
							break
						}
					}
				}
				wrote <- errors.Join(err, c1.(*rdmanet.Conn).CloseWrite())
			}()
			n, err := io.Copy(struct{ io.Writer }{io.Discard}, from) // no ReadFrom: io.Copy uses WriteTo or its buffer
			require.NoError(b, err)
			require.NoError(b, <-wrote)
			require.EqualValues(b, b.N*block, n)
		})
	}
}

// blockSource reads left bytes, copied out of block as a file's reads
// copy out of the page cache.
type blockSource struct {
	block []byte
	left  int64
}

func (s *blockSource) Read(p []byte) (int, error) {
	if s.left == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(int64(len(p)), s.left)], s.block)
	s.left -= int64(n)
	return n, nil
}

// TestMsgRecvAllocations: a message sent and received with Send and Recv
// allocates Recv's copy of the payload, which the caller keeps, and
// nothing else: no Message (Recv releases the message itself).
func TestMsgRecvAllocations(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	a, b, _ := msgPair(t, ctx)
	payload := make([]byte, 64)
	hop := func(from, to *msg.Conn) func() error {
		return func() error {
			if err := from.Send(ctx, payload); err != nil {
				return err
			}
			_, err := to.Recv(ctx)
			return err
		}
	}
	allocs := roundTripAllocs(t, hop(a, b), hop(b, a))
	require.LessOrEqual(t, allocs, 2.0, "allocations a round trip of two messages")
}

// TestRdmanetReadAllocations: bytes written and read back over rdmanet
// allocate nothing: a Read fills the caller's slice from the receive
// buffer, and takes each message into the one Message its Conn reuses.
func TestRdmanetReadAllocations(t *testing.T) {
	rxetest.CheckResources(t)
	a, b, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	out, in := make([]byte, 64), make([]byte, 64)
	hop := func(from, to net.Conn) func() error {
		return func() error {
			if _, err := from.Write(out); err != nil {
				return err
			}
			_, err := io.ReadFull(to, in)
			return err
		}
	}
	allocs := roundTripAllocs(t, hop(a, b), hop(b, a))
	require.Zero(t, allocs, "allocations a round trip of 64 bytes each way")
}

// roundTripAllocs is the allocations of there then back (each a message
// one way and its reading), averaged over 500 round trips.
func roundTripAllocs(t *testing.T, there, back func() error) float64 {
	allocs := testing.AllocsPerRun(500, func() {
		if err := there(); err != nil {
			t.Fatal(err)
		}
		if err := back(); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.2f allocations a round trip", allocs)
	return allocs
}

// TestRPCCallAllocations: a call allocates, at both ends together, the
// two copies of its payload (the request its handler keeps, the response
// its caller gets) and the server's record of the call (its handler's
// context), and nothing else: no request head, method name, Message,
// request buffer or reply channel of its own (12 allocations a call
// before those went). With the race detector, whose sync.Pool drops a
// share of what is put back, a reply channel is made now and then.
func TestRPCCallAllocations(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	cl, _, stop := rpcClient(t, ctx)
	req := make([]byte, 64)
	allocs := testing.AllocsPerRun(500, func() {
		if _, err := cl.Call(ctx, "echo", req); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.2f allocations a call, both ends", allocs)
	bound := 3.0
	if raceEnabled {
		bound = 4
	}
	require.LessOrEqual(t, allocs, bound, "allocations a call, both ends")
	stop()
}

// BenchmarkMsgOneSided times a msg connection's one-sided operations on 64
// bytes of the peer's region (8 for the atomic), one at a time, each
// waited for: the registered memory the bytes go through on this side is
// part of each call.
func BenchmarkMsgOneSided(b *testing.B) {
	ctx := context.Background()
	client, server, _ := msgPair(b, ctx)
	region, err := bufpool.NewRegion(server.PD(), 4096, bufpool.RemoteRead|bufpool.RemoteWrite|bufpool.RemoteAtomic)
	require.NoError(b, err)
	b.Cleanup(func() { region.Close() })
	remote, err := region.Remote().Slice(0, 64)
	require.NoError(b, err)
	word, err := region.Remote().Slice(0, 8)
	require.NoError(b, err)
	p := make([]byte, 64)
	ops := map[string]func() error{
		"WriteRemote64": func() error { return client.WriteRemote(ctx, remote, p) },
		"ReadRemote64":  func() error { return client.ReadRemote(ctx, remote, p) },
	}
	if !rxetest.IWARP() { // no atomics there
		ops["FetchAndAdd"] = func() error { _, err := client.FetchAndAdd(ctx, word, 1); return err }
	}
	for _, name := range slices.Sorted(maps.Keys(ops)) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := ops[name](); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
