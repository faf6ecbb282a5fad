// Package dgram sends and receives datagrams over RDMA: unreliable
// datagram (UD) queue pairs in rdma_cm's UDP port space, found through the
// same connection manager as reliable connections, and multicast groups.
//
// A *Conn is one UD queue pair bound to a local address and port. It
// implements net.PacketConn (and, from Dial, net.Conn): ReadFrom returns
// each datagram with its sender, WriteTo sends to an *Addr from Resolve
// (rdma_cm's service ID resolution: host:port to queue pair and Q_Key),
// from ReadFrom, or from JoinGroup. ReadBatch and WriteBatch move many
// datagrams per call and per doorbell, with immediate data if asked.
//
// When to use datagrams: many peers talking to one queue pair (a reliable
// connection costs a queue pair per peer), small messages, and multicast.
// What is not guaranteed, as with UDP: a datagram may be lost (a receiver
// whose receive buffers are all full drops what arrives, and no sender is
// told), duplicated by nobody but not retried by anybody either, and
// datagrams from different senders arrive in any order. A datagram is at
// most the path MTU (MTU); larger ones are refused before anything is
// sent. On one link, a sender's datagrams to one receiver arrive in order.
// iWARP has no datagram queue pairs: Listen and Dial refuse it with an
// error matching endpoint.ErrNotSupported.
//
// Memory and completions follow the endpoint package's rules: datagrams
// are copied into and out of registered memory the Conn owns, which the
// device owns from a post until its completion; Close destroys the queue
// pair before it frees that memory. A Conn starts one goroutine, which
// reads its CM events (resolution replies, requests from peers that
// resolve it, multicast joins), and Close stops it. Readers and writers
// wait for completions themselves, on Go's netpoller: a datagram wakes
// the reader that waits for it, and nobody else.
package dgram

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/asyncevent"
	"github.com/go-rdma/rdmacm/internal/cmevent"
	"github.com/go-rdma/rdmacm/internal/fdwait"
	"github.com/go-rdma/rdmacm/internal/lookup"
	"github.com/go-rdma/rdmacm/internal/seam"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Errors callers match with errors.Is.
var (
	// ErrMessageTooLarge: a datagram longer than the path MTU. It matches
	// syscall.EMSGSIZE, as a UDP socket's error does.
	ErrMessageTooLarge = fmt.Errorf("dgram: datagram larger than the path MTU: %w", syscall.EMSGSIZE)
	// ErrNoPath: WriteTo an address this Conn has no address handle for.
	ErrNoPath = errors.New("dgram: no path to the address: Resolve it, JoinGroup it, or receive a datagram from it first")
	// ErrNoIWARP: the device is iWARP, which has no datagram queue pairs.
	ErrNoIWARP = fmt.Errorf("%w: iWARP has no unreliable datagram queue pairs", endpoint.ErrNotSupported)
)

