package msg

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
)

// Connection options msg owns, or invalid ones, are refused before anything
// is created (no device needed), rather than silently overridden.
func TestCMOptionsMsgOwnsAreRefused(t *testing.T) {
	for name, opt := range map[string]cm.Option{
		"queue depth":   cm.WithQueueDepth(8),
		"send depth":    cm.WithSendDepth(8),
		"receive depth": cm.WithRecvDepth(8),
		"RNR retry":     cm.WithRNRRetry(7),
		"a bad value":   cm.WithCloseTimeout(-time.Second),
	} {
		_, err := Dial(context.Background(), "127.0.0.1:1", WithCMOptions(opt))
		require.ErrorContains(t, err, "WithCMOptions", name)
		_, err = Listen(context.Background(), "127.0.0.1:0", WithCMOptions(opt))
		require.ErrorContains(t, err, "WithCMOptions", name)
	}
	_, err := newOptions([]Option{WithCMOptions(cm.WithPolling(endpoint.PollHybrid, time.Millisecond), cm.WithAckTimeout(time.Second))})
	require.NoError(t, err, "options msg does not own pass")
}

// WithLogger's logger is its connections' too (package cm's lines: a
// port going down, a CM event), unless WithCMOptions gives them a logger
// of their own.
func TestConnectionsLogThroughWithLogger(t *testing.T) {
	var msgLog, cmLog bytes.Buffer
	for _, tc := range []struct {
		name string
		opts []Option
		want *bytes.Buffer
	}{
		{"msg's", []Option{WithLogger(zerolog.New(&msgLog))}, &msgLog},
		{"the connections' own", []Option{WithLogger(zerolog.New(&msgLog)), WithCMOptions(cm.WithLogger(zerolog.New(&cmLog)))}, &cmLog},
	} {
		o, err := newOptions(tc.opts)
		require.NoError(t, err)
		cfg, _, err := seam.ConnOptions(o.connOptions())
		require.NoError(t, err)
		msgLog.Reset()
		cmLog.Reset()
		cfg.Logger.Info().Msg("a connection's line")
		require.Contains(t, tc.want.String(), "a connection's line", tc.name)
		require.Equal(t, 1, strings.Count(msgLog.String()+cmLog.String(), "a connection's line"), tc.name)
	}
}

// Every option msg refuses matches endpoint.ErrInvalid, as cm's refusals
// do; sizes the hello cannot carry (32 bits) are refused, not truncated.
func TestOptionRefusalsMatchErrInvalid(t *testing.T) {
	for name, opt := range map[string]Option{
		"receive depth too small":       WithRecvDepth(1),
		"receive depth past u32":        WithRecvDepth(math.MaxUint32 + 1),
		"buffer too small":              WithBufferSize(1),
		"buffer past u32":               WithBufferSize(math.MaxUint32 + 1),
		"negative keepalive":            WithKeepalive(-time.Second, 0),
		"negative rendezvous cache":     WithRendezvousCache(-1),
		"negative largest message":      WithMaxRecvSize(-1),
		"largest message past a READ's": WithMaxRecvSize(maxRendezvous + 1),
		"a depth msg owns":              WithCMOptions(cm.WithQueueDepth(8)),
		"a bad cm option":               WithCMOptions(cm.WithMaxSGE(0)),
	} {
		_, err := newOptions([]Option{opt})
		require.ErrorIs(t, err, endpoint.ErrInvalid, name)
	}
}

// ConnectData refuses what WithRecvDepth and WithBufferSize refuse:
// values a msg peer would not hear, or that a hello's 32 bits would
// truncate. What it accepts, a peer parses back as given.
func TestConnectDataRefusesWhatAHelloCannotCarry(t *testing.T) {
	for _, v := range [][2]int{{1, 4096}, {math.MaxUint32 + 1, 4096}, {32, 1}, {32, math.MaxUint32 + 1}, {-1, -1}} {
		b, err := ConnectData(v[0], v[1])
		require.ErrorIs(t, err, endpoint.ErrInvalid, "depth %d, buffer size %d", v[0], v[1])
		require.Nil(t, b)
	}
	b, err := ConnectData(minRecvDepth, math.MaxUint32)
	require.NoError(t, err)
	h, err := parseHello(b)
	require.NoError(t, err)
	require.Equal(t, hello{recvDepth: minRecvDepth, bufSize: math.MaxUint32, maxMessage: maxRendezvous}, h)
}

