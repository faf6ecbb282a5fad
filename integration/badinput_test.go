package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// TestBadRemoteAccess: a wrong rkey, a range past the end of a region, and
// a read of a write-only region each fail with a remote access error on
// that connection only; another connection keeps working.
func TestBadRemoteAccess(t *testing.T) {
	for _, tc := range []struct {
		name   string
		access bufpool.Access
		op     endpoint.Op
		mangle func(bufpool.Remote) bufpool.Remote
	}{
		{"wrong rkey", bufpool.RemoteWrite, endpoint.OpWrite, func(r bufpool.Remote) bufpool.Remote { r.RKey ^= 0x5a5a00; return r }},
		{"past the end", bufpool.RemoteWrite, endpoint.OpWrite, func(r bufpool.Remote) bufpool.Remote { r.Addr += uint64(r.Len) - 8; return r }},
		{"read of a write-only region", bufpool.RemoteWrite, endpoint.OpRead, func(r bufpool.Remote) bufpool.Remote { return r }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			rxetest.CheckResources(t)
			bad := connect(t, ctx)
			good := connect(t, ctx)
			_, remote := exchangeRegion(t, ctx, bad, 4096, tc.access)
			remote = tc.mangle(remote)
			pool := newPool(t, bad.client, 64, 1)
			b, _ := pool.TryGet()
			req := endpoint.Request{Op: tc.op, Context: "bad", Buffer: b, Length: 64, Remote: remote, Flags: endpoint.NoInline}
			require.NoError(t, bad.client.PostBatch([]endpoint.Request{req}))
			c := next(t, bad.client)
			if !rxetest.ChecksRemoteReadRight() && tc.op == endpoint.OpRead {
				// The read succeeds, and the test says so.
				require.NoError(t, c.Err)
				require.NoError(t, pool.Put(b))
				return
			}
			requireRefused(t, bad.client, c, endpoint.StatusRemoteAccess)
			require.NoError(t, pool.Put(b))
			// The failed QP is in the error state: that connection is over
			// (RC semantics), the other one is not.
			require.NoError(t, echoOnce(t, ctx, good))
		})
	}
}

// requireRefused: the peer's device refused the work request whose
// completion is c. On RoCE the completion carries the error, with one of
// the statuses want (any, when want is empty). On iWARP a
// send or write completes once TCP has taken it, so its completion may say
// success; the peer's refusal (a TERMINATE) ends the connection instead.
// Either way the endpoint ends, with an error.
func requireRefused(t *testing.T, ep *endpoint.Endpoint, c endpoint.Completion, want ...endpoint.Status) {
	t.Helper()
	var ce *endpoint.CompletionError
	if c.Err != nil || !rxetest.IWARP() {
		require.ErrorAs(t, c.Err, &ce)
		if !rxetest.IWARP() && len(want) > 0 {
			require.Contains(t, want, ce.Status, "got %v", c.Err)
		}
	}
	select {
	case <-ep.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the endpoint outlived a refused work request (its completion: %v)", c.Err)
	}
	require.Error(t, ep.Err())
	t.Logf("completion: %v; endpoint: %v", c.Err, ep.Err())
}

// echoOnce sends one message on a pair and checks it arrives.
func echoOnce(t *testing.T, ctx context.Context, p *pair) error {
	t.Helper()
	spool := newPool(t, p.server, 64, 1)
	cpool := newPool(t, p.client, 64, 1)
	rb, _ := spool.TryGet()
	sb, _ := cpool.TryGet()
	defer spool.Put(rb)
	defer cpool.Put(sb)
	if err := p.server.PostRecv("r", rb); err != nil {
		return err
	}
	copy(sb.Bytes(), "alive")
	if err := p.client.PostSend("s", sb, 5); err != nil {
		return err
	}
	if c := next(t, p.client); c.Err != nil {
		return c.Err
	}
	c := next(t, p.server)
	if c.Err != nil {
		return c.Err
	}
	if string(rb.Bytes()[:5]) != "alive" {
		return errors.New("payload differs")
	}
	return nil
}

// TestMessageLargerThanReceive: the peer sends more than the posted buffer
// holds; the receive fails with a local error. The IB spec names it a
// local length error; Soft-RoCE (rxe) reports a local QP operation error.
func TestMessageLargerThanReceive(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx)
	spool := newPool(t, p.server, 64, 1)
	cpool := newPool(t, p.client, 256, 1)
	rb, _ := spool.TryGet()
	require.NoError(t, p.server.PostRecv("small", rb))
	sb, _ := cpool.TryGet()
	require.NoError(t, p.client.PostSend("big", sb, 200))
	c := next(t, p.server)
	var ce *endpoint.CompletionError
	require.ErrorAs(t, c.Err, &ce)
	require.Contains(t, []endpoint.Status{endpoint.StatusLocalLength, endpoint.StatusLocalQPOp}, ce.Status, "got %v", c.Err)
	require.Same(t, rb, c.Buffer, "the buffer comes back with the error")
	// The sender learns the send failed: from its completion, or (iWARP)
	// from the end of the connection.
	requireRefused(t, p.client, next(t, p.client))
	require.NoError(t, spool.Put(rb))
	require.NoError(t, cpool.Put(sb))
}