// Conn is an unreliable datagram queue pair bound to a local address. Its
// methods are safe for concurrent use. Listen and Dial make Conns: as with
// net's, the methods of a nil or zero Conn fail with syscall.EINVAL.
// Once its RDMA device is removed, or reports that the Conn's queues
// failed, its reads (after the datagrams already received), writes,
// Resolves and JoinGroups fail with an error matching cm.ErrDeviceRemoved
// or endpoint.ErrDeviceFailure, those waiting too; it still needs its
// Close.
type Conn struct {
	log   zerolog.Logger
	ch    *cmevent.Channel
	id    *verbs.CMID // bound and listening; it holds the QP
	vctx  *verbs.Context
	port  int // the device port
	pd    *seam.Domain
	local *Addr
	peer  *Addr // Dial's peer, or nil
	mtu   int

	recv   queue
	send   queue
	recvMu sync.Mutex // readers: recv's polling and receive state
	rx     receiver
	sendMu sync.Mutex // writers: send's polling and send state
	tx     sender
	paths  pathCache

	events    eventLoop
	stats     counters
	failure   atomic.Pointer[error] // why the device serves the Conn no more: fail
	unwatch   func()                // stops deviceEvent
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// queue is one direction's completion queue, its channel and the wait on
// it. The mutex of its direction guards it.
type queue struct {
	ch      *verbs.CompChannel
	cq      *verbs.CQ
	wait    *fdwait.Waiter
	unacked int
	takeErr error // the channel's read failed (takeEvent)
	// deadline is the direction's deadline in Unix ns (0: none), also set
	// on wait: a call checks it before it waits.
	deadline atomic.Int64
}

func (q *queue) setDeadline(t time.Time) error {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	q.deadline.Store(ns)
	return q.wait.SetDeadline(t)
}

// Listen binds a datagram queue pair to addr ("host:port"; the host an IP
// address or name of an RDMA device's interface, not a wildcard; port 0
// picks one) and answers the peers that Resolve it. A name is looked up
// with net's resolver, under ctx, and its IPv4 address taken if it has
// one, as net's ListenUDP takes it.
func Listen(ctx context.Context, addr string, opts ...Option) (*Conn, error) {
	fail := func(err error) (*Conn, error) { return nil, &net.OpError{Op: "listen", Net: Network, Err: err} }
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	o, err := newOptions(opts)
	if err != nil {
		return fail(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fail(err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return fail(fmt.Errorf("dgram: listen on %q: a datagram queue pair lives on one device: give the address of an RDMA device's interface, not a wildcard", addr))
	}
	if host, err = lookup.PreferIPv4(ctx, host); err != nil {
		return fail(err)
	}
	c, err := listen(host, port, o)
	if err != nil {
		return fail(err)
	}
	return c, nil
}

// Dial binds a datagram queue pair to the local address that routes to
// addr ("host:port", where a Conn or librdmacm's udaddy listens, or that
// Conn's LocalAddr().String()), resolves addr, and returns a Conn whose
// Write sends to it and whose Read returns only its datagrams. ctx bounds
// the resolution. Of a name's addresses, as net's DialUDP, the IPv4 one is
// taken if it has one.
func Dial(ctx context.Context, addr string, opts ...Option) (*Conn, error) {
	fail := func(err error) (*Conn, error) { return nil, &net.OpError{Op: "dial", Net: Network, Err: err} }
	o, err := newOptions(opts)
	if err != nil {
		return fail(err)
	}
	local, err := localIPFor(ctx, addr)
	if err != nil {
		return fail(err)
	}
	c, err := listen(local.String(), "0", o)
	if err != nil {
		return fail(err)
	}
	if c.peer, err = c.Resolve(ctx, addr); err != nil {
		c.Close()
		return fail(err)
	}
	return c, nil
}

// localIPFor resolves addr's route (rdma_resolve_addr) only to learn the
// local address, and so the device, that reaches it.
func localIPFor(ctx context.Context, addr string) (net.IP, error) {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host, err = lookup.PreferIPv4(ctx, host); err != nil {
		return nil, err
	}
	ai, err := verbs.GetAddrInfo(host, port, false, verbs.PortSpaceUDP)
	if err != nil {
		return nil, err
	}
	defer ai.Free()
	ch, err := cmevent.New()
	if err != nil {
		return nil, err
	}
	defer ch.Destroy()
	id, err := verbs.CreateID(ch.EC, verbs.PortSpaceUDP)
	if err != nil {
		return nil, err
	}
	defer id.Destroy()
	if err := id.ResolveAddr(ai, resolveMs(ctx)); err != nil {
		return nil, err
	}
	ev, err := ch.Next(ctx)
	if err != nil {
		return nil, fmt.Errorf("dgram: resolving %s: %w", addr, err)
	}
	defer ev.Ack()
	if ev.Type != verbs.EventAddrResolved {
		return nil, eventError(ev, "resolving "+addr)
	}
	return ipOf(id.LocalAddr()), nil
}

func ipOf(a net.Addr) net.IP {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP
	}
	return nil
}

// listen makes the Conn: the id bound to host:port, its device's PD, the
// two CQs, the UD QP, the receive buffers posted, then rdma_listen and the
// event goroutine.
//
// Its result is unnamed: a failure returns nil for it before the deferred
// undo runs, and the undo steps use the Conn.
func listen(host, port string, o options) (_ *Conn, err error) {
	ai, err := verbs.GetAddrInfo(host, port, true, verbs.PortSpaceUDP)
	if err != nil {
		return nil, err
	}
	defer ai.Free()
	c := &Conn{log: o.logger}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if c.id, err = verbs.CreateEP(ai); err != nil {
		return nil, err
	}
	undo = append(undo, c.id.DestroyEP)
	if c.vctx = c.id.Context(); c.vctx == nil {
		if c.id.OnLoopback() {
			// Dial comes here too for a peer that routes through
			// loopback, 0.0.0.0 say.
			return nil, fmt.Errorf("dgram: %s is a loopback address, which no RDMA device has: use the address of an RDMA-capable interface", host)
		}
		return nil, fmt.Errorf("dgram: %s is on no RDMA device: %w", host, verbs.ErrNoDevice)
	}
	dev, err := c.vctx.QueryDevice()
	if err != nil {
		return nil, err
	}
	if dev.IWARP {
		return nil, ErrNoIWARP
	}
	if err := checkLimits(o, dev); err != nil {
		return nil, err
	}
	c.port = c.id.PortNum()
	if c.mtu, err = c.vctx.ActiveMTU(c.port); err != nil {
		return nil, err
	}
	if c.ch, err = cmevent.New(); err != nil {
		return nil, err
	}
	// The id, once it may be on ch, goes before ch, as in Close:
	// rdma_destroy_id tells the kernel through the id's channel, and
	// fails without freeing librdmacm's hold on the device (and its PD)
	// if that channel is gone.
	undo[len(undo)-1] = func() { c.id.DestroyEP(); c.ch.Destroy() }
	if err = c.id.Migrate(c.ch.EC); err != nil {
		return nil, err
	}
	if c.pd, err = seam.NewDomain(c.vctx); err != nil {
		return nil, err
	}
	undo = append(undo, func() { c.pd.Release() })
	for _, q := range []struct {
		q    *queue
		n    int
		name string
	}{{&c.send, o.sendDepth, "send completion channel"}, {&c.recv, o.recvDepth, "receive completion channel"}} {
		if err = q.q.open(c.vctx, q.n, q.name); err != nil {
			return nil, err
		}
		undo = append(undo, q.q.close)
	}
	caps, err := c.id.CreateQP(c.pd.PD(), verbs.QPInit{UD: true, SendCQ: c.send.cq, RecvCQ: c.recv.cq,
		MaxSendWR: o.sendDepth, MaxRecvWR: o.recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { c.id.DestroyQP() })
	if c.unwatch, err = asyncevent.Watch(c.vctx, c.deviceEvent, c.log); err != nil {
		return nil, err
	}
	undo = append(undo, c.unwatch)
	qkey, err := c.id.QKey()
	if err != nil {
		return nil, err
	}
	la, ok := c.id.LocalAddr().(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("dgram: the id bound to %s has no IP address", host)
	}
	c.local = &Addr{IP: la.IP, Port: la.Port, QPN: c.id.QPNum(), QKey: qkey}
	pd := seam.WrapPD(c.pd).(*bufpool.PD)
	if err = c.rx.init(pd, o.recvDepth, c.mtu+verbs.GRHSize); err != nil {
		return nil, err
	}
	undo = append(undo, c.rx.release)
	if err = c.tx.init(pd, o.sendDepth, c.mtu, caps.MaxInline); err != nil {
		return nil, err
	}
	undo = append(undo, c.tx.release)
	c.tx.whyFailed = func(err error) error { return seam.WhileLocalFault(c.vctx, c.port, la, err) }
	c.paths.init(o.peers, func(s *verbs.Sender) (*verbs.AH, error) { return c.pd.PD().AHTo(c.port, s) })
	undo = append(undo, c.paths.free)
	if err = c.rx.postAll(c.id); err != nil {
		return nil, err
	}
	if err = c.id.Listen(16); err != nil {
		return nil, err
	}
	c.events.start(c)
	return c, nil
}

// checkLimits refuses, naming the option, queue depths the device cannot
// hold, in its queues or in the CQ each queue has to itself (an entry per
// request), rather than leave them to fail in ibv_create_cq or
// rdma_create_qp as a bare EINVAL.
func checkLimits(o options, dev verbs.DeviceAttr) error {
	for _, q := range []struct {
		depth int
		opt   string
	}{{o.sendDepth, "dgram.WithSendDepth"}, {o.recvDepth, "dgram.WithRecvDepth"}} {
		switch {
		case q.depth > dev.MaxQPWR:
			return fmt.Errorf("%w: queue depth %d exceeds the device's %d (%s)", endpoint.ErrInvalid, q.depth, dev.MaxQPWR, q.opt)
		case q.depth > dev.MaxCQE:
			return fmt.Errorf("%w: a queue depth of %d needs a completion queue of as many entries; the device's hold at most %d (%s)", endpoint.ErrInvalid, q.depth, dev.MaxCQE, q.opt)
		}
	}
	return nil
}

func (q *queue) open(vctx *verbs.Context, n int, name string) (err error) {
	if q.ch, err = vctx.NewCompChannel(); err != nil {
		return err
	}
	if q.cq, err = vctx.NewCQ(n, q.ch, 64); err != nil {
		q.ch.Destroy()
		return err
	}
	if q.wait, err = fdwait.New(q.ch.Fd(), name, q.takeEvent); err != nil {
		q.cq.Destroy()
		q.ch.Destroy()
	}
	return err
}

// takeEvent is the non-blocking read of the completion channel that
// fdwait calls; the event is acked in batches (and at close). A read that
// fails ends the wait too, and await returns its error: waiting on would
// not wake again for the event the read left (the netpoller reports a
// descriptor once each time it becomes readable). The caller of await
// holds its direction's mutex, which guards takeErr.
func (q *queue) takeEvent() bool {
	switch err := q.ch.GetEvent(); err {
	case syscall.EAGAIN:
		return false
	case nil:
		q.unacked++
		if q.unacked >= 64 {
			q.cq.AckEvents(q.unacked)
			q.unacked = 0
		}
	default:
		q.takeErr = err
	}
	return true
}

// await arms the CQ and, unless poll then finds a completion, waits for
// the channel's next event. It returns the wait's error: os.ErrDeadlineExceeded
// after the direction's deadline, os.ErrClosed after Close, or the
// channel's failure; the completions stay in the CQ for the next call.
func (q *queue) await(poll func() (int, error)) (int, error) {
	if err := q.cq.ReqNotify(false); err != nil {
		return 0, err
	}
	// A completion that came before the arm raises no event: look again.
	if n, err := poll(); n > 0 || err != nil {
		return n, err
	}
	if err := q.wait.Wait(); err != nil {
		return 0, err
	}
	err := q.takeErr
	q.takeErr = nil
	return 0, err
}

func (q *queue) close() {
	q.wait.Close()
	q.cq.AckEvents(q.unacked)
	q.unacked = 0
	q.cq.Destroy()
	q.ch.Destroy()
}

// LocalAddr is the bound address, with the port and the queue pair's
// number and Q_Key: what a peer reaches this Conn at.
func (c *Conn) LocalAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.local
}

// RemoteAddr is Dial's peer, or nil for a Conn from Listen.
func (c *Conn) RemoteAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	if c.peer == nil {
		return nil
	}
	return c.peer
}

// MTU is the largest datagram, in bytes, this Conn sends or receives: the
// port's active path MTU.
func (c *Conn) MTU() int {
	if !c.ok() {
		return 0
	}
	return c.mtu
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// SetReadDeadline makes ReadFrom, Read and ReadBatch, waiting or to come,
// fail with an error matching os.ErrDeadlineExceeded once t passes (the
// zero time: never). A later deadline lets them work again.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	if c.closed.Load() {
		return c.opError("set", net.ErrClosed)
	}
	return c.recv.setDeadline(t)
}

