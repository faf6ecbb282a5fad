package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/msg"
)

// The rendezvous test measures msg's large messages: the client sends
// -iters messages of -size bytes one after another (each Send returns once
// the server has read it with RDMA READ); the server receives and releases
// them. It reports MiB/s of messages over the time, comparable with
// ib_read_bw, which moves the same bytes with the same operation. With
// -lend the client sends from a region it registered (SendRegion), so no
// message is copied into a rendezvous region first.

func serveRendezvous(ctx context.Context, cfg config) error {
	l, err := msg.Listen(ctx, cfg.addr, msg.WithCMOptions(cfg.polling()))
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("ready")
	c, err := l.Accept(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		m, err := c.RecvMessage(ctx)
		if err != nil {
			return nil // the client closed
		}
		m.Release()
	}
}

func rendezvousClient(ctx context.Context, cfg config) (result, error) {
	c, err := msg.Dial(ctx, cfg.addr, msg.WithCMOptions(cfg.polling()))
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	payload := make([]byte, cfg.size)
	send := func() error { return c.Send(ctx, payload) }
	if cfg.lend {
		region, err := bufpool.NewRegion(c.PD(), cfg.size, bufpool.RemoteRead)
		if err != nil {
			return result{}, err
		}
		defer region.Close()
		payload = region.Bytes()
		send = func() error { return c.SendRegion(ctx, region, cfg.size) }
	}
	for i := range payload {
		payload[i] = byte(i)
	}
	if err := send(); err != nil { // the regions are mapped and registered once, before the clock
		return result{}, err
	}
	start := time.Now()
	for range cfg.iters {
		if err := send(); err != nil {
			return result{}, err
		}
	}
	dt := since(start)
	return result{Test: cfg.test, Size: cfg.size, Iters: cfg.iters, BW: float64(cfg.iters*cfg.size) / dt / (1 << 20)}, nil
}
