package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/go-rdma/rdmacm/examples/grpc/echopb"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/toolrun"
	"github.com/go-rdma/rdmacm/rdmanet"
)

func TestMain(m *testing.M) {
	toolrun.MainIfAsked(main)
	goleak.VerifyTestMain(m)
}

// TestOutOfRangeFlagsAreUsageErrors: a size below 0, or a count or
// callers below 1, stops the example before it listens or dials, naming
// the flag. Such values made it panic.
func TestOutOfRangeFlagsAreUsageErrors(t *testing.T) {
	toolrun.RequireRefused(t, [][2]string{{"size", "-1"}, {"count", "0"}, {"count", "-1"}, {"callers", "-1"}})
}

// TestGRPCOverRdmanet: grpc-go unchanged over rdmanet, on the device. 8
// goroutines make 400 unary calls on one client connection, then 400
// messages go through one bidirectional stream, all checked byte for byte;
// unary calls of 1 B to 1 MiB come back whole; a call past its deadline
// fails with DeadlineExceeded; the server stops gracefully and nothing is
// left behind (goroutines, verbs resources).
func TestGRPCOverRdmanet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	s := newServer()
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	cc, err := rdmanetClientConn(l.Addr().String())
	require.NoError(t, err)
	c := echopb.NewClient(cc)

	r, err := load{size: 64, count: 400, callers: 8}.run(ctx, c)
	require.NoError(t, err)
	t.Logf("%v", r)
	for _, size := range []int{1, 4 << 10, 1 << 20} {
		want := payload(size, size)
		got, err := c.Echo(ctx, wrapperspb.Bytes(want))
		require.NoError(t, err, "%d bytes", size)
		require.True(t, bytes.Equal(want, got.GetValue()), "%d bytes", size)
	}
	past, cancelPast := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancelPast()
	_, err = c.Echo(past, wrapperspb.Bytes([]byte("late")))
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	require.NoError(t, cc.Close())
	s.GracefulStop()
	require.NoError(t, <-served)
}

// TestGRPCRedialsARestartedServer: a gRPC client connection over rdmanet
// outlives its server, as it does over TCP. The server stops (Stop, the
// connection closed under the client); while nothing listens, a call
// fails with Unavailable, its redials over rdmanet refused; once a new
// server listens on the same port, the same client connection's next
// call, waiting for it to be ready, redials and succeeds. Nothing is left
// behind.
func TestGRPCRedialsARestartedServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	first, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	addr := first.Addr().String()
	serveOn := func(l net.Listener) (stop func()) {
		s := newServer()
		served := make(chan error, 1)
		go func() { served <- s.Serve(l) }()
		return func() {
			s.Stop()
			require.NoError(t, <-served)
		}
	}
	stop := serveOn(first)
	cc, err := rdmanetClientConn(addr)
	require.NoError(t, err)
	defer cc.Close()
	c := echopb.NewClient(cc)
	echo := func(ctx context.Context, what string, opts ...grpc.CallOption) error {
		got, err := c.Echo(ctx, wrapperspb.Bytes([]byte(what)), opts...)
		if err == nil && string(got.GetValue()) != what {
			err = fmt.Errorf("echoed %q, want %q", got.GetValue(), what)
		}
		return err
	}
	require.NoError(t, echo(ctx, "before the restart"))

	stop()
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShort()
	err = echo(short, "while nobody listens")
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	second, err := rdmanet.Listen(ctx, addr)
	require.NoError(t, err, "a new server on the same port")
	defer serveOn(second)()
	require.NoError(t, echo(ctx, "after the restart", grpc.WaitForReady(true)))
}

// TestBenchComparesBothTransports: -mode bench's code runs the same load
// over rdmanet and then over TCP, and -json reports each as one JSON
// object per line with the load and figures that can be true (rdmaperf
// -compare reads them; make bench runs it at size).
func TestBenchComparesBothTransports(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	l := load{size: 64, count: 50, callers: 2}
	var out bytes.Buffer
	require.NoError(t, bench(ctx, &out, net.JoinHostPort(rxetest.Addr(t), "0"), l, true))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 2, out.String())
	for i, transport := range []string{"rdmanet", "tcp"} {
		var r benchReport
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &r), lines[i])
		require.Equal(t, transport, r.Transport)
		require.Equal(t, []int{l.size, l.callers, l.count}, []int{r.Size, r.Callers, r.Calls})
		require.Positive(t, r.CallsPerSec, lines[i])
		require.Positive(t, r.StreamRate, lines[i])
		require.Positive(t, r.P50, lines[i])
		require.LessOrEqual(t, r.P50, r.P99, lines[i])
	}
}
