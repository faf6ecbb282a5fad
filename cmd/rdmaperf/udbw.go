package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-rdma/rdmacm/dgram"
)

// The ud_bw test measures package dgram's send rate: the client writes
// -iters datagrams of -size bytes to the server in batches of -batch (one
// doorbell each), and reports the rate at which the device took them, as
// ib_send_bw -c UD reports its sender's. The server reads what arrives;
// UD may drop what a receiver has no buffer for, so it reports on stderr
// how many it got, and the rate is the sender's either way.

func serveUD(ctx context.Context, cfg config) error {
	c, err := dgram.Listen(ctx, cfg.addr, dgram.WithRecvDepth(cfg.depth*4))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("ready")
	ms := make([]dgram.Message, 64)
	for i := range ms {
		ms[i].Buf = make([]byte, c.MTU())
	}
	got := 0
	for {
		// The client's datagrams stop coming: it has finished.
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.ReadBatch(ms)
		got += n
		if errors.Is(err, os.ErrDeadlineExceeded) && got > 0 {
			fmt.Fprintf(os.Stderr, "rdmaperf ud_bw server: %d datagrams received\n", got)
			return nil
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
	}
}

func udClient(ctx context.Context, cfg config) (result, error) {
	c, err := dgram.Dial(ctx, cfg.addr, dgram.WithSendDepth(cfg.depth))
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	batch := make([]dgram.Message, max(1, min(cfg.batch, cfg.depth/2)))
	for i := range batch {
		batch[i] = dgram.Message{Buf: make([]byte, cfg.size), Addr: c.RemoteAddr()}
	}
	start := time.Now()
	for sent := 0; sent < cfg.iters; {
		n, err := c.WriteBatch(batch[:min(len(batch), cfg.iters-sent)])
		if err != nil {
			return result{}, err
		}
		sent += n
	}
	dt := since(start)
	rate := float64(cfg.iters) / dt
	return result{Test: cfg.test, Size: cfg.size, Iters: cfg.iters, BW: rate * float64(cfg.size) / (1 << 20), MsgRate: rate / 1e6}, nil
}
