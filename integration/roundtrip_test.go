package integration

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

// TestSendRecvRoundTrip is librdmacm's rdma_server/rdma_client exchange
// through this library: the client sends a message, the server receives it
// and sends it back, the client checks every byte.
func TestSendRecvRoundTrip(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	t.Logf("connected on %s: %v -> %v", rxetest.Device(), p.listener.Addr(), p.client.PD() != nil)

	cpool := newPool(t, p.client, 4096, 4)
	spool := newPool(t, p.server, 4096, 4)

	srecv, err := spool.Get(ctx)
	require.NoError(t, err)
	require.NoError(t, p.server.PostRecv("server-recv", srecv))
	crecv, err := cpool.Get(ctx)
	require.NoError(t, err)
	require.NoError(t, p.client.PostRecv("client-recv", crecv))

	msg := []byte("hello over rxe: the quick brown fox jumps over the lazy dog")
	csend, err := cpool.Get(ctx)
	require.NoError(t, err)
	copy(csend.Bytes(), msg)
	require.NoError(t, p.client.PostSend("client-send", csend, len(msg)))

	c := next(t, p.server)
	require.NoError(t, c.Err)
	require.Equal(t, "server-recv", c.Context)
	require.Equal(t, endpoint.OpRecv, c.Op)
	require.Equal(t, len(msg), c.Len)
	require.True(t, bytes.Equal(msg, c.Buffer.Bytes()[:c.Len]), "server received %q", c.Buffer.Bytes()[:c.Len])

	require.NoError(t, p.server.PostSend("server-echo", c.Buffer, c.Len))
	c = next(t, p.server)
	require.NoError(t, c.Err)
	require.Equal(t, "server-echo", c.Context)
	require.NoError(t, spool.Put(c.Buffer))

	got := map[any]endpoint.Completion{}
	for range 2 {
		c := next(t, p.client)
		require.NoError(t, c.Err)
		got[c.Context] = c
	}
	require.Contains(t, got, "client-send")
	echo := got["client-recv"]
	require.Equal(t, msg, echo.Buffer.Bytes()[:echo.Len])
	require.NoError(t, cpool.Put(crecv))
	require.NoError(t, cpool.Put(csend))
	t.Logf("round trip of %d bytes on %s verified byte for byte", len(msg), rxetest.Device())
}
