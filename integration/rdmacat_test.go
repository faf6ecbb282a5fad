package integration

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/internal/rdmacat"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// TestRdmacat: the rdmacat command's code, both ends in this process. The
// dialer sends 8 MiB and asks for progress; the listener sends 100 KiB
// back; each side's standard output holds exactly the other's input, and
// both exit 0 after the half-closes. Bad usage exits 2, a dial to the closed listener's port 1.
func TestRdmacat(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	there, back := make([]byte, 8<<20), make([]byte, 100<<10)
	pattern(there, 1)
	pattern(back, 2)

	var listenerOut bytes.Buffer
	addr, listened, listenerLog := startRdmacatListener(t, ctx, nil, bytes.NewReader(back), &listenerOut)

	var dialerOut, dialerErr bytes.Buffer
	require.Equal(t, 0, rdmacat.Main(ctx, []string{"-p", addr}, bytes.NewReader(there), &dialerOut, &dialerErr),
		"dialer: %s", dialerErr.String())
	listenerCode := <-listened
	log := <-listenerLog // the listener's stderr, complete once it returned
	require.Equal(t, 0, listenerCode, "listener: %s", log)
	require.True(t, bytes.Equal(there, listenerOut.Bytes()), "listener got %d bytes of %d", listenerOut.Len(), len(there))
	require.True(t, bytes.Equal(back, dialerOut.Bytes()), "dialer got %d bytes of %d", dialerOut.Len(), len(back))
	require.Contains(t, dialerErr.String(), "rdmacat: sent 8.0 MiB")
	require.Contains(t, dialerErr.String(), "received 100.0 KiB")
	require.Contains(t, log, "rdmacat: connected: ")

	var out, errs bytes.Buffer
	require.Equal(t, 2, rdmacat.Main(ctx, nil, strings.NewReader(""), &out, &errs))
	require.Contains(t, errs.String(), "usage: rdmacat")
	errs.Reset()
	require.Equal(t, 1, rdmacat.Main(ctx, []string{addr}, strings.NewReader("x"), &out, &errs))
	require.Contains(t, errs.String(), "rdmacat: dial rdma")
	require.Zero(t, out.Len())
}

// startRdmacatListener runs rdmacat -v -l on the device, with flags
// before them, and returns the address it listens on (its first line on
// stderr), its exit status once it returns, and the rest of its stderr,
// complete once it returned.
func startRdmacatListener(t *testing.T, ctx context.Context, flags []string, stdin io.Reader, stdout io.Writer) (addr string, code <-chan int, log <-chan string) {
	t.Helper()
	errR, errW := io.Pipe()
	exited := make(chan int, 1)
	args := append(flags, "-v", "-l", net.JoinHostPort(rxetest.Addr(t), "0"))
	go func() {
		exited <- rdmacat.Main(ctx, args, stdin, stdout, errW)
		errW.Close()
	}()
	stderr := bufio.NewScanner(errR)
	require.True(t, stderr.Scan(), "the listener said nothing")
	addr, ok := strings.CutPrefix(stderr.Text(), "rdmacat: listening on ")
	require.True(t, ok, "first line: %q", stderr.Text())
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		for stderr.Scan() {
			b.WriteString(stderr.Text() + "\n")
		}
		rest <- b.String()
	}()
	return addr, exited, rest
}