// TestOversizedPostsAreRefused: requests the QP cannot take are refused
// before anything is posted, and the endpoint works on.
func TestOversizedPostsAreRefused(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	p := connect(t, ctx, cm.WithMaxSGE(2))
	pool := newPool(t, p.client, 64, 3)
	b, _ := pool.TryGet()
	segs := make([]bufpool.Segment, 3)
	for i := range segs {
		segs[i], _ = b.Segment(i*8, 8)
	}
	require.ErrorIs(t, p.client.PostSend("long", b, 65), endpoint.ErrInvalid)
	require.ErrorIs(t, p.client.PostSendv("3 sges", segs), endpoint.ErrInvalid)
	require.ErrorIs(t, p.client.PostWrite("past remote", b, 64, bufpool.Remote{Addr: 4096, RKey: 1, Len: 32}), endpoint.ErrInvalid)
	_, err := b.Segment(60, 8)
	require.ErrorIs(t, err, bufpool.ErrRange)
	// A batch with one bad request posts nothing.
	good := endpoint.Request{Op: endpoint.OpRecv, Context: "ok", Buffer: b, Length: 64}
	bad := endpoint.Request{Op: endpoint.OpSend, Context: "bad", Buffer: b, Length: 100}
	require.ErrorIs(t, p.client.PostBatch([]endpoint.Request{good, bad}), endpoint.ErrInvalid)
	// A receive always completes, so send-only options on one are refused.
	silentRecv := endpoint.Request{Op: endpoint.OpRecv, Context: "silent recv", Buffer: b, Length: 64, Flags: endpoint.Silent}
	require.ErrorIs(t, p.client.PostBatch([]endpoint.Request{silentRecv}), endpoint.ErrInvalid)
	require.NoError(t, pool.Put(b))
	require.NoError(t, echoOnce(t, ctx, p))
}

// TestFuzzCorpusOverTheWire replays the msg decoder's fuzz corpus, each
// input as one message on a fresh raw connection to a msg listener: each
// malformed one ends its own connection with ErrMalformed (which then
// matches ErrClosed, as every error of a connection that ended does); a
// well-formed one is delivered; the listener serves a good client
// afterwards.
func TestFuzzCorpusOverTheWire(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	corpus := readFuzzCorpus(t, "../msg/testdata/fuzz/FuzzDecode")
	thisVersion := 0
	for _, input := range corpus {
		if len(input) >= msg.HeaderSize && input[0] == msg.Version {
			thisVersion++
		}
	}
	// A corpus of an older wire version stops at the version check and
	// tests nothing behind it: convert it when the header changes.
	require.Greater(t, thisVersion, len(corpus)/2, "corpus inputs of wire version %d", msg.Version)
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	malformed := 0
	for _, input := range corpus {
		if len(input) == 0 || len(input) > 4096 {
			continue // a receive of 0 bytes carries nothing to decode; >4096 cannot be one message
		}
		raw, srv := rawMsgPeer(t, ctx, l)
		pool, err := bufpool.New(raw.PD(), bufpool.Size(4096), bufpool.Count(1))
		require.NoError(t, err)
		b, _ := pool.TryGet()
		copy(b.Bytes(), input)
		require.NoError(t, raw.PostSend(nil, b, len(input)))
		sent := next(t, raw).Err
		var h msg.Header
		if decodeErr := h.Decode(input); decodeErr != nil {
			_, err := srv.Recv(ctx)
			require.ErrorIs(t, err, msg.ErrMalformed, "input %x", input)
			require.ErrorIs(t, err, msg.ErrClosed, "a connection that ended, whatever ended it")
			require.NotErrorIs(t, err, net.ErrClosed)
			malformed++
			// The listener ends the connection as soon as the message
			// arrives, and its disconnect may reach this side before the
			// device's acknowledgement of the send, which then comes back
			// flushed. ErrMalformed above is the proof of delivery.
			if sent != nil {
				require.ErrorIs(t, sent, endpoint.ErrClosed, "input %x", input)
			}
		} else {
			require.NoError(t, sent)
			if h.Type == msg.TypeData {
				_, err := srv.Recv(ctx)
				require.NoError(t, err)
			}
		}
		srv.Close()
		closeAndDrain(t, raw)
		require.NoError(t, pool.Put(b))
		require.NoError(t, pool.Close())
	}
	t.Logf("%d corpus inputs replayed, %d malformed ones each closed their connection", len(corpus), malformed)
	require.Positive(t, malformed)
	requireListenerServes(t, ctx, l)
}

