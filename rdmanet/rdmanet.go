// Package rdmanet is a byte stream over RDMA with Go's net shapes: a *Conn
// is a net.Conn and a *Listener a net.Listener, so net/http, net/rpc and
// gRPC ride RDMA unchanged, and so does crypto/tls on top of them
// (tls.NewListener, tls.Client): HTTPS and HTTP/2 over RDMA.
//
// A Conn is a msg connection underneath: writes travel as messages of up to
// 64 KiB, each Write its own while the reader keeps up and small ones
// combined while it does not (see Write); flow control is msg's credits (a
// slow reader never causes a receiver-not-ready); and Close says goodbye,
// so the peer's Read returns io.EOF after the last byte (CloseWrite does
// the same for one direction; after SetLinger(0), Close resets instead).
// A peer that crashed or reset gives an error instead: as on a TCP conn,
// it matches syscall.ECONNRESET (syscall.EPIPE for a write after the
// peer's Close, from the second on: see Write), and not net.ErrClosed,
// which only this side's Close gives.
//
// Deadlines follow net.Conn: a passed deadline fails pending and future
// calls with an error for which errors.Is(err, os.ErrDeadlineExceeded) and
// net.Error's Timeout() hold; a deadline moved into the future lets calls
// work again.
//
// Each Conn pins 4 MiB of registered memory: 32 receive buffers of 64 KiB,
// and as many for its sends. A server that holds many connections
// (net/http's kept-alive ones, say) lowers that on its Listener with
// WithMsgOptions(msg.WithBufferSize(n), msg.WithRecvDepth(d)): each of its
// Conns then pins d buffers of n bytes each way, whatever its clients use,
// and its writes, and its clients' writes to it, travel in messages of at
// most n - msg.HeaderSize bytes. Nothing else is registered for a peer:
// a Conn receives no message larger than its buffers (msg.WithMaxRecvSize),
// and a peer that offers one is cut off. An idle Conn sends a keepalive
// every 2 s each way (msg.WithKeepalive); a longer interval costs such a
// server less CPU, and notices a dead peer later.
package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/msg"
)

// The msg connection under a Conn: recvDepth receive buffers, each a
// header and chunk bytes, so a Write sends messages of up to 64 KiB (a
// 64 KiB Write, the common buffer size, is one message). The depth is
// half msg's default: buffers this large make each step of it cost a Conn
// 128 KiB of pinned memory (docs/DESIGN.md, "msg").
const (
	chunk      = 64 << 10
	bufferSize = msg.HeaderSize + chunk
	recvDepth  = 32
)

// Option configures Dial and Listen. A nil Option is ignored.
type Option func(*options)

// options is what the Options given to Dial or Listen say: the msg
// options they add after rdmanet's own.
type options struct {
	msg []msg.Option
}

// WithMsgOptions passes options to the msg connection underneath
// (keepalive, logger, connection options).
func WithMsgOptions(opts ...msg.Option) Option {
	return func(o *options) { o.msg = append(o.msg, opts...) }
}

// msgOptions is rdmanet's msg options, then those opts add.
func msgOptions(opts []Option) []msg.Option {
	o := options{msg: []msg.Option{msg.WithBufferSize(bufferSize), msg.WithRecvDepth(recvDepth),
		msg.WithMaxRecvSize(0), seam.StreamReader.(msg.Option)}}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o.msg
}