// TestRdmacatStopsWhileItsInputIsIdle: after the peer's end of data,
// rdmacat still sends what its input gives (a half-closed connection
// carries this side's bytes) and exits 0 at the input's end. Told to stop
// (an interrupt) while its input gives nothing, it returns at once: a read
// of a terminal cannot be interrupted, so it must not wait for that read.
// It resets the connection, so the peer reads no end of data.
func TestRdmacatStopsWhileItsInputIsIdle(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	before := rxetest.CountResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	addr := l.Addr().String()
	peers := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			peers <- c
		}
	}()
	// run starts rdmacat dialing the listener with stdin and stdout pipes;
	// it returns once rdmacat passed on the peer's first bytes.
	type run struct {
		code   chan int
		errs   *bytes.Buffer
		stdin  *io.PipeWriter
		stdout *io.PipeReader
		peer   *rdmanet.Conn
	}
	start := func(ctx context.Context) run {
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		r := run{code: make(chan int, 1), errs: new(bytes.Buffer), stdin: inW, stdout: outR}
		t.Cleanup(func() { inW.Close(); outR.Close() })
		go func() { r.code <- rdmacat.Main(ctx, []string{addr}, inR, outW, r.errs) }()
		select {
		case c := <-peers:
			r.peer = c.(*rdmanet.Conn)
		case code := <-r.code:
			require.FailNow(t, "rdmacat did not connect", "exit %d: %s", code, r.errs)
		case <-ctx.Done():
			require.FailNow(t, "rdmacat did not connect", "%v", ctx.Err())
		}
		_, err := r.peer.Write([]byte("hello"))
		require.NoError(t, err)
		got := make([]byte, 5)
		_, err = io.ReadFull(outR, got)
		require.NoError(t, err)
		require.Equal(t, "hello", string(got))
		return r
	}

	r := start(ctx)
	require.NoError(t, r.peer.CloseWrite())
	_, err = r.stdin.Write([]byte("late"))
	require.NoError(t, err, "rdmacat stopped reading its input at the peer's end of data")
	require.NoError(t, r.stdin.Close())
	require.Equal(t, 0, <-r.code, "rdmacat: %s", r.errs)
	late, err := io.ReadAll(r.peer)
	require.NoError(t, err)
	require.Equal(t, "late", string(late))
	require.NoError(t, r.peer.Close())

	stopCtx, stop := context.WithCancel(ctx)
	r = start(stopCtx)
	stop()
	select {
	case code := <-r.code:
		require.Equal(t, 1, code)
		require.Contains(t, r.errs.String(), "rdmacat: context canceled")
	case <-time.After(10 * time.Second):
		require.Fail(t, "rdmacat waited for its idle input after it was told to stop")
	}
	require.NoError(t, r.peer.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadAll(r.peer)
	require.ErrorIs(t, err, syscall.ECONNRESET, "the peer of an interrupted rdmacat")
	require.NoError(t, r.peer.Close())
	require.NoError(t, l.Close())
	// The read of stdin rdmacat left holds a send buffer of the closed
	// connection, and so its registered memory, until the read returns.
	require.NoError(t, r.stdin.Close())
	requireLeftReadFreed(t, before)
}

// requireLeftReadFreed: once the read of stdin that rdmacat left behind
// has returned, the send buffer it held, and so its registered memory and
// protection domain, are freed, and the counts come back to before.
func requireLeftReadFreed(t *testing.T, before rxetest.Resources) {
	t.Helper()
	require.Eventually(t, func() bool {
		now := rxetest.CountResources(t)
		return now["mr"] == before["mr"] && now["pd"] == before["pd"]
	}, 10*time.Second, 50*time.Millisecond, "the memory rdmacat's left read held was not freed after the read returned")
}

// TestRdmacatReceiveOnly: with -d, rdmacat reads no standard input: its
// peer reads io.EOF at once, and rdmacat exits 0 when the peer's data
// ends, its output holding that data, though its input never ended.
func TestRdmacatReceiveOnly(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	stdin, neverWritten := io.Pipe()
	defer neverWritten.Close()
	var read atomic.Bool
	var out, errs bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- rdmacat.Main(ctx, []string{"-d", l.Addr().String()},
			readerFunc(func(p []byte) (int, error) { read.Store(true); return stdin.Read(p) }), &out, &errs)
	}()
	c, err := l.Accept()
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := c.Read(make([]byte, 1))
	require.Equal(t, 0, n)
	require.ErrorIs(t, err, io.EOF, "rdmacat -d did not half-close at once")
	data := make([]byte, 1<<20)
	pattern(data, 3)
	_, err = c.Write(data)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	select {
	case got := <-code:
		require.Equal(t, 0, got, "rdmacat: %s", errs.String())
	case <-time.After(10 * time.Second):
		require.FailNow(t, "rdmacat -d waited after its peer's end of data")
	}
	require.True(t, bytes.Equal(data, out.Bytes()), "got %d bytes of %d", out.Len(), len(data))
	require.False(t, read.Load(), "rdmacat -d read its standard input")
}

