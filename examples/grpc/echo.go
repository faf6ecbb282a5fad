package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/go-rdma/rdmacm/examples/grpc/echopb"
)

// echoServer implements the Echo service.
type echoServer struct{}

func (echoServer) Echo(_ context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	return in, nil
}

func (echoServer) Stream(s grpc.BidiStreamingServer[wrapperspb.BytesValue, wrapperspb.BytesValue]) error {
	for {
		m, err := s.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.Send(m); err != nil {
			return err
		}
	}
}

// load is what a client does: count unary calls of size bytes from
// callers goroutines, then count messages through one stream.
type load struct{ size, count, callers int }

// result is what a load measured.
type result struct {
	calls     int
	unary     time.Duration // all the unary calls, wall time
	p50, p99  time.Duration // of one unary call
	streamed  int
	streaming time.Duration
}

func (r result) callsPerSecond() float64 { return float64(r.calls) / r.unary.Seconds() }

func (r result) streamedPerSecond() float64 { return float64(r.streamed) / r.streaming.Seconds() }

func (r result) String() string {
	return fmt.Sprintf("%d unary calls: %.0f calls/s, p50 %v, p99 %v; %d stream messages: %.0f/s",
		r.calls, r.callsPerSecond(), r.p50, r.p99, r.streamed, r.streamedPerSecond())
}

// payload is the n-th message: its number in its first bytes, so that a
// reply for another call shows.
func payload(size, n int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(n + i)
	}
	return b
}

// run makes load's calls on c, checking every reply byte for byte.
func (l load) run(ctx context.Context, c *echopb.Client) (result, error) {
	r := result{calls: l.count, streamed: l.count}
	latencies := make([]time.Duration, l.count)
	errs := make([]error, l.callers)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range l.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < l.count; i += l.callers {
				want := payload(l.size, i)
				t0 := time.Now()
				got, err := c.Echo(ctx, wrapperspb.Bytes(want))
				latencies[i] = time.Since(t0)
				if err != nil {
					errs[g] = fmt.Errorf("call %d: %w", i, err)
					return
				}
				if !bytes.Equal(got.GetValue(), want) {
					errs[g] = fmt.Errorf("call %d: %d bytes back, not the %d sent", i, len(got.GetValue()), len(want))
					return
				}
			}
		}()
	}
	wg.Wait()
	r.unary = time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return r, err
	}
	slices.Sort(latencies)
	r.p50, r.p99 = latencies[len(latencies)/2], latencies[len(latencies)*99/100]

	start = time.Now()
	if err := l.stream(ctx, c); err != nil {
		return r, err
	}
	r.streaming = time.Since(start)
	return r, nil
}

// stream sends count messages through one Stream call while reading the
// echoes, and checks them in order.
func (l load) stream(ctx context.Context, c *echopb.Client) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Stream(ctx)
	if err != nil {
		return err
	}
	sent := make(chan error, 1)
	go func() {
		for i := range l.count {
			if err := s.Send(wrapperspb.Bytes(payload(l.size, i))); err != nil {
				sent <- err
				return
			}
		}
		sent <- s.CloseSend()
	}()
	for i := range l.count {
		got, err := s.Recv()
		if err != nil {
			return fmt.Errorf("stream message %d: %w", i, err)
		}
		if !bytes.Equal(got.GetValue(), payload(l.size, i)) {
			return fmt.Errorf("stream message %d: not the one sent", i)
		}
	}
	if _, err := s.Recv(); err != io.EOF {
		return fmt.Errorf("after the last stream message: %v, want the end", err)
	}
	return <-sent
}
