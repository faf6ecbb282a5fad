package integration

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

// TestInteropLibrdmacmClient: librdmacm's own rdma_client (rdmacm-utils)
// against this library's echo server.
func TestInteropLibrdmacmClient(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	addr := rxetest.Addr(t)
	l, err := cm.Listen(ctx, net.JoinHostPort(addr, "0"))
	require.NoError(t, err)
	defer l.Close()
	served := make(chan error, 1)
	go func() { served <- acceptEcho(ctx, l, 64, 4) }()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	out, err := exec.CommandContext(ctx, "rdma_client", "-s", addr, "-p", port).CombinedOutput()
	t.Logf("rdma_client: %s", strings.TrimSpace(string(out)))
	require.NoError(t, err)
	require.Contains(t, string(out), "rdma_client: end 0")
	require.NoError(t, <-served)
}

// TestInteropLibrdmacmServer: this library's client against librdmacm's
// own rdma_server, which answers one 16-byte message with its own 16 bytes.
func TestInteropLibrdmacmServer(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	addr := rxetest.Addr(t)
	port := fmt.Sprint(20000 + os.Getpid()%10000)
	srv := exec.CommandContext(ctx, "rdma_server", "-p", port)
	var srvOut strings.Builder
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	require.NoError(t, srv.Start())
	defer func() {
		srv.Process.Kill()
		srv.Wait()
	}()

	// rdma_server listens a moment after it starts: retry refused dials.
	var ep *endpoint.Endpoint
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ep, err = cm.Dial(ctx, net.JoinHostPort(addr, port))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
	}
	require.NoError(t, err)
	defer closeAndDrain(t, ep)
	pool, err := bufpool.New(ep.PD(), bufpool.Size(16), bufpool.Count(2))
	require.NoError(t, err)
	defer pool.Close()
	rb, _ := pool.TryGet()
	sb, _ := pool.TryGet()
	require.NoError(t, ep.PostRecv("recv", rb))
	copy(sb.Bytes(), "0123456789abcdef")
	require.NoError(t, ep.PostSend("send", sb, 16))
	got := map[any]endpoint.Completion{}
	for range 2 {
		c := next(t, ep)
		require.NoError(t, c.Err)
		got[c.Context] = c
	}
	require.Equal(t, 16, got["recv"].Len, "rdma_server answers with 16 bytes")
	select {
	case <-ep.Done(): // rdma_server disconnects after its answer
	case <-time.After(10 * time.Second):
		t.Fatal("rdma_server did not disconnect")
	}
	require.NoError(t, srv.Wait())
	t.Logf("rdma_server: %s", strings.TrimSpace(srvOut.String()))
	require.Contains(t, srvOut.String(), "rdma_server: end 0")
	require.NoError(t, pool.Put(rb))
	require.NoError(t, pool.Put(sb))
}