// SetWriteDeadline bounds how long a write waits for a free send slot.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	if c.closed.Load() {
		return c.opError("set", net.ErrClosed)
	}
	return c.send.setDeadline(t)
}

func (c *Conn) opError(op string, err error) error {
	if err == nil {
		return nil
	}
	return &net.OpError{Op: op, Net: Network, Source: c.local, Err: err}
}

// waitError is a wait's error as callers see it: ErrClosed after Close,
// the failure once the device serves the Conn no more.
func (c *Conn) waitError(err error) error {
	if c.closed.Load() || errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	if failure := c.failed(); failure != nil {
		return failure
	}
	return err
}

// failed is why the device serves the Conn no more (nil while it does):
// an error matching cm.ErrDeviceRemoved, or endpoint.ErrDeviceFailure.
func (c *Conn) failed() error {
	if p := c.failure.Load(); p != nil {
		return *p
	}
	return nil
}

// fail makes the Conn's reads (once the datagrams already received are
// read), writes, Resolves and JoinGroups fail with err, and wakes those
// waiting: no completion will come to wake them. The first failure holds.
// The Conn still needs its Close.
func (c *Conn) fail(err error) {
	if !c.failure.CompareAndSwap(nil, &err) {
		return
	}
	c.log.Error().Err(err).Msg("dgram: the Conn sends and receives no more")
	past := time.Unix(1, 0)
	c.recv.wait.SetDeadline(past)
	c.send.wait.SetDeadline(past)
}

