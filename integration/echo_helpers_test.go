package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
)

// acceptEcho accepts one connection on l and echoes every message back
// until the peer leaves; then it closes the endpoint, puts back the buffers
// its completions return, and closes the pool: the order a user follows.
// Its receives are posted before the connection is accepted
// (receivesOnSetup), as a peer that sends at once needs. It takes the
// first request and returns its handshake's error rather than waiting for
// another dialer, as Listener.Accept would.
func acceptEcho(ctx context.Context, l *cm.Listener, size, depth int) error {
	var pool *bufpool.Pool
	req, err := l.AcceptRequest(ctx)
	if err != nil {
		return err
	}
	ep, err := req.Accept(ctx, receivesOnSetup(&pool, size, depth, depth))
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return err
	}
	defer func() {
		ep.CloseAndDrain(func(c endpoint.Completion) { pool.Put(c.Buffer) })
		pool.Close()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ep.Done():
			return nil
		case c := <-ep.Completions():
			if c.Err != nil {
				pool.Put(c.Buffer)
				if errors.Is(c.Err, endpoint.ErrClosed) {
					return nil // the peer left: its flushed receives end the loop
				}
				return c.Err
			}
			if c.Op == endpoint.OpRecv {
				err = ep.PostSend(nil, c.Buffer, c.Len)
			} else {
				err = ep.PostRecv(nil, c.Buffer)
			}
			if err != nil {
				pool.Put(c.Buffer) // a refused post leaves the buffer with the caller
				if errors.Is(err, endpoint.ErrClosed) {
					return nil // the peer left between the completion and the post
				}
				return err
			}
		}
	}
}

// echoClient dials addr and sends msgs numbered messages one at a time,
// checking each echo.
func echoClient(ctx context.Context, addr string, id, msgs int, opts ...cm.Option) error {
	ep, err := cm.Dial(ctx, addr, dialOptions(opts)...)
	if err != nil {
		return err
	}
	defer func() {
		ep.CloseAndDrain(nil)
	}()
	pool, err := bufpool.New(ep.PD(), bufpool.Size(64), bufpool.Count(2))
	if err != nil {
		return err
	}
	defer pool.Close()
	sb, _ := pool.TryGet()
	rb, _ := pool.TryGet()
	defer pool.Put(sb)
	defer pool.Put(rb)
	for i := range msgs {
		binary.LittleEndian.PutUint64(sb.Bytes(), uint64(id<<32|i))
		if err := ep.PostRecv("recv", rb); err != nil {
			return err
		}
		if err := ep.PostSend("send", sb, 8); err != nil {
			return err
		}
		for range 2 {
			select {
			case c := <-ep.Completions():
				if c.Err != nil {
					return fmt.Errorf("client %d message %d: %w", id, i, c.Err)
				}
				if c.Op == endpoint.OpRecv {
					if got := binary.LittleEndian.Uint64(rb.Bytes()); got != uint64(id<<32|i) || c.Len != 8 {
						return fmt.Errorf("client %d message %d: echo %#x (%d bytes)", id, i, got, c.Len)
					}
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}
