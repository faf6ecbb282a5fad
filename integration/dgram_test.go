package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

// listenDgram listens for datagrams on the test device. On iWARP, which
// has no datagram queue pairs, it asserts the typed refusal and returns
// nil: the caller's test ends there.
func listenDgram(t *testing.T, ctx context.Context, opts ...dgram.Option) *dgram.Conn {
	t.Helper()
	c, err := dgram.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), opts...)
	if rxetest.IWARP() {
		require.ErrorIs(t, err, endpoint.ErrNotSupported)
		require.ErrorIs(t, err, dgram.ErrNoIWARP)
		return nil
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// resolvedDgramPair listens twice on the test device, cli with cliOpts,
// and resolves the first Conn (srv) from the second (cli): to is srv's
// address for cli's writes. On iWARP srv is nil, as with listenDgram.
func resolvedDgramPair(t *testing.T, ctx context.Context, cliOpts ...dgram.Option) (srv, cli *dgram.Conn, to *dgram.Addr) {
	t.Helper()
	if srv = listenDgram(t, ctx); srv == nil {
		return nil, nil, nil
	}
	cli = listenDgram(t, ctx, cliOpts...)
	to, err := cli.Resolve(ctx, srv.LocalAddr().String())
	require.NoError(t, err)
	return srv, cli, to
}

// sendDatagram sends p from one Conn to addr to and reads it at another
// within 10 s, whole; it returns the sender's address as the reader saw it.
func sendDatagram(t *testing.T, from *dgram.Conn, to net.Addr, at *dgram.Conn, p string) net.Addr {
	t.Helper()
	_, err := from.WriteTo([]byte(p), to)
	require.NoError(t, err)
	require.NoError(t, at.SetReadDeadline(time.Now().Add(10*time.Second)))
	buf := make([]byte, len(p)+1)
	n, src, err := at.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, p, string(buf[:n]))
	return src
}