// Conn is a byte stream over one RDMA connection. It implements net.Conn;
// Read, Write, Close and the deadline setters are safe for concurrent use.
// Dial and a Listener's Accept make Conns: as with net's, the methods of a
// nil or zero Conn fail with syscall.EINVAL.
type Conn struct {
	c *msg.Conn

	// readMu makes Read and WriteTo take turns. bufMu guards the message
	// bytes are taken from; Close takes it, never readMu, which WriteTo
	// holds while its writer runs.
	readMu  sync.Mutex
	bufMu   sync.Mutex
	msg     *msg.Message // the message Read is taking bytes from: nil, or slot
	slot    msg.Message  // each message in turn, taken once the last is released
	rest    []byte       // its bytes not yet read
	readErr error        // the stream's end, once seen
	closed  bool         // Close released msg: a message taken out is released, not put back

	writeMu sync.Mutex
	// metGoodbye: a write met the peer's orderly close (firstAfterGoodbye);
	// writeMu's.
	metGoodbye bool

	readDeadline, writeDeadline deadline

	// shut: Close was called. Calls that would not otherwise touch the
	// connection (a Read or Write of nothing, the deadline setters) look
	// at it, to fail after Close as net's conns do.
	shut atomic.Bool
	// linger is SetLinger's sec: negative, the default, says goodbye
	// within msg's bound; 0 resets (msg's Abort); more waits that many
	// seconds for the bytes held to leave.
	linger atomic.Int64
}

var (
	_ net.Conn      = (*Conn)(nil)
	_ io.ReaderFrom = (*Conn)(nil) // io.Copy to a Conn
	_ io.WriterTo   = (*Conn)(nil) // io.Copy from a Conn
)

// Dial connects to an rdmanet Listener at addr, "host:port" of an
// RDMA-capable interface as cm.Dial takes it: each address of a name is
// tried in turn.
func Dial(ctx context.Context, addr string, opts ...Option) (*Conn, error) {
	c, err := msg.Dial(ctx, addr, msgOptions(opts)...)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rdma", Err: err}
	}
	return newConn(c), nil
}

func newConn(c *msg.Conn) *Conn {
	conn := &Conn{c: c}
	conn.linger.Store(-1)
	conn.readDeadline.init()
	conn.writeDeadline.init()
	return conn
}

// Read reads up to len(p) bytes of the stream. It returns io.EOF once the
// peer has closed and every byte it wrote was read.
func (c *Conn) Read(p []byte) (int, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if len(p) == 0 {
		return 0, c.closedError("read")
	}
	c.bufMu.Lock()
	defer c.bufMu.Unlock()
	if err := c.fill(); err != nil {
		return 0, err
	}
	n := copy(p, c.rest)
	c.rest = c.rest[n:]
	return n, nil
}

// WriteTo writes the stream to w until the peer's end of data, straight
// from the receive buffers: io.Copy from a Conn calls it, and the bytes
// pass through no buffer of io.Copy's. It returns the bytes written and
// nil at the end of data, or the first error of w or of the reading, which
// fails as Read does (deadlines included). Bytes w did not take stay in the
// stream for the next Read or WriteTo.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	var written int64
	for {
		c.bufMu.Lock()
		if err := c.fill(); err != nil {
			c.bufMu.Unlock()
			if err == io.EOF {
				return written, nil
			}
			return written, err
		}
		// The message is this call's while w runs, without bufMu: a
		// writer that blocks must not hold up Close.
		m, b := c.msg, c.rest
		c.msg, c.rest = nil, nil
		c.bufMu.Unlock()
		n, err := w.Write(b)
		if n < 0 || n > len(b) { // a broken Writer: the bytes stay, as io.Copy treats it
			n = 0
			err = errors.Join(err, errInvalidWrite)
		}
		written += int64(n)
		if err == nil && n < len(b) {
			err = io.ErrShortWrite
		}
		c.bufMu.Lock()
		if c.closed {
			m.Release() // what is left goes with the connection
		} else {
			c.msg, c.rest = m, b[n:]
		}
		c.bufMu.Unlock()
		if err != nil {
			return written, err
		}
	}
}

// errInvalidWrite is a Writer's count outside 0 to what it was given.
var errInvalidWrite = errors.New("rdmanet: the writer returned an invalid count")

// fill makes sure the stream has bytes at hand (c.rest), taking the next
// message once the last is used up. It fails once the read deadline has
// passed, as net's reads do even with bytes waiting, returns io.EOF at the
// end of data, and the read's error as Read returns it. bufMu is held.
func (c *Conn) fill() error {
	if _, err := c.begin(&c.readDeadline, "read"); err != nil {
		return err
	}
	for len(c.rest) == 0 {
		if c.msg != nil {
			c.msg.Release()
			c.msg = nil
		}
		if c.readErr != nil {
			return c.readErr
		}
		ctx := c.readDeadline.context()
		if err := seam.ReadStream(c.c, ctx, &c.slot); err != nil {
			if err == io.EOF {
				c.readErr = io.EOF
				return io.EOF
			}
			return c.opError("read", err, ctx)
		}
		c.msg, c.rest = &c.slot, c.slot.Payload
	}
	return nil
}

