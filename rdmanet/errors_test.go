package rdmanet

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/msg"
)

// TestPeerEndedErrorKeepsNetsMeaning: the error of a connection the peer
// ended matches TCP's errno and its cause's errors (msg.ErrClosed among
// them: the connection is over), never net.ErrClosed, which only a local
// close gives, in its matching or its text.
func TestPeerEndedErrorKeepsNetsMeaning(t *testing.T) {
	crash := fmt.Errorf("msg: receive: %w", &endpoint.CompletionError{Op: endpoint.OpRecv, Status: endpoint.StatusFlushed})
	for _, tc := range []struct {
		cause error
		errno syscall.Errno
	}{
		{cm.ErrPeerDisconnected, syscall.ECONNRESET},
		{fmt.Errorf("%w for 1s: %w", msg.ErrPeerSilent, msg.ErrClosed), syscall.ECONNRESET}, // as the keepalive ends a connection
		{crash, syscall.ECONNRESET},
		{msg.ErrPeerClosed, syscall.EPIPE},
	} {
		err := error(&net.OpError{Op: "read", Net: "rdma", Err: newPeerEndedError(tc.cause)})
		require.ErrorIs(t, err, tc.errno, "%v", tc.cause)
		require.ErrorIs(t, err, tc.cause)
		require.NotErrorIs(t, err, net.ErrClosed, "%v", tc.cause)
		require.ErrorIs(t, err, msg.ErrClosed, "%v", tc.cause)
		require.Contains(t, err.Error(), tc.errno.Error())
		require.NotContains(t, err.Error(), net.ErrClosed.Error(), "the text says no local close either")
		require.False(t, err.(net.Error).Timeout())
	}
	var ce *endpoint.CompletionError
	require.ErrorAs(t, newPeerEndedError(crash), &ce)
	require.Equal(t, endpoint.StatusFlushed, ce.Status)
}

// A nil Option is ignored, as an option left unset: before, applying one
// panicked with a nil dereference.
func TestNilOptionIsIgnored(t *testing.T) {
	if got, want := len(msgOptions([]Option{nil})), len(msgOptions(nil)); got != want {
		t.Errorf("%d msg options with a nil Option, %d without", got, want)
	}
}

// TestDialerRefusesOtherNetworks: a Dialer takes TCP's network names and
// "rdma", and refuses any other before it dials, as net.Dialer refuses a
// network it does not know.
func TestDialerRefusesOtherNetworks(t *testing.T) {
	var d Dialer
	for _, network := range []string{"udp", "unix", "rdma-ud", ""} {
		_, err := d.DialContext(t.Context(), network, "10.0.0.1:7471")
		var unknown net.UnknownNetworkError
		require.ErrorAs(t, err, &unknown, "network %q", network)
		var op *net.OpError
		require.ErrorAs(t, err, &op)
		require.Equal(t, "dial", op.Op)
	}
}

// TestDialerKeepsToTheNetworksFamily: "tcp4" and "tcp6" dial only
// addresses of their family; an address of the other is refused with a
// *net.AddrError before anything is dialed, as net's Dial refuses it.
func TestDialerKeepsToTheNetworksFamily(t *testing.T) {
	var d Dialer
	for _, c := range []struct{ network, addr string }{
		{"tcp4", "[fd77::1]:7471"}, {"tcp6", "10.0.0.1:7471"}, {"tcp6", "[::ffff:10.0.0.1]:7471"},
	} {
		_, err := d.DialContext(t.Context(), c.network, c.addr)
		var addrErr *net.AddrError
		require.ErrorAs(t, err, &addrErr, "%s %s", c.network, c.addr)
		require.ErrorContains(t, err, "no suitable address found")
		var op *net.OpError
		require.ErrorAs(t, err, &op)
		require.Equal(t, "dial", op.Op)
	}
}

// TestConnAndListenerNotMadeFailWithEINVAL: as with net's conns, every
// method of a nil or zero Conn or Listener fails with syscall.EINVAL (or
// gives nil addresses) instead of panicking.
func TestConnAndListenerNotMadeFailWithEINVAL(t *testing.T) {
	for name, c := range map[string]*Conn{"nil": nil, "zero": {}} {
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, syscall.EINVAL, name)
		_, err = c.Write([]byte("x"))
		require.ErrorIs(t, err, syscall.EINVAL, name)
		_, err = c.ReadFrom(nil)
		require.ErrorIs(t, err, syscall.EINVAL, name)
		_, err = c.WriteTo(nil)
		require.ErrorIs(t, err, syscall.EINVAL, name)
		require.ErrorIs(t, c.SetDeadline(time.Time{}), syscall.EINVAL, name)
		require.ErrorIs(t, c.SetReadDeadline(time.Time{}), syscall.EINVAL, name)
		require.ErrorIs(t, c.SetWriteDeadline(time.Time{}), syscall.EINVAL, name)
		require.ErrorIs(t, c.CloseWrite(), syscall.EINVAL, name)
		require.ErrorIs(t, c.SetLinger(0), syscall.EINVAL, name)
		require.ErrorIs(t, c.Close(), syscall.EINVAL, name)
		require.ErrorIs(t, c.Close(), syscall.EINVAL, name)
		require.Nil(t, c.LocalAddr(), name)
		require.Nil(t, c.RemoteAddr(), name)
		require.Zero(t, c.Stats(), name)
	}
	for name, l := range map[string]*Listener{"nil": nil, "zero": {}} {
		_, err := l.Accept()
		require.ErrorIs(t, err, syscall.EINVAL, name)
		require.ErrorIs(t, l.SetDeadline(time.Now()), syscall.EINVAL, name)
		require.ErrorIs(t, l.Close(), syscall.EINVAL, name)
		require.Nil(t, l.Addr(), name)
	}
}

// A nil Dialer dials as the zero one does, instead of panicking.
func TestNilDialerDialsWithNoOptions(t *testing.T) {
	_, err := (*Dialer)(nil).DialContext(context.Background(), "tcp", "127.0.0.1:1")
	var opErr *net.OpError
	require.ErrorAs(t, err, &opErr)
	_, err = (&Dialer{}).DialContext(context.Background(), "tcp", "127.0.0.1:1")
	require.ErrorAs(t, err, &opErr)
}
