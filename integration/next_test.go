package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

var pollModes = []struct {
	name string
	opt  cm.Option
}{
	{"event", cm.WithPolling(endpoint.PollEvent, 0)},
	{"busy", cm.WithPolling(endpoint.PollBusy, 0)},
	{"hybrid", cm.WithPolling(endpoint.PollHybrid, 20*time.Microsecond)},
}

// TestNextDeliversEveryCompletionOnce sends numbered messages and takes the
// completions with Next on both sides, every fifth one on the server from
// the Completions channel instead: Next and the channel share one stream,
// so each context must come back exactly once and in order.
func TestNextDeliversEveryCompletionOnce(t *testing.T) {
	for _, mode := range pollModes {
		t.Run(mode.name, func(t *testing.T) {
			ctx := testContext(t)
			rxetest.CheckResources(t)
			p := connect(t, ctx, mode.opt)
			const msgs, depth = 300, 16
			sendPool := newPool(t, p.client, 64, 1)
			recvPool := newPool(t, p.server, 64, depth)
			for range depth {
				b, _ := recvPool.TryGet()
				require.NoError(t, p.server.PostRecv(nil, b))
			}
			sb, _ := sendPool.TryGet()
			defer sendPool.Put(sb)
			for i := range msgs {
				binary.LittleEndian.PutUint64(sb.Bytes(), uint64(i))
				require.NoError(t, p.client.PostSend(i, sb, 8))

				var rc endpoint.Completion
				if i%5 == 4 {
					rc = next(t, p.server)
				} else {
					var err error
					rc, err = p.server.Next(ctx)
					require.NoError(t, err)
				}
				require.NoError(t, rc.Err)
				require.Equal(t, endpoint.OpRecv, rc.Op)
				require.Equal(t, uint64(i), binary.LittleEndian.Uint64(rc.Buffer.Bytes()), "message %d", i)
				require.NoError(t, p.server.PostRecv(nil, rc.Buffer))

				sc, err := p.client.Next(ctx)
				require.NoError(t, err)
				require.NoError(t, sc.Err)
				require.Equal(t, i, sc.Context, "send completions in posting order")
			}
			require.NoError(t, p.server.Close())
			flushed := 0
			for {
				c, err := p.server.Next(ctx)
				if err != nil {
					require.ErrorIs(t, err, endpoint.ErrClosed)
					break
				}
				require.ErrorIs(t, c.Err, endpoint.ErrClosed)
				recvPool.Put(c.Buffer)
				flushed++
			}
			require.Equal(t, depth, flushed, "every posted receive comes back once after Close")
			_, err := p.server.Next(ctx)
			require.ErrorIs(t, err, endpoint.ErrClosed, "Next after the end")
		})
	}
}

// TestNextHonoursContext: with nothing posted Next returns the context's
// error, in each mode, and a completion that arrives later is not lost.
func TestNextHonoursContext(t *testing.T) {
	for _, mode := range pollModes {
		t.Run(mode.name, func(t *testing.T) {
			ctx := testContext(t)
			rxetest.CheckResources(t)
			p := connect(t, ctx, mode.opt)
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := p.client.Next(short)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Less(t, time.Since(start), 5*time.Second, "Next overstayed its deadline")

			region, remote := exchangeRegion(t, ctx, p, 64, bufpool.RemoteWrite)
			_ = region
			pool := newPool(t, p.client, 64, 1)
			b, _ := pool.TryGet()
			defer pool.Put(b)
			require.NoError(t, p.client.PostWrite("w", b, 64, remote))
			c, err := p.client.Next(ctx)
			require.NoError(t, err)
			require.NoError(t, c.Err)
			require.Equal(t, "w", c.Context)
		})
	}
}

