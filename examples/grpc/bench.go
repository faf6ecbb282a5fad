package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/go-rdma/rdmacm/examples/grpc/echopb"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// benchReport is one transport's figures as -json prints them, one object
// per line (rdmaperf -compare reads them).
type benchReport struct {
	Transport   string  `json:"transport"` // rdmanet or tcp
	Size        int     `json:"size"`
	Callers     int     `json:"callers"`
	Calls       int     `json:"calls"`
	CallsPerSec float64 `json:"calls_per_s"`
	P50         float64 `json:"p50_us"` // of one unary call
	P99         float64 `json:"p99_us"`
	StreamRate  float64 `json:"stream_msgs_per_s"`
}

// bench runs the same load over rdmanet and over TCP on the same host, in
// turn, and writes one line for each to w (a benchReport's JSON with
// asJSON): the same gRPC code, only the transport differs. The first calls
// of each warm the connection up.
func bench(ctx context.Context, w io.Writer, addr string, load load, asJSON bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	transports := []struct {
		name   string
		listen func() (net.Listener, error)
		dial   grpc.DialOption
	}{
		{"rdmanet",
			func() (net.Listener, error) { return rdmanet.Listen(ctx, net.JoinHostPort(host, "0")) },
			grpc.WithContextDialer(dialRdmanet)},
		{"tcp",
			func() (net.Listener, error) { return net.Listen("tcp", net.JoinHostPort(host, "0")) },
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			})},
	}
	for _, tr := range transports {
		r, err := benchOne(ctx, tr.listen, tr.dial, load)
		if err != nil {
			return fmt.Errorf("%s: %w", tr.name, err)
		}
		if !asJSON {
			fmt.Fprintf(w, "grpc over %s, %d B, %d callers: %v\n", tr.name, load.size, load.callers, r)
			continue
		}
		line, err := json.Marshal(benchReport{Transport: tr.name, Size: load.size, Callers: load.callers,
			Calls: r.calls, CallsPerSec: r.callsPerSecond(), P50: micros(r.p50), P99: micros(r.p99),
			StreamRate: r.streamedPerSecond()})
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n", line)
	}
	return nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func benchOne(ctx context.Context, listen func() (net.Listener, error), dial grpc.DialOption, l load) (result, error) {
	ln, err := listen()
	if err != nil {
		return result{}, err
	}
	s := newServer()
	go s.Serve(ln)
	defer s.Stop()
	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), dial)
	if err != nil {
		return result{}, err
	}
	defer cc.Close()
	c := echopb.NewClient(cc)
	warm := load{size: l.size, count: min(l.count, 100), callers: l.callers}
	if _, err := warm.run(ctx, c); err != nil {
		return result{}, err
	}
	return l.run(ctx, c)
}