// rawMsgPeer dials l from a raw cm endpoint passing for a msg peer
// (msgHello) and returns it with the connection l accepted; the caller
// closes both.
func rawMsgPeer(t *testing.T, ctx context.Context, l *msg.Listener) (*endpoint.Endpoint, *msg.Conn) {
	t.Helper()
	accepted := make(chan *msg.Conn, 1)
	go func() {
		c, _ := l.Accept(ctx)
		accepted <- c
	}()
	raw, err := cm.Dial(ctx, l.Addr().String(), msgHello(t))
	require.NoError(t, err)
	srv := <-accepted
	require.NotNil(t, srv)
	return raw, srv
}

// requireListenerServes checks that l still accepts a msg client and
// delivers its message.
func requireListenerServes(t *testing.T, ctx context.Context, l *msg.Listener) {
	t.Helper()
	require.NoError(t, func() error {
		accepted := make(chan *msg.Conn, 1)
		go func() {
			c, _ := l.Accept(ctx)
			accepted <- c
		}()
		c, err := msg.Dial(ctx, l.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		srv := <-accepted
		defer srv.Close()
		if err := c.Send(ctx, []byte("fine")); err != nil {
			return err
		}
		_, err = srv.Recv(ctx)
		return err
	}(), "the listener no longer serves")
}

// TestRendezvousFromABadRegionEndsTheConnection: a peer that offers a
// message by rendezvous in a region the receiver cannot read (a raw cm
// endpoint passing for a msg peer, naming an rkey nobody registered)
// ends that connection and only that one: the receiver's Recv fails with
// the failed read (a remote access error; on iWARP the peer's device
// ends the connection instead, and the read is flushed), which matches
// ErrClosed and not net.ErrClosed, the receiver disconnects, and its
// listener serves the next client. Nothing leaks.
func TestRendezvousFromABadRegionEndsTheConnection(t *testing.T) {
	err := offerFromRawPeer(t, 4096)
	require.ErrorContains(t, err, "reading a 4096-byte rendezvous")
	require.ErrorIs(t, err, msg.ErrClosed)
	require.NotErrorIs(t, err, net.ErrClosed)
	if !rxetest.IWARP() { // iWARP's responder ends the stream: the read is flushed
		var ce *endpoint.CompletionError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, endpoint.StatusRemoteAccess, ce.Status)
	}
}

// TestRendezvousLargerThanTheReceiverTakesEndsTheConnection: a peer that
// ignores the largest message the receiver's hello announced
// (WithMaxRecvSize) and offers a 256 MiB message anyway ends that
// connection before the receiver registers anything for it: Recv fails
// with an error matching msg.ErrMalformed that names the sizes, and no
// failed read; the receiver disconnects, and its listener serves the next
// client.
func TestRendezvousLargerThanTheReceiverTakesEndsTheConnection(t *testing.T) {
	const most, offered = 1 << 20, 1 << 28
	err := offerFromRawPeer(t, offered, msg.WithMaxRecvSize(most))
	require.ErrorIs(t, err, msg.ErrMalformed)
	require.ErrorIs(t, err, msg.ErrClosed)
	require.ErrorContains(t, err, fmt.Sprintf("the peer offered a %d-byte message, more than the %d this side receives", offered, most))
	_, failedRead := errors.AsType[*endpoint.CompletionError](err)
	require.False(t, failedRead, "the receiver read nothing")
}

// offerFromRawPeer listens with opts and dials from a raw cm endpoint
// passing for a msg peer, which offers by rendezvous a length-byte message
// in a region nobody registered. It returns the error the receiver's Recv
// fails with, once it has checked that the receiver disconnected and that
// its listener serves the next client. Nothing leaks.
func offerFromRawPeer(t *testing.T, length uint32, opts ...msg.Option) error {
	t.Helper()
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), opts...)
	require.NoError(t, err)
	defer l.Close()
	raw, srv := rawMsgPeer(t, ctx, l)
	defer srv.Close()

	sent := offerRendezvous(t, raw, length)
	_, recvErr := srv.Recv(ctx)
	t.Logf("the receiver's Recv: %v", recvErr)
	requireCutOff(t, raw, sent)
	requireListenerServes(t, ctx, l)
	return recvErr
}