// Write writes p to the stream, in messages of up to 64 KiB (less where
// either side asked for smaller buffers: WithMsgOptions). It returns
// once every byte is posted, or held to go with the peer's next credits:
// while the reader keeps up, each Write leaves at once; when it is behind
// (half the peer's receives or more hold messages it has not read), Writes
// are combined into one message, up to 64 KiB, which leaves as soon as the
// peer gives receives back, and only a Write that finds that message full
// waits. Close sends what is held before it closes, within its linger
// (SetLinger).
//
// Once the peer has closed in order, the first Write the closed connection
// refuses is accepted and its bytes dropped, and later ones fail with
// syscall.EPIPE: a TCP conn accepts the write that meets the peer's close,
// and learns of it only from the reset that comes back. Code written for
// TCP relies on it: a goodbye written at close (TLS's close_notify,
// HTTP/2's GOAWAY) to a peer that closed first returns no error.
func (c *Conn) Write(p []byte) (int, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if len(p) == 0 {
		return 0, c.closedError("write")
	}
	written := 0
	most := min(chunk, c.c.MaxInline()) // either side's buffers may be smaller than chunk
	for written < len(p) {
		n := min(len(p)-written, most)
		ctx, err := c.begin(&c.writeDeadline, "write")
		if err != nil {
			return written, err
		}
		if err := seam.WriteStream(c.c, ctx, p[written:written+n]); err != nil {
			err = c.opError("write", err, ctx)
			if c.firstAfterGoodbye(err) {
				return len(p), nil
			}
			return written, err
		}
		written += n
	}
	return written, nil
}

// ReadFrom writes r's bytes to the stream until r returns io.EOF: io.Copy
// to a Conn calls it, and r reads straight into the connection's
// registered send buffers, so the bytes pass through no buffer of
// io.Copy's. It returns the bytes sent and nil at r's io.EOF, r's other
// errors, or the first error of the writing, which fails as Write does
// (the write deadline is looked at before each Read of r, and bounds the
// wait for a buffer or a credit, not r). Writes wait while it runs. Close
// does not wait for a Read of r that blocks; the bytes that Read returns
// afterwards are dropped with the connection.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if !c.ok() {
		return 0, syscall.EINVAL
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	var sent int64
	for {
		ctx, err := c.begin(&c.writeDeadline, "readfrom")
		if err != nil {
			return sent, err
		}
		var n int
		var rerr error
		err = seam.FillStream(c.c, ctx, func(p []byte) int {
			n, rerr = r.Read(p)
			if n < 0 || n > len(p) { // a broken Reader: nothing of this read is sent
				n, rerr = 0, errors.Join(rerr, errInvalidRead)
			}
			return n
		})
		if err != nil {
			err = c.opError("readfrom", err, ctx)
			c.firstAfterGoodbye(err) // reported here: later Writes fail too
			return sent, err
		}
		sent += int64(n)
		switch {
		case rerr == io.EOF:
			return sent, nil
		case rerr != nil:
			return sent, rerr
		}
	}
}

// firstAfterGoodbye says whether err, a write's, is the first refusal of
// one because the peer closed in order (syscall.EPIPE), and records that
// one was met (see Write). writeMu is held.
func (c *Conn) firstAfterGoodbye(err error) bool {
	if c.metGoodbye || !errors.Is(err, syscall.EPIPE) {
		return false
	}
	c.metGoodbye = true
	return true
}

// errInvalidRead is a Reader's count outside 0 to the room it was given.
var errInvalidRead = errors.New("rdmanet: the reader returned an invalid count")