// TestCompletionsAfterNext: in busy mode the completion goroutine stands
// aside while Next is called; once nobody calls Next, a completion must
// still reach the Completions channel.
func TestCompletionsAfterNext(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, cm.WithPolling(endpoint.PollBusy, 0))
	region, remote := exchangeRegion(t, ctx, p, 64, bufpool.RemoteWrite)
	_ = region
	pool := newPool(t, p.client, 64, 1)
	b, _ := pool.TryGet()
	defer pool.Put(b)
	for i := range 50 { // callers polling: the completion goroutine steps aside
		require.NoError(t, p.client.PostWrite(i, b, 64, remote))
		c, err := p.client.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, i, c.Context)
	}
	for i := range 20 {
		require.NoError(t, p.client.PostWrite(i, b, 64, remote))
		select {
		case c := <-p.client.Completions():
			require.NoError(t, c.Err)
			require.Equal(t, i, c.Context)
		case <-time.After(5 * time.Second):
			t.Fatal("a completion nobody waited for in Next never reached Completions")
		}
	}
}

// TestNextEndsWithThePeer: when the peer leaves, a caller spinning in Next
// gets the flushed receive with an error, not an endless spin.
func TestNextEndsWithThePeer(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, cm.WithPolling(endpoint.PollBusy, 0))
	pool := newPool(t, p.server, 64, 1)
	b, _ := pool.TryGet()
	require.NoError(t, p.server.PostRecv("r", b))
	got := make(chan endpoint.Completion, 1)
	go func() {
		c, err := p.server.Next(ctx)
		if err != nil {
			c.Err = err
		}
		got <- c
	}()
	time.Sleep(50 * time.Millisecond) // let it spin
	require.NoError(t, p.client.Close())
	select {
	case c := <-got:
		require.Error(t, c.Err)
		require.False(t, errors.Is(c.Err, context.DeadlineExceeded), "Next waited for its deadline: %v", c.Err)
		if c.Buffer != nil {
			pool.Put(c.Buffer)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Next kept spinning after the peer left")
	}
}

// TestNextWaitersShareTheChannel: callers of Next wait on the completion
// channel themselves, one at a time, the others for it to hand on
// completions or its place. A cancelled caller leaves, whether it held
// the place or not; four concurrent callers get one completion each, and
// Close ends a caller's wait.
func TestNextWaitersShareTheChannel(t *testing.T) {
	for _, mode := range pollModes {
		if mode.name == "busy" {
			continue // busy callers spin; they never wait on the channel
		}
		t.Run(mode.name, func(t *testing.T) {
			ctx := testContext(t)
			rxetest.CheckResources(t)
			p := connect(t, ctx, mode.opt)

			cancelled := make(chan error, 2)
			for range 2 {
				short, cancel := context.WithCancel(ctx)
				time.AfterFunc(50*time.Millisecond, cancel)
				go func() {
					_, err := p.client.Next(short)
					cancelled <- err
				}()
			}
			for range 2 {
				select {
				case err := <-cancelled:
					require.ErrorIs(t, err, context.Canceled)
				case <-time.After(10 * time.Second):
					t.Fatal("a cancelled Next did not return")
				}
			}

			_, remote := exchangeRegion(t, ctx, p, 64, bufpool.RemoteWrite)
			pool := newPool(t, p.client, 64, 1)
			b, _ := pool.TryGet()
			defer pool.Put(b)
			const callers = 4
			got := make(chan any, callers)
			for range callers {
				go func() {
					c, err := p.client.Next(ctx)
					if err == nil {
						err = c.Err
					}
					if err != nil {
						got <- err
						return
					}
					got <- c.Context
				}()
			}
			for i := range callers {
				require.NoError(t, p.client.PostWrite(i, b, 64, remote))
			}
			var contexts []any
			for range callers {
				contexts = append(contexts, <-got)
			}
			require.ElementsMatch(t, []any{0, 1, 2, 3}, contexts, "each write's completion to one caller")

			ended := make(chan error, 1)
			go func() {
				_, err := p.client.Next(ctx)
				ended <- err
			}()
			time.Sleep(50 * time.Millisecond) // let it wait
			require.NoError(t, p.client.Close())
			select {
			case err := <-ended:
				require.ErrorIs(t, err, endpoint.ErrClosed)
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not end a waiting Next")
			}
		})
	}
}