// The hello carries the largest message a side receives: what
// WithMaxRecvSize set, or, from a peer whose hello does not say (its 16
// bytes, then the CM's zeros), the most one READ moves, to which a larger
// value is cut down too.
func TestHelloCarriesTheLargestMessage(t *testing.T) {
	o, err := newOptions([]Option{WithMaxRecvSize(1 << 20)})
	require.NoError(t, err)
	h, err := parseHello(o.hello().encode())
	require.NoError(t, err)
	require.Equal(t, 1<<20, h.maxMessage)

	unsaid := hello{recvDepth: 32, bufSize: 4096}.encode()
	for name, b := range map[string][]byte{
		"a hello of 16 bytes": unsaid[:helloMinSize],
		"padded with zeros":   append(unsaid, make([]byte, 36)...),
	} {
		h, err := parseHello(b)
		require.NoError(t, err, name)
		require.Equal(t, maxRendezvous, h.maxMessage, name)
	}
	h, err = parseHello(hello{recvDepth: 32, bufSize: 4096, maxMessage: math.MaxUint32}.encode())
	require.NoError(t, err)
	require.Equal(t, maxRendezvous, h.maxMessage, "no more than one READ moves")

	o, err = newOptions(nil)
	require.NoError(t, err)
	require.Equal(t, maxRendezvous, o.maxRecv, "the default")
	require.Equal(t, 10*time.Second, o.hello().silence, "the default keepalive timeout")
	o, err = newOptions([]Option{WithMaxRecvSize(0), WithBufferSize(8192)})
	require.NoError(t, err)
	require.Equal(t, 8192-HeaderSize, o.hello().maxMessage, "what fits a receive buffer always arrives")
}

func TestRendezvousCacheSize(t *testing.T) {
	o, err := newOptions(nil)
	require.NoError(t, err)
	require.Equal(t, 16<<20, o.rvCache, "the default")
	_, err = newOptions([]Option{WithRendezvousCache(0)})
	require.NoError(t, err, "0 keeps nothing")
	_, err = newOptions([]Option{WithRendezvousCache(-1)})
	require.ErrorContains(t, err, "rendezvous cache")
}

func TestRegionClasses(t *testing.T) {
	require.Equal(t, minRegionClass, regionClass(1))
	require.Equal(t, minRegionClass, regionClass(minRegionClass))
	require.Equal(t, 2*minRegionClass, regionClass(minRegionClass+1))
	require.Equal(t, 8<<20, regionClass(8<<20), "an 8 MiB message takes an 8 MiB region")
	require.Equal(t, 1<<31, regionClass(maxRendezvous))
}

// A nil Option is ignored, at every level, as an option left unset:
// before, applying one panicked with a nil dereference.
func TestNilOptionsAreIgnored(t *testing.T) {
	want, err := newOptions(nil)
	require.NoError(t, err)
	o, err := newOptions([]Option{nil, WithCMOptions(nil), WithCMOptions(cm.Option(nil))})
	require.NoError(t, err)
	require.Equal(t, want.recvDepth, o.recvDepth)
	require.Equal(t, want.keepalive, o.keepalive)
}

// A negative keepalive interval or timeout is refused: 0 turns one off,
// and a negative one had turned it off too, unsaid. A timeout below twice
// the interval is refused however large both are (2*interval overflowed).
func TestKeepaliveOutOfRangeIsRefused(t *testing.T) {
	for _, k := range [][2]time.Duration{{-1, 0}, {0, -1}, {-time.Second, 10 * time.Second}, {math.MaxInt64, math.MaxInt64}, {time.Second, time.Second}} {
		_, err := newOptions([]Option{WithKeepalive(k[0], k[1])})
		require.ErrorContains(t, err, "keepalive", "interval %v, timeout %v", k[0], k[1])
	}
	for _, k := range [][2]time.Duration{{0, 0}, {time.Second, 0}, {0, time.Second}, {time.Second, 2 * time.Second}, {time.Second, math.MaxInt64}} {
		_, err := newOptions([]Option{WithKeepalive(k[0], k[1])})
		require.NoError(t, err, "interval %v, timeout %v", k[0], k[1])
	}
}