// Close closes the connection: the peer reads what was written, then
// io.EOF (SetLinger says how long Close waits for a slow reader, and how
// to reset instead). Blocked Reads and Writes return an error matching
// net.ErrClosed, as do every later call but Close. Idempotent.
func (c *Conn) Close() error {
	if !c.ok() {
		return syscall.EINVAL
	}
	c.shut.Store(true)
	var err error
	switch linger := c.linger.Load(); {
	case linger == 0:
		err = c.c.Abort()
	case linger > 0:
		// The bytes held for the peer's credits and the goodbye leave
		// within the linger; if it runs out, they are dropped, as TCP
		// drops them.
		err = seam.CloseWithin(c.c, time.Duration(linger)*time.Second)
	default:
		err = c.c.Close()
	}
	// A blocked Read has returned, and left bufMu.
	c.readDeadline.stop()
	c.writeDeadline.stop()
	// The message Read was taking bytes from holds registered memory;
	// WriteTo releases the one its writer has, once the writer returns.
	c.bufMu.Lock()
	c.closed = true
	if c.msg != nil {
		c.msg.Release()
		c.msg, c.rest = nil, nil
	}
	c.bufMu.Unlock()
	if err != nil {
		return &net.OpError{Op: "close", Net: "rdma", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return nil
}

// SetLinger sets how Close ends the connection, as *net.TCPConn's does.
// Close says goodbye after what was written, so that the peer reads it
// all, then io.EOF; the bytes that wait for the peer to free receives
// (it reads slowly) must leave first. With sec < 0, the default, Close
// waits at most a second for the peer's credits they and the goodbye
// need, and at most five seconds in all for the devices to carry them;
// with sec > 0, at most sec seconds in all. If they have not left by
// then, or with sec == 0 at once, Close drops what is not yet sent and
// resets the connection: the peer's
// calls fail with an error matching syscall.ECONNRESET, never io.EOF, so
// that a peer reading a stream this side cut short (its source failed)
// cannot take it for the whole one.
func (c *Conn) SetLinger(sec int) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	if err := c.closedError("set"); err != nil {
		return err
	}
	c.linger.Store(min(int64(sec), maxLinger))
	return nil
}

// maxLinger is the longest linger, in seconds, that a time.Duration holds.
const maxLinger = int64(math.MaxInt64 / time.Second)

// CloseWrite shuts down the writing side, as *net.TCPConn's does: the peer
// reads every byte written before it, then io.EOF, while this side reads on.
// Later Writes fail with an error matching msg.ErrWriteClosed. Close still
// has to be called. After the peer's own Close it returns nil, as TCP's
// shutdown does then (see Write); on a connection that ended otherwise it
// fails as Write does.
func (c *Conn) CloseWrite() error {
	if !c.ok() {
		return syscall.EINVAL
	}
	if err := c.c.CloseWrite(); err != nil {
		if err = c.opError("close", err, context.Background()); errors.Is(err, syscall.EPIPE) {
			return nil
		}
		return err
	}
	return nil
}

// Stats is a snapshot of the connection's counters (messages, credits,
// posts, doorbells, completions); safe to call at any time, also after
// Close.
func (c *Conn) Stats() msg.Stats {
	if !c.ok() {
		return msg.Stats{}
	}
	return c.c.Stats()
}

// LocalAddr is this side's address.
func (c *Conn) LocalAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.c.LocalAddr()
}

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.c.RemoteAddr()
}

// ok says whether c was made by Dial or Accept. As with net's conns, the
// methods of a nil or zero Conn fail with syscall.EINVAL (the addresses
// are nil, Stats zero) rather than panic.
func (c *Conn) ok() bool { return c != nil && c.c != nil }

// SetDeadline sets the read and write deadlines. After Close it fails
// with an error matching net.ErrClosed.
func (c *Conn) SetDeadline(t time.Time) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	if err := c.closedError("set"); err != nil {
		return err
	}
	c.readDeadline.set(t)
	c.writeDeadline.set(t)
	return nil
}

// SetReadDeadline sets the deadline for pending and future Reads; the zero
// time means none. After Close it fails as SetDeadline does.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	if err := c.closedError("set"); err != nil {
		return err
	}
	c.readDeadline.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for pending and future Writes; the