// readerFunc is an io.Reader made of a function.
type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestRdmacatStopsWhenItsOutputFails: a write to standard output that
// fails (a full disk) ends rdmacat at once with exit status 1, naming the
// error, though its input is idle. It resets the connection: the peer,
// still writing, gets an error matching ECONNRESET rather than waiting on
// a reader that is gone, and nothing is left registered.
func TestRdmacatStopsWhenItsOutputFails(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	before := rxetest.CountResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	stdin, idle := io.Pipe()
	defer idle.Close()
	const room = 1 << 20
	written := 0
	full := writerFunc(func(p []byte) (int, error) {
		n := min(len(p), room-written)
		written += n
		if n < len(p) {
			return n, &os.PathError{Op: "write", Path: "copy.iso", Err: syscall.ENOSPC}
		}
		return n, nil
	})
	data := make([]byte, 8<<20)
	pattern(data, 4)
	var errs bytes.Buffer
	code := make(chan int, 1)
	go func() { code <- rdmacat.Main(ctx, []string{l.Addr().String()}, stdin, full, &errs) }()
	c, err := l.Accept()
	require.NoError(t, err)
	defer c.Close()
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		wrote <- err
	}()
	select {
	case got := <-code:
		require.Equal(t, 1, got, "rdmacat: %s", errs.String())
	case <-time.After(10 * time.Second):
		require.FailNow(t, "rdmacat went on after its output failed")
	}
	require.Contains(t, errs.String(), "rdmacat: receiving: ")
	require.Contains(t, errs.String(), "no space left on device")
	require.Equal(t, room, written)
	select {
	case err := <-wrote:
		require.ErrorIs(t, err, syscall.ECONNRESET, "the peer wrote to an rdmacat that had stopped")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the peer's write waited on an rdmacat that had stopped")
	}
	require.NoError(t, c.Close())
	require.NoError(t, l.Close())
	require.NoError(t, idle.Close())
	requireLeftReadFreed(t, before)
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestRdmacatInputFailureFailsItsReceiver: when the sending rdmacat's
// input fails (a read error of the disk it copies from) after 1 MiB, the
// receiving rdmacat must not exit 0 with the part it got, as if that were
// the whole file: the sender exits 1 naming the read's error, and resets
// the connection, so the receiver exits 1 too.
func TestRdmacatInputFailureFailsItsReceiver(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	before := rxetest.CountResources(t)
	var receiverOut bytes.Buffer
	addr, received, receiverLog := startRdmacatListener(t, ctx, []string{"-d"}, strings.NewReader(""), &receiverOut)

	const good = 1 << 20
	data := make([]byte, good)
	pattern(data, 6)
	input := io.MultiReader(bytes.NewReader(data),
		readerFunc(func([]byte) (int, error) {
			return 0, &os.PathError{Op: "read", Path: "disk.iso", Err: syscall.EIO}
		}))
	var senderErr bytes.Buffer
	require.Equal(t, 1, rdmacat.Main(ctx, []string{addr}, input, io.Discard, &senderErr), "sender: %s", senderErr.String())
	require.Contains(t, senderErr.String(), "rdmacat: sending: ")
	require.Contains(t, senderErr.String(), "input/output error")
	select {
	case code := <-received:
		log := <-receiverLog
		require.Equal(t, 1, code, "the receiver took %d bytes of a failed sender's for the whole: %s", receiverOut.Len(), log)
		require.Contains(t, log, "connection reset by peer")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the receiver waited on after its sender had failed")
	}
	require.LessOrEqual(t, receiverOut.Len(), good)
	require.True(t, bytes.Equal(data[:receiverOut.Len()], receiverOut.Bytes()), "the bytes received are not the ones sent")
	requireLeftReadFreed(t, before)
}
