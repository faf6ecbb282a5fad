package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/toolrun"
	"github.com/go-rdma/rdmacm/msg"
)

func TestMain(m *testing.M) {
	toolrun.MainIfAsked(main)
	goleak.VerifyTestMain(m)
}

// TestOutOfRangeFlagsAreUsageErrors: a count or size below 1 stops rpc
// before it listens or dials, naming the flag. Such values made it panic.
func TestOutOfRangeFlagsAreUsageErrors(t *testing.T) {
	toolrun.RequireRefused(t, [][2]string{{"callers", "0"}, {"callers", "-1"}, {"calls", "0"}, {"blob", "0"}, {"max-request", "0"}})
}

// TestMetricsCountTheCalls: the example's server counts the calls a client
// makes and serves the counts in the Prometheus text format; everything
// stops with the server's context.
func TestMetricsCountTheCalls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	rpcAddr := net.JoinHostPort(rxetest.Addr(t), "0")
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	metricsAddr := free.Addr().String()
	require.NoError(t, free.Close())

	addr, stop := startServer(t, ctx, rpcAddr, metricsAddr, 64<<20)
	cl, err := msg.DialClient(ctx, addr)
	require.NoError(t, err)
	for range 20 {
		_, err := cl.Call(ctx, "echo", []byte("x"))
		require.NoError(t, err)
	}
	_, err = cl.Call(ctx, "kv.get", []byte("nothing here"))
	require.ErrorIs(t, err, msg.CodeNotFound)
	// Two blobs larger than a buffer go by rendezvous: the server reads
	// each into a region of its cache, mapped for the first and kept for
	// the second.
	blob := make([]byte, 500_000)
	for range 2 {
		_, err := cl.Call(ctx, "blob.put", blob)
		require.NoError(t, err)
	}

	// The server counts a call once its answer has gone to the
	// connection, which can be just after the caller has it.
	var text string
	require.Eventually(t, func() bool {
		text = scrape("http://" + metricsAddr + "/metrics")
		return strings.Contains(text, "\nrdmacm_rpc_calls_in_flight 0\n")
	}, 10*time.Second, 10*time.Millisecond, "every handler ends")
	require.Contains(t, text, "\nrdmacm_rpc_calls_total 23\n")
	require.Contains(t, text, "\nrdmacm_rpc_call_errors_total 1\n")
	require.GreaterOrEqual(t, metric(t, text, "rdmacm_rpc_conn_rendezvous_bytes_received"), float64(2*len(blob)),
		"each request, method name and blob, read by rendezvous")
	require.Contains(t, text, "\nrdmacm_rpc_conn_region_cache_misses 1\n")
	require.Contains(t, text, "\nrdmacm_rpc_conn_region_cache_hits 1\n")
	require.Contains(t, text, "\nrdmacm_rpc_connections 1\n")
	require.Contains(t, text, "# TYPE rdmacm_rpc_conn_send_doorbells gauge")
	require.Contains(t, text, "# TYPE rdmacm_rpc_conn_credit_asks_received gauge")
	require.Contains(t, text, "# TYPE rdmacm_rpc_conn_cq_events gauge")
	require.Contains(t, text, "# TYPE rdmacm_rpc_conn_keepalive_rtt_max_seconds gauge")

	require.NoError(t, cl.Close())
	stop()
	_, err = http.Get("http://" + metricsAddr + "/metrics")
	require.Error(t, err, "the metrics server stops with the service")
}

// TestServerBoundsRequests: with -max-request 1 MiB, a blob.put of a
// request larger than that (method name and blob) fails the call at once
// with msg.ErrTooLarge, and one of exactly that size is served.
func TestServerBoundsRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	const most = 1 << 20
	addr, stop := startServer(t, ctx, net.JoinHostPort(rxetest.Addr(t), "0"), "", most)
	cl, err := msg.DialClient(ctx, addr)
	require.NoError(t, err)
	head := 1 + len("blob.put") // a request is its method's length, its method, then its bytes
	_, err = cl.Call(ctx, "blob.put", make([]byte, most-head+1))
	require.ErrorIs(t, err, msg.ErrTooLarge)
	blob := make([]byte, most-head)
	got, err := cl.Call(ctx, "blob.put", blob)
	require.NoError(t, err)
	want := sha256.Sum256(blob)
	require.Equal(t, want[:], got)

	require.NoError(t, cl.Close())
	stop()
}

// startServer runs serve on rpcAddr until stop, which waits for it to
// return and fails the test on any error but the shutdown's; it returns
// the address the server listens on.
func startServer(t *testing.T, ctx context.Context, rpcAddr, metricsAddr string, maxRequest int) (addr string, stop func()) {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- serve(sctx, rpcAddr, metricsAddr, maxRequest, ready) }()
	select {
	case addr = <-ready:
	case err := <-served:
		cancel()
		t.Fatal(err)
	}
	return addr, func() {
		cancel()
		if err := <-served; err != nil && !errors.Is(err, msg.ErrShutdown) {
			t.Fatal(err)
		}
	}
}

// scrape GETs url and returns the body of its 200 answer ("" on any
// failure: it runs inside require.Eventually, away from the test goroutine).
func scrape(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(body)
}

// metric is the value of the sample named name in text, the Prometheus
// text format.
func metric(t *testing.T, text, name string) float64 {
	t.Helper()
	_, rest, ok := strings.Cut(text, "\n"+name+" ")
	require.Truef(t, ok, "no sample %s in:\n%s", name, text)
	line, _, _ := strings.Cut(rest, "\n")
	v, err := strconv.ParseFloat(line, 64)
	require.NoError(t, err)
	return v
}