// zero time means none. After Close it fails as SetDeadline does.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	if err := c.closedError("set"); err != nil {
		return err
	}
	c.writeDeadline.set(t)
	return nil
}

// closedError is op's error once Close was called (nil before): a
// *net.OpError matching net.ErrClosed, as a closed TCP conn's does.
func (c *Conn) closedError(op string) error {
	if !c.shut.Load() {
		return nil
	}
	return &net.OpError{Op: op, Net: "rdma", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: seam.ErrClosedHere}
}

// begin is the context of a step of op that d's deadline bounds; once the
// deadline has passed, the step fails before it starts, as net's calls do
// even with bytes waiting.
func (c *Conn) begin(d *deadline, op string) (context.Context, error) {
	ctx := d.context()
	if ctx.Err() != nil {
		return nil, c.opError(op, ctx.Err(), ctx)
	}
	return ctx, nil
}

// opError wraps err, the error of a call that waited on ctx, in a
// *net.OpError. ctx is a deadline's, which ends only when the deadline
// passes: then the error is os.ErrDeadlineExceeded (a Timeout). The end of
// the connection gives an error matching net.ErrClosed once this side
// closed it (whoever ended it first, as net's conns do), and a
// peerEndedError before.
func (c *Conn) opError(op string, err error, ctx context.Context) error {
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		err = os.ErrDeadlineExceeded
	case errors.Is(err, msg.ErrClosed) && c.shut.Load():
		err = seam.ErrClosedHere
	case errors.Is(err, msg.ErrClosed):
		err = newPeerEndedError(err)
	}
	return &net.OpError{Op: op, Net: "rdma", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// peerEndedError is a call's error on a Conn that the peer or the link
// ended while this side had not closed it. It matches the errno a TCP
// conn gives then (syscall.EPIPE after the peer's orderly Close,
// syscall.ECONNRESET otherwise) and what its cause matches
// (msg.ErrPeerClosed, msg.ErrPeerSilent, cm.ErrPeerDisconnected, a
// *endpoint.CompletionError, msg.ErrClosed), which is never net.ErrClosed:
// net keeps that for a conn this side closed, and code that ignores it
// after its own Close would take a crash for one.
type peerEndedError struct {
	errno syscall.Errno
	cause error
}

func newPeerEndedError(cause error) *peerEndedError {
	if errors.Is(cause, msg.ErrPeerClosed) {
		return &peerEndedError{errno: syscall.EPIPE, cause: cause}
	}
	return &peerEndedError{errno: syscall.ECONNRESET, cause: cause}
}

// Error is the errno's text, then the cause's without the "closed" of
// msg.ErrClosed it ends with, which says nothing the errno does not.
func (e *peerEndedError) Error() string {
	return e.errno.Error() + ": " + strings.TrimSuffix(e.cause.Error(), ": "+msg.ErrClosed.Error())
}

// Is matches the errno; errors.Is goes on to the cause (Unwrap).
func (e *peerEndedError) Is(target error) bool { return target == e.errno }

// Unwrap is the cause.
func (e *peerEndedError) Unwrap() error { return e.cause }

// Listener accepts rdmanet connections. It implements net.Listener.
type Listener struct {
	l        *msg.Listener
	ctx      context.Context // ends with Close: Accept's
	cancel   context.CancelFunc
	deadline deadline // Accept's (SetDeadline)
}

var _ net.Listener = (*Listener)(nil)

// Listen listens for rdmanet connections on addr, "host:port" as
// cm.Listen takes it: a wildcard host listens on the RDMA-capable
// addresses cm.Listen names, and a loopback address is refused.
func Listen(ctx context.Context, addr string, opts ...Option) (*Listener, error) {
	l, err := msg.Listen(ctx, addr, msgOptions(opts)...)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "rdma", Err: err}
	}
	lctx, cancel := context.WithCancel(context.Background())
	ln := &Listener{l: l, ctx: lctx, cancel: cancel}
	ln.deadline.init()
	return ln, nil
}