// A nil or zero Conn, Listener or Client is one that ended before it
// began: its calls fail with ErrInvalid, a Conn's Done is closed, and the
// accessors give zero values. Nothing panics or waits for ever. A Server
// with no Handler refuses to Serve, and a nil Server and Mux refuse too.
func TestNotMadeIsRefused(t *testing.T) {
	ctx := context.Background()
	remote := bufpool.Remote{Len: 8}
	for name, c := range map[string]*Conn{"nil": nil, "zero": {}} {
		_, recvErr := c.Recv(ctx)
		_, msgErr := c.RecvMessage(ctx)
		_, casErr := c.CompareAndSwap(ctx, remote, 0, 1)
		_, faaErr := c.FetchAndAdd(ctx, remote, 1)
		for op, err := range map[string]error{
			"Send":           c.Send(ctx, []byte("x")),
			"SendRegion":     c.SendRegion(ctx, &bufpool.Region{}, 1),
			"Recv":           recvErr,
			"RecvMessage":    msgErr,
			"WriteRemote":    c.WriteRemote(ctx, remote, []byte("x")),
			"ReadRemote":     c.ReadRemote(ctx, remote, make([]byte, 1)),
			"CompareAndSwap": casErr,
			"FetchAndAdd":    faaErr,
			"CloseWrite":     c.CloseWrite(),
			"Err":            c.Err(),
			"Close":          c.Close(),
			"Abort":          c.Abort(),
		} {
			require.ErrorIs(t, err, endpoint.ErrInvalid, "Conn %s: %s", name, op)
		}
		require.ErrorIs(t, c.Err(), ErrClosed, "Conn %s: it ended before it began", name)
		require.Nil(t, c.LocalAddr(), name)
		require.Nil(t, c.RemoteAddr(), name)
		require.Nil(t, c.PD(), name)
		require.Zero(t, c.MaxInline(), name)
		require.Zero(t, c.Stats(), name)
		_, open := <-c.Done()
		require.False(t, open, "Conn %s: Done is closed", name)
	}
	for name, l := range map[string]*Listener{"nil": nil, "zero": {}} {
		_, err := l.Accept(ctx)
		require.ErrorIs(t, err, endpoint.ErrInvalid, "Listener "+name)
		require.ErrorIs(t, l.Close(), endpoint.ErrInvalid, "Listener "+name)
		require.Nil(t, l.Addr(), "Listener "+name)
	}
	for name, cl := range map[string]*Client{"nil": nil, "zero": {}, "on no Conn": NewClient(nil), "on a zero Conn": NewClient(&Conn{})} {
		_, err := cl.Call(ctx, "m", nil)
		require.ErrorIs(t, err, endpoint.ErrInvalid, "Client "+name)
		_, err = cl.CallRegion(ctx, "m", &bufpool.Region{}, 1)
		require.ErrorIs(t, err, endpoint.ErrInvalid, "Client "+name)
		require.ErrorIs(t, cl.Close(), endpoint.ErrInvalid, "Client "+name)
		require.Nil(t, cl.PD(), "Client "+name)
		require.Nil(t, cl.LocalAddr(), "Client "+name)
		require.Nil(t, cl.RemoteAddr(), "Client "+name)
		require.Zero(t, cl.Stats(), "Client "+name)
	}
	for name, s := range map[string]*Server{"nil": nil, "zero": {}, "no handler": NewServer(nil)} {
		require.ErrorIs(t, s.Serve(ctx, nil), endpoint.ErrInvalid, "Server "+name)
		require.Zero(t, s.Stats(), "Server "+name)
	}
	require.ErrorIs(t, (*Server)(nil).Shutdown(ctx), endpoint.ErrInvalid)
	for _, m := range []*Message{nil, {}} {
		m.Release() // nothing to give back, and no panic
		m.Release()
	}
	var mux *Mux
	require.ErrorIs(t, mux.Handle("m", func(context.Context, []byte) ([]byte, error) { return nil, nil }), endpoint.ErrInvalid)
	_, err := mux.Serve(ctx, "m", nil)
	require.ErrorIs(t, err, CodeUnimplemented)
}

// The hello carries the silence a side tolerates (its keepalive timeout),
// in whole milliseconds rounded up, never said tighter than it is, and at
// most the field's largest; 0 says none, as does a hello that predates the
// field (20 bytes, then the CM's zeros).
func TestHelloCarriesTheSilence(t *testing.T) {
	for _, c := range []struct{ set, want time.Duration }{
		{5 * time.Second, 5 * time.Second},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{time.Nanosecond, time.Millisecond},
		{0, 0},
		{math.MaxInt64, math.MaxUint32 * time.Millisecond},
	} {
		h, err := parseHello(hello{recvDepth: 32, bufSize: 4096, silence: c.set}.encode())
		require.NoError(t, err)
		require.Equal(t, c.want, h.silence, "said %v", c.set)
	}
	said := hello{recvDepth: 32, bufSize: 4096, maxMessage: 1 << 20, silence: time.Second}.encode()
	h, err := parseHello(append(said[:helloMaxMessageEnd:helloMaxMessageEnd], make([]byte, 36)...))
	require.NoError(t, err)
	require.Zero(t, h.silence, "a hello from before the field")
	require.Equal(t, 1<<20, h.maxMessage, "the fields before it are read")

	o, err := newOptions([]Option{WithKeepalive(time.Second, 3*time.Second)})
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, o.hello().silence)
	o, err = newOptions([]Option{WithKeepalive(time.Second, 0)})
	require.NoError(t, err)
	require.Zero(t, o.hello().silence, "no timeout: the peer need not send keepalives")
}