// offerRendezvous sends from raw a rendezvous offer of a length-byte
// message in a region nobody registered, and returns the send's
// completion error, once the buffer it was sent from is back.
func offerRendezvous(t *testing.T, raw *endpoint.Endpoint, length uint32) error {
	t.Helper()
	pool, err := bufpool.New(raw.PD(), bufpool.Size(64), bufpool.Count(1))
	require.NoError(t, err)
	defer pool.Close()
	b, ok := pool.TryGet()
	require.True(t, ok)
	defer func() { require.NoError(t, pool.Put(b)) }()
	// A header, then the rendezvous info (msg/frame.go).
	const infoSize = 28
	h := msg.Header{Type: msg.TypeRendezvous, Flags: msg.FlagRendezvous, ID: 1, Length: infoSize}
	h.Encode(b.Bytes())
	info := b.Bytes()[msg.HeaderSize:]
	info[0] = byte(msg.TypeData)
	binary.LittleEndian.PutUint64(info[4:], 1)         // the rendezvous id
	binary.LittleEndian.PutUint64(info[12:], 1<<20)    // the region's address
	binary.LittleEndian.PutUint32(info[20:], 0x5a5a5a) // its rkey
	binary.LittleEndian.PutUint32(info[24:], length)
	require.NoError(t, raw.PostSend(nil, b, msg.HeaderSize+infoSize))
	return next(t, raw).Err
}

// requireCutOff checks that the receiver of what raw sent, whose last
// send's completion error was sent, disconnected it, and closes raw.
func requireCutOff(t *testing.T, raw *endpoint.Endpoint, sent error) {
	t.Helper()
	select {
	case <-raw.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the receiver did not disconnect")
	}
	// The receiver may disconnect before the device acknowledges the
	// send, which then comes back flushed; the receiver's failure is the
	// proof of delivery.
	if sent != nil {
		require.ErrorIs(t, sent, endpoint.ErrClosed)
	}
	closeAndDrain(t, raw)
}

// readFuzzCorpus reads Go fuzz corpus files holding one []byte each.
func readFuzzCorpus(t *testing.T, dir string) [][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	require.NotEmptyf(t, files, "no fuzz corpus in %s: the path is the test directory's, where go test runs the test binary", dir)
	var out [][]byte
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		require.Equal(t, "go test fuzz v1", lines[0], f)
		v := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		s, err := strconv.Unquote(v)
		require.NoError(t, err, f)
		out = append(out, []byte(s))
	}
	return out
}

// TestRPCServerEndsAConnOnAMalformedRequest: a request whose method is
// missing or runs past its payload (sent by a raw cm endpoint passing for
// a msg client) ends that connection and only that one: the sender's
// endpoint ends, the Server forgets the connection, and a good client's
// calls go on before and after. Nothing leaks.
func TestRPCServerEndsAConnOnAMalformedRequest(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	// No keepalives: the raw peer posts no receive, and the server's
	// keepalive would end the connection too, within seconds.
	cl, s, stop := rpcClient(t, ctx, msg.WithKeepalive(0, 0))
	defer stop()
	echo := func(p string) {
		t.Helper()
		got, err := cl.Call(ctx, "echo", []byte(p))
		require.NoError(t, err)
		require.Equal(t, p, string(got))
	}
	echo("before")
	for name, payload := range map[string][]byte{
		"no payload":            nil,
		"an empty method":       {0, 'x'},
		"a method past its end": {5, 'e', 'c'},
	} {
		raw, err := cm.Dial(ctx, cl.RemoteAddr().String(), msgHello(t))
		require.NoError(t, err, name)
		pool, err := bufpool.New(raw.PD(), bufpool.Size(64), bufpool.Count(1))
		require.NoError(t, err)
		b, _ := pool.TryGet()
		h := msg.Header{Type: msg.TypeRequest, ID: 1, Length: uint32(len(payload))}
		h.Encode(b.Bytes())
		copy(b.Bytes()[msg.HeaderSize:], payload)
		require.NoError(t, raw.PostSend(nil, b, msg.HeaderSize+len(payload)))
		sent := next(t, raw).Err
		select {
		case <-raw.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the server kept the connection", name)
		}
		// The server may disconnect before the device acknowledges the
		// request, which then comes back flushed.
		if sent != nil {
			require.ErrorIs(t, sent, endpoint.ErrClosed, name)
		}
		closeAndDrain(t, raw)
		require.NoError(t, pool.Put(b))
		require.NoError(t, pool.Close())
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Len(c, s.Stats().Conns, 1, "connections the server keeps")
		}, 10*time.Second, 10*time.Millisecond, name)
	}
	echo("after")
}