// payload is n bytes that differ with seed, so a datagram mixed up with
// another, or cut, does not compare equal.
func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// TestDatagramSizesByteForByte: datagrams of 1 byte up to the MTU go out,
// come back from an echoing peer, and are compared byte for byte, with the
// sender's address on each; immediate data travels; a datagram longer than
// the MTU is refused before anything is sent.
func TestDatagramSizesByteForByte(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	srv, cli, to := resolvedDgramPair(t, ctx)
	if srv == nil {
		return
	}
	mtu := srv.MTU()
	require.GreaterOrEqual(t, mtu, 256)
	srvAddr := srv.LocalAddr().(*dgram.Addr)
	require.Equal(t, srvAddr.QPN, to.QPN)

	echoed := make(chan error, 1)
	go func() { echoed <- echoDatagrams(srv, -1) }()
	buf := make([]byte, mtu)
	sizes := []int{0, 1, 2, 39, 40, 41, 63, 64, 65, 1000, mtu - 1, mtu}
	for i, n := range sizes {
		p := payload(n, byte(i))
		_, err := cli.WriteTo(p, to)
		require.NoError(t, err, "size %d", n)
		require.NoError(t, cli.SetReadDeadline(time.Now().Add(10*time.Second)))
		got, from, err := cli.ReadFrom(buf)
		require.NoError(t, err, "size %d", n)
		require.True(t, bytes.Equal(p, buf[:got]), "size %d came back different", n)
		require.True(t, from.(*dgram.Addr).IP.Equal(srvAddr.IP))
		require.Equal(t, srvAddr.QPN, from.(*dgram.Addr).QPN)
	}

	// Immediate data, in a batch of three.
	ms := []dgram.Message{
		{Buf: payload(10, 1), Addr: to, Imm: 0xdeadbeef, HasImm: true},
		{Buf: payload(20, 2), Addr: to},
		{Buf: payload(30, 3), Addr: to, Imm: 7, HasImm: true},
	}
	sent, err := cli.WriteBatch(ms)
	require.NoError(t, err)
	require.Equal(t, 3, sent)
	in := make([]dgram.Message, 3)
	for i := range in {
		in[i].Buf = make([]byte, 64)
	}
	for got := 0; got < 3; {
		n, err := cli.ReadBatch(in[got:])
		require.NoError(t, err)
		got += n
	}
	for i := range in {
		require.Equal(t, ms[i].Buf, in[i].Buf[:in[i].N])
		require.Equal(t, ms[i].HasImm, in[i].HasImm, "message %d", i)
		require.Equal(t, ms[i].Imm, in[i].Imm, "message %d", i)
	}

	// Too long: refused, nothing sent (the echo would come back).
	_, err = cli.WriteTo(make([]byte, mtu+1), to)
	require.ErrorIs(t, err, dgram.ErrMessageTooLarge)
	require.ErrorIs(t, err, syscall.EMSGSIZE)
	require.NoError(t, cli.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, _, err = cli.ReadFrom(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout())

	// A truncated read says so.
	_, err = cli.WriteTo(payload(100, 9), to)
	require.NoError(t, err)
	require.NoError(t, cli.SetReadDeadline(time.Now().Add(10*time.Second)))
	small := []dgram.Message{{Buf: make([]byte, 10)}}
	_, err = cli.ReadBatch(small)
	require.NoError(t, err)
	require.Equal(t, 10, small[0].N)
	require.True(t, small[0].Truncated)
	require.Equal(t, payload(100, 9)[:10], small[0].Buf)

	// Stats counted every datagram each way, the batch as one post, the
	// refused one not at all.
	datagrams := uint64(len(sizes) + len(ms) + 1)
	bytesEachWay := uint64(10 + 20 + 30 + 100)
	for _, n := range sizes {
		bytesEachWay += uint64(n)
	}
	require.Equal(t, dgram.Stats{DatagramsSent: datagrams, BytesSent: bytesEachWay, Posts: uint64(len(sizes)) + 1 + 1,
		DatagramsReceived: datagrams, BytesReceived: bytesEachWay, Truncated: 1}, cli.Stats())
	// The echoer counts a post once it returns, which may be after the
	// client already read the echo: read the server's counts only once
	// the echoer has stopped.
	require.NoError(t, srv.Close())
	require.ErrorIs(t, <-echoed, net.ErrClosed)
	st := srv.Stats()
	require.Equal(t, datagrams, st.DatagramsReceived)
	require.Equal(t, datagrams, st.DatagramsSent)
	require.Equal(t, bytesEachWay, st.BytesSent)
	require.LessOrEqual(t, st.Posts, datagrams)
	require.NoError(t, srv.Close(), "a second Close")
	require.Equal(t, st, srv.Stats(), "Stats after Close")
}

// TestDatagramNameOfBothFamilies: the testbed's name has an IPv6 and an
// IPv4 address. A Conn resolves it to the address of its own family (its
// queue pair reaches no other), whatever order the resolver gives, and
// the datagram reaches the Conn listening there; Listen and Dial take the
// name's IPv4 address, as net's ListenUDP and DialUDP do.
func TestDatagramNameOfBothFamilies(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	name, dev6 := testbedName(t), os.Getenv("RDMACM_TEST_ADDR6")
	srv4 := listenDgram(t, ctx)
	if srv4 == nil {
		return
	}
	port := strconv.Itoa(srv4.LocalAddr().(*dgram.Addr).Port)
	srv6, err := dgram.Listen(ctx, net.JoinHostPort(dev6, port))
	require.NoError(t, err)
	defer srv6.Close()
	cli6, err := dgram.Listen(ctx, net.JoinHostPort(dev6, "0"))
	require.NoError(t, err)
	defer cli6.Close()
	for _, c := range []struct {
		from, at *dgram.Conn
	}{{listenDgram(t, ctx), srv4}, {cli6, srv6}} {
		to, err := c.from.Resolve(ctx, net.JoinHostPort(name, port))
		require.NoError(t, err, "resolving %s:%s from %v", name, port, c.from.LocalAddr())
		require.Equal(t, c.at.LocalAddr().String(), to.String())
		sendDatagram(t, c.from, to, c.at, "by name from "+c.from.LocalAddr().String())
	}

	byName, err := dgram.Listen(ctx, net.JoinHostPort(name, "0"))
	require.NoError(t, err)
	defer byName.Close()
	require.Equal(t, rxetest.Addr(t), byName.LocalAddr().(*dgram.Addr).IP.String())
	d, err := dgram.Dial(ctx, net.JoinHostPort(name, port))
	require.NoError(t, err)
	defer d.Close()
	require.Equal(t, srv4.LocalAddr().String(), d.RemoteAddr().String())
	require.NoError(t, byName.Close())
	require.NoError(t, d.Close())
	require.NoError(t, srv6.Close())
	require.NoError(t, cli6.Close())
}

// TestDatagramDialReadsOnlyItsPeer: a Conn from Dial returns only its
// peer's datagrams; one from a stranger is dropped and counted in
// Stats.Discarded.
func TestDatagramDialReadsOnlyItsPeer(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	srv := listenDgram(t, ctx)
	if srv == nil {
		return
	}
	stranger := listenDgram(t, ctx)
	d, err := dgram.Dial(ctx, srv.LocalAddr().String())
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	toD, err := stranger.Resolve(ctx, d.LocalAddr().String())
	require.NoError(t, err)
	_, err = stranger.WriteTo([]byte("stranger"), toD)
	require.NoError(t, err)

	_, err = d.Write([]byte("hello")) // the server learns the way back from it
	require.NoError(t, err)
	buf := make([]byte, 64)
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, from, err := srv.ReadFrom(buf)
	require.NoError(t, err)
	_, err = srv.WriteTo([]byte("peer"), from)
	require.NoError(t, err)

	require.NoError(t, d.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := d.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "peer", string(buf[:n]))
	// The stranger's came before or comes after: a read that waits for
	// nothing more takes it either way.
	require.NoError(t, d.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = d.Read(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	st := d.Stats()
	require.Equal(t, uint64(1), st.Discarded, "%+v", st)
	require.Equal(t, uint64(1), st.DatagramsReceived, "%+v", st)
}

// echoDatagrams sends every datagram back to its sender, with its
// immediate data, until n have been echoed (n < 0: until an error).
func echoDatagrams(c *dgram.Conn, n int) error {
	ms := make([]dgram.Message, 16)
	for i := range ms {
		ms[i].Buf = make([]byte, c.MTU())
	}
	out := make([]dgram.Message, 16)
	for done := 0; n < 0 || done < n; {
		got, err := c.ReadBatch(ms)
		if err != nil {
			return err
		}
		for i := range got {
			out[i] = dgram.Message{Buf: ms[i].Buf[:ms[i].N], Addr: ms[i].Addr, Imm: ms[i].Imm, HasImm: ms[i].HasImm}
		}
		if _, err := c.WriteBatch(out[:got]); err != nil {
			return err
		}
		done += got
	}
	return nil
}

// TestDatagramManyPeers: eight peers, each its own queue pair, send to
// one Conn, which answers each from the address ReadFrom gave; every peer
// gets back exactly its own datagrams.
func TestDatagramManyPeers(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	srv := listenDgram(t, ctx)
	if srv == nil {
		return
	}
	const peers, each = 8, 40
	echoed := make(chan error, 1)
	go func() { echoed <- echoDatagrams(srv, peers*each) }()
	errs := make(chan error, peers)
	for p := range peers {
		cli := listenDgram(t, ctx)
		go func() {
			errs <- func() error {
				to, err := cli.Resolve(ctx, srv.LocalAddr().String())
				if err != nil {
					return err
				}
				cli.SetReadDeadline(time.Now().Add(30 * time.Second))
				buf := make([]byte, 64)
				for i := range each {
					want := binary.BigEndian.AppendUint32([]byte{byte(p)}, uint32(i))
					if _, err := cli.WriteTo(want, to); err != nil {
						return err
					}
					n, _, err := cli.ReadFrom(buf)
					if err != nil {
						return err
					}
					if !bytes.Equal(want, buf[:n]) {
						return fmt.Errorf("peer %d got %x, want %x", p, buf[:n], want)
					}
				}
				return nil
			}()
		}()
	}
	for range peers {
		require.NoError(t, <-errs)
	}
	require.NoError(t, <-echoed)
}

// TestDatagramPeerCacheEvicts: with room for one learnt peer, a sender
// from a second device address (the IPv6 one) takes the place of the
// first, whose address handle is freed: a reply to it is refused with
// ErrNoPath until it sends again, and is then learnt anew. The address
// handles all go by Close (its PD frees without EBUSY) and CheckResources.
func TestDatagramPeerCacheEvicts(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	srv := listenDgram(t, ctx, dgram.WithPeerCache(1))
	if srv == nil {
		return
	}
	cli4 := listenDgram(t, ctx)
	to4, err := cli4.Resolve(ctx, srv.LocalAddr().String())
	require.NoError(t, err)
	// cli6 reaches srv's queue pair through the device's IPv6 address,
	// which names the same port: a path made by resolving a Conn there.
	dev6 := os.Getenv("RDMACM_TEST_ADDR6")
	require.NotEmpty(t, dev6, "RDMACM_TEST_ADDR6")
	at6, err := dgram.Listen(ctx, net.JoinHostPort(dev6, "0"))
	require.NoError(t, err)
	defer func() { require.NoError(t, at6.Close()) }()
	cli6, err := dgram.Listen(ctx, net.JoinHostPort(dev6, "0"))
	require.NoError(t, err)
	defer func() { require.NoError(t, cli6.Close()) }()
	via6, err := cli6.Resolve(ctx, at6.LocalAddr().String())
	require.NoError(t, err)
	srvAddr := srv.LocalAddr().(*dgram.Addr)
	to6 := &dgram.Addr{IP: via6.IP, QPN: srvAddr.QPN, QKey: srvAddr.QKey}

	from4 := sendDatagram(t, cli4, to4, srv, "from IPv4")
	sendDatagram(t, srv, from4, cli4, "reply to IPv4")
	from6 := sendDatagram(t, cli6, to6, srv, "from IPv6")
	require.NotEqual(t, from4.(*dgram.Addr).IP.String(), from6.(*dgram.Addr).IP.String())
	sendDatagram(t, srv, from6, cli6, "reply to IPv6")
	_, err = srv.WriteTo([]byte("to an evicted peer"), from4)
	require.ErrorIs(t, err, dgram.ErrNoPath, "the IPv4 peer's path made room for the IPv6 one")

	from4 = sendDatagram(t, cli4, to4, srv, "from IPv4 again")
	sendDatagram(t, srv, from4, cli4, "reply to IPv4 again")
	_, err = srv.WriteTo([]byte("to an evicted peer"), from6)
	require.ErrorIs(t, err, dgram.ErrNoPath, "the IPv6 peer's path made room for the IPv4 one")
}

// TestDatagramReceiverFallsBehind states what UD does and does not
// promise. A sender is never held back by a slow receiver (no RNR, no
// credits): 200 datagrams go out at once. The receiver, which read
// nothing meanwhile, finds at most its 16 posted receives filled; the
// rest are lost, silently. What it does get is whole and in the order
// sent (one sender, one link), and the Conn works on afterwards.
func TestDatagramReceiverFallsBehind(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	slow := listenDgram(t, ctx, dgram.WithRecvDepth(16))
	if slow == nil {
		return
	}
	fast := listenDgram(t, ctx)
	to, err := fast.Resolve(ctx, slow.LocalAddr().String())
	require.NoError(t, err)
	const sent = 200
	for i := range sent {
		_, err := fast.WriteTo(binary.BigEndian.AppendUint32(nil, uint32(i)), to)
		require.NoError(t, err, "datagram %d: the sender must not wait for the receiver", i)
	}
	time.Sleep(500 * time.Millisecond) // let them all arrive, or be dropped
	var got []uint32
	buf := make([]byte, 8)
	for {
		require.NoError(t, slow.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
		n, _, err := slow.ReadFrom(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		require.NoError(t, err)
		require.Equal(t, 4, n)
		got = append(got, binary.BigEndian.Uint32(buf))
	}
	t.Logf("the receiver got %d of %d datagrams", len(got), sent)
	require.NotEmpty(t, got)
	require.LessOrEqual(t, len(got), 16, "more datagrams than posted receives")
	for i := 1; i < len(got); i++ {
		require.Greater(t, got[i], got[i-1], "out of order: %v", got)
	}
	// Reading again reposted every receive: the Conn works on.
	sendDatagram(t, fast, to, slow, "after")
}

// TestDatagramBadInputAndClose: what a caller can get wrong gets a clear
// error and posts nothing; Close wakes a blocked reader, is idempotent,
// and every call after it fails with net.ErrClosed.
func TestDatagramBadInputAndClose(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	c := listenDgram(t, ctx)
	if c == nil {
		return
	}
	_, err := dgram.Listen(ctx, "0.0.0.0:0")
	require.ErrorContains(t, err, "not a wildcard")
	// A loopback address has no device; an unspecified peer routes there.
	for _, addr := range []string{"127.0.0.1:0", "localhost:0"} {
		_, err = dgram.Listen(ctx, addr)
		require.ErrorContains(t, err, "loopback address, which no RDMA device has", addr)
	}
	_, err = dgram.Dial(ctx, "0.0.0.0:7174")
	require.ErrorContains(t, err, "use the address of an RDMA-capable interface")
	_, err = dgram.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), dgram.WithSendDepth(-1))
	require.ErrorIs(t, err, endpoint.ErrInvalid)

	_, err = c.WriteTo([]byte("x"), &net.UDPAddr{IP: net.ParseIP(rxetest.Addr(t)), Port: 1})
	require.ErrorIs(t, err, endpoint.ErrInvalid)
	_, err = c.WriteTo([]byte("x"), &dgram.Addr{IP: net.ParseIP("10.99.99.99"), QPN: 5})
	require.ErrorIs(t, err, dgram.ErrNoPath)
	_, err = c.Write([]byte("x"))
	require.ErrorIs(t, err, syscall.EDESTADDRREQ, "a Conn from Listen has no peer to Write to")
	require.ErrorContains(t, err, "WriteTo")
	_, err = c.JoinGroup(ctx, rxetest.Addr(t))
	require.ErrorIs(t, err, endpoint.ErrInvalid)
	require.ErrorIs(t, c.LeaveGroup("239.9.9.9"), endpoint.ErrInvalid)

	// Resolved once, a peer's address is cached, but not past Close.
	peer := listenDgram(t, ctx)
	_, err = c.Resolve(ctx, peer.LocalAddr().String())
	require.NoError(t, err)

	// Nobody listens on this port: resolution is refused.
	other := listenDgram(t, ctx)
	port := other.LocalAddr().(*dgram.Addr).Port
	require.NoError(t, other.Close())
	_, err = c.Resolve(ctx, net.JoinHostPort(rxetest.Addr(t), strconv.Itoa(port)))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)

	// IPv6 groups: the kernel's rdma_cm joins none over RoCE v2 (rxe).
	if _, err := c.JoinGroup(ctx, "ff0e::1234"); err != nil {
		require.ErrorIs(t, err, endpoint.ErrNotSupported)
	}

	// A deadline that passed fails reads at once; a later one lets them wait.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(-time.Second)))
	_, _, err = c.ReadFrom(make([]byte, 8))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.NoError(t, c.SetReadDeadline(time.Time{}))

	read := make(chan error, 1)
	go func() {
		_, _, err := c.ReadFrom(make([]byte, 8))
		read <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, c.Close())
	select {
	case err := <-read:
		require.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the reader")
	}
	require.NoError(t, c.Close())
	_, err = c.WriteTo([]byte("x"), c.LocalAddr())
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Resolve(ctx, "10.1.1.1:1")
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Resolve(ctx, peer.LocalAddr().String())
	require.ErrorIs(t, err, net.ErrClosed, "a cached answer too")
	_, err = c.JoinGroup(ctx, "239.1.1.1")
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, c.SetReadDeadline(time.Now()), net.ErrClosed)
}

// TestDatagramMulticastInProcess: two Conns join a group; what one sends
// to the group, the other receives with the sender's address, which it
// can answer once the sender writes to it alone; after LeaveGroup it no
// longer receives the group's.
func TestDatagramMulticastInProcess(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	a := listenDgram(t, ctx)
	if a == nil {
		return
	}
	b := listenDgram(t, ctx)
	const group = "239.7.7.7"
	ga, err := a.JoinGroup(ctx, group)
	require.NoError(t, err)
	require.Equal(t, uint32(0xFFFFFF), ga.QPN)
	again, err := a.JoinGroup(ctx, group)
	require.NoError(t, err)
	require.Same(t, ga, again)
	_, err = b.JoinGroup(ctx, group)
	require.NoError(t, err)
	from := sendDatagram(t, a, ga, b, "to the group")
	require.Equal(t, a.LocalAddr().(*dgram.Addr).QPN, from.(*dgram.Addr).QPN)

	// No address handle answers a group's sender (rdma-core does not look
	// a multicast GID up), and the group's datagram leaves no path behind
	// that would stand in the way of one sent to b alone.
	_, err = b.WriteTo([]byte("to the group's sender"), from)
	require.ErrorIs(t, err, dgram.ErrNoPath)
	toB, err := a.Resolve(ctx, b.LocalAddr().String())
	require.NoError(t, err)
	from = sendDatagram(t, a, toB, b, "to b alone")
	_, err = b.WriteTo([]byte("the answer"), from)
	require.NoError(t, err)
	require.NoError(t, a.SetReadDeadline(time.Now().Add(10*time.Second)))
	buf := make([]byte, 64)
	for {
		n, _, err := a.ReadFrom(buf)
		require.NoError(t, err)
		if string(buf[:n]) != "to the group" { // a is a member too
			require.Equal(t, "the answer", string(buf[:n]))
			break
		}
	}

	require.NoError(t, b.LeaveGroup(group))
	_, err = a.WriteTo([]byte("again"), ga)
	require.NoError(t, err)
	require.NoError(t, b.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, _, err = b.ReadFrom(make([]byte, 64))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a member that left still receives")
}