// Accept waits for the next connection; after Close it returns an error
// matching net.ErrClosed. A connection that fails while it is set up, on
// the dialer's account or this side's device's, does not reach it (as
// msg.Listener.Accept says), so that a server's accept loop (net/http's,
// gRPC's) does not end on it. A listener whose device is removed can take
// no more connections: Accept returns an error matching
// cm.ErrDeviceRemoved, which ends such a loop.
func (l *Listener) Accept() (net.Conn, error) {
	if !l.ok() {
		return nil, syscall.EINVAL
	}
	passed := l.deadline.context()
	if l.ctx.Err() != nil || passed.Err() != nil {
		return nil, l.acceptError(nil, passed)
	}
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	defer context.AfterFunc(passed, cancel)()
	c, err := l.l.Accept(ctx)
	if err != nil {
		return nil, l.acceptError(err, passed)
	}
	return newConn(c), nil
}

// acceptError is Accept's error err, or, once the listener is closed or
// the deadline (whose context is passed) has passed, the error that says
// so, in a *net.OpError.
func (l *Listener) acceptError(err error, passed context.Context) error {
	switch {
	case l.ctx.Err() != nil:
		err = errListenerClosed
	case passed.Err() != nil:
		err = os.ErrDeadlineExceeded
	}
	return &net.OpError{Op: "accept", Net: "rdma", Addr: l.Addr(), Err: err}
}

// errListenerClosed is a Listener's calls' error after Close.
var errListenerClosed = fmt.Errorf("rdmanet: listener closed: %w", net.ErrClosed)

// SetDeadline sets the deadline for pending and future Accepts, as
// *net.TCPListener's does: once it has passed, Accept fails with an error
// for which errors.Is(err, os.ErrDeadlineExceeded) and net.Error's
// Timeout() hold, even with a connection waiting; the zero time means
// none. After Close it fails with an error matching net.ErrClosed.
func (l *Listener) SetDeadline(t time.Time) error {
	if !l.ok() {
		return syscall.EINVAL
	}
	if l.ctx.Err() != nil {
		return &net.OpError{Op: "set", Net: "rdma", Addr: l.Addr(), Err: errListenerClosed}
	}
	l.deadline.set(t)
	return nil
}

// Close stops listening; a blocked Accept returns. Connections set up that
// Accept had not taken are closed (their dialers read io.EOF), after the
// handshakes in progress are given up to a second to finish. Accepted
// connections are not affected.
func (l *Listener) Close() error {
	if !l.ok() {
		return syscall.EINVAL
	}
	l.cancel()
	l.deadline.stop()
	return l.l.Close()
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr {
	if !l.ok() {
		return nil
	}
	return l.l.Addr()
}

// ok says whether l was made by Listen; as Conn's methods do, those of a
// nil or zero Listener fail with syscall.EINVAL (Addr is nil).
func (l *Listener) ok() bool { return l != nil && l.l != nil }

// Dialer dials rdmanet connections with fixed options. Its DialContext has
// the shape of net/http's Transport.DialContext (and net.Dialer's), so code
// written for TCP switches transport with one line. (gRPC's
// WithContextDialer takes a function of ctx and addr: wrap Dial in one.)
// The zero Dialer, and a nil one, dial with no options.
type Dialer struct {
	Options []Option
}

// DialContext dials addr over RDMA, as Dial does. network is "tcp" or
// "rdma" (any address of a name), or, as net's Dial takes them, "tcp4" or
// "tcp6" (only its IPv4 or IPv6 addresses; an address of the other family
// is refused with a *net.AddrError before anything is dialed).
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var opts []Option
	if d != nil { // a nil Dialer dials as the zero one does
		opts = d.Options
	}
	switch network {
	case "tcp", "rdma":
	case "tcp4", "tcp6":
		family := func(o *options) { o.msg = append(o.msg, msg.WithCMOptions(seam.WithFamily(network).(cm.Option))) }
		opts = append(opts[:len(opts):len(opts)], family)
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
	}
	return Dial(ctx, addr, opts...)
}