// deviceEvent is what an asynchronous event of the device does to the
// Conn (package asyncevent calls it for every event of the device): a
// failure of its QP, of one of its CQs (an overrun lost completions, and
// with them the receive and send slots they held) or of the device fails
// the Conn; a port's state is logged.
func (c *Conn) deviceEvent(ev verbs.AsyncEvent) {
	switch {
	case ev.Type.EndsQP() && ev.Element == c.id.QPKey(),
		ev.Type == verbs.AsyncCQErr && (ev.Element == c.recv.cq.Key() || ev.Element == c.send.cq.Key()),
		ev.Type == verbs.AsyncDeviceFatal:
		c.fail(fmt.Errorf("%w (%s: %v)", endpoint.ErrDeviceFailure, c.vctx.Name(), ev.Type))
	default:
		asyncevent.LogPort(c.log, ev, c.port, c.vctx)
	}
}

// ok says whether c was made by Listen or Dial. As with net's conns,
// the methods of a nil or zero Conn fail with syscall.EINVAL (addresses
// nil, MTU and Stats zero) instead of panicking.
func (c *Conn) ok() bool { return c != nil && c.id != nil }

// Close stops the event goroutine, wakes every reader and writer (their
// calls fail with an error matching net.ErrClosed), waits (at most a
// second) for the datagrams already written to leave, leaves every group,
// then destroys the queue pair before it frees the memory the device used, the
// address handles, the CQs, the PD and the id. Idempotent: every call
// returns the first one's result.
func (c *Conn) Close() error {
	if !c.ok() {
		return syscall.EINVAL
	}
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.events.stop(c)
		c.recv.wait.Close()
		c.send.wait.Close()
		c.recvMu.Lock()
		c.sendMu.Lock()
		defer c.sendMu.Unlock()
		defer c.recvMu.Unlock()
		c.tx.drain(c.send.cq, closeDrain)
		c.unwatch()
		errs := []error{c.paths.leaveAll(c.id)}
		errs = append(errs, c.id.DestroyQP()) // the device stops here: what follows is no longer its
		c.paths.free()
		c.rx.release()
		c.tx.release()
		c.send.close()
		c.recv.close()
		errs = append(errs, c.pd.Release())
		c.id.DestroyEP()
		c.ch.Destroy()
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// closeDrain bounds how long Close waits for datagrams already written to
// leave: the device sends them at once unless it is broken.
const closeDrain = time.Second

// resolveMs is a resolution step's timeout: what is left of ctx, at most
// 5 s (rdma_cm's usual bound).
func resolveMs(ctx context.Context) int { return cmevent.ResolveTimeout(ctx, 5*time.Second) }

// portOf parses a port number.
func portOf(s string) int {
	p, _ := strconv.Atoi(s)
	return p
}
