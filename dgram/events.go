package dgram

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/lookup"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// eventLoop is the Conn's goroutine on its CM event channel. It answers
// the peers that resolve this Conn (a SIDR request, accepted with the
// Conn's QP number) and hands every other event to the Resolve or
// JoinGroup call waiting on that id. Every event is acked here, after its
// data was copied out.
type eventLoop struct {
	mu      sync.Mutex
	waiters map[uintptr]chan *verbs.Event
	ended   bool           // the loop stopped: no id may wait any more
	failure error          // why it stopped, when the channel's read failed (not Close)
	users   sync.WaitGroup // Resolve and JoinGroup calls with an id on the channel
	done    chan struct{}
}

func (l *eventLoop) start(c *Conn) {
	l.waiters = make(map[uintptr]chan *verbs.Event)
	l.done = make(chan struct{})
	go l.run(c)
}

func (l *eventLoop) run(c *Conn) {
	defer close(l.done)
	for {
		ev, err := c.ch.Next(context.Background())
		if err != nil {
			var failure error
			if !c.closed.Load() {
				c.log.Error().Err(err).Msg("dgram: reading CM events; the Conn no longer resolves or answers peers")
				failure = fmt.Errorf("reading CM events: %w", err)
			}
			l.end(failure)
			return
		}
		if ev.Type == verbs.EventDeviceRemoval {
			// Every id of the Conn is on the one device.
			ev.Ack()
			c.fail(cm.ErrDeviceRemoved)
			l.end(cm.ErrDeviceRemoved) // Resolve and JoinGroup fail with it
			continue
		}
		if ev.Type == verbs.EventConnectRequest {
			c.answer(ev)
			continue
		}
		l.mu.Lock()
		if w := l.waiters[ev.ID.Key()]; w != nil {
			select {
			case w <- ev:
			default: // a step's waiter takes one event; an extra one is dropped
			}
		}
		l.mu.Unlock()
		ev.Ack()
	}
}

// end wakes every waiter: the loop is gone, because of failure (nil:
// Close stopped it), or can resolve no more (the device was removed).
func (l *eventLoop) end(failure error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended, l.failure = true, failure
	for k, w := range l.waiters {
		close(w)
		delete(l.waiters, k)
	}
}

// stop ends the loop and waits for every Resolve and JoinGroup in
// progress to let go of its id.
func (l *eventLoop) stop(c *Conn) {
	c.ch.StopWaiting()
	<-l.done
	l.users.Wait()
}

// register makes id's events come to the returned channel until
// unregister.
func (l *eventLoop) register(id *verbs.CMID) (chan *verbs.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil, l.endError()
	}
	w := make(chan *verbs.Event, 1)
	l.waiters[id.Key()] = w
	l.users.Add(1)
	return w, nil
}

func (l *eventLoop) unregister(id *verbs.CMID) {
	l.mu.Lock()
	delete(l.waiters, id.Key())
	l.mu.Unlock()
	l.users.Done()
}

// answer accepts a peer's SIDR request with this Conn's QP number, then
// lets its id go: a datagram peer needs nothing more of it.
func (c *Conn) answer(ev *verbs.Event) {
	err := ev.ID.Accept(verbs.ConnParam{QPNum: c.local.QPN})
	if err != nil {
		c.log.Warn().Err(err).Msg("dgram: answering a peer's resolution")
	}
	ev.Ack()
	ev.ID.Destroy()
}

// endError is what a step that needs the ended loop fails with: the
// channel's failure, or net.ErrClosed after Close. mu is held, or the
// loop has ended (end wrote failure before it woke the waiters).
func (l *eventLoop) endError() error {
	if l.failure != nil {
		return l.failure
	}
	return net.ErrClosed
}

// expect waits for the event that ends one step on an id (w, from
// register).
func (l *eventLoop) expect(ctx context.Context, w chan *verbs.Event, want verbs.EventType, step string) (*verbs.Event, error) {
	select {
	case ev, ok := <-w:
		if !ok {
			return nil, fmt.Errorf("dgram: %s: %w", step, l.endError())
		}
		if ev.Type != want {
			return nil, eventError(ev, step)
		}
		return ev, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("dgram: %s: %w", step, ctx.Err())
	}
}

// eventError is the error a failure event stands for.
func eventError(ev *verbs.Event, step string) error {
	switch ev.Type {
	case verbs.EventUnreachable, verbs.EventRejected:
		if ev.Status > 0 { // a SIDR reply's status: 1 is "no such service"
			return fmt.Errorf("dgram: %s: nobody answers on that port (SIDR status %d): %w", step, ev.Status, syscall.ECONNREFUSED)
		}
		fallthrough
	case verbs.EventAddrError, verbs.EventRouteError, verbs.EventConnectError, verbs.EventMulticastError:
		errno := syscall.EHOSTUNREACH
		if ev.Status < 0 {
			errno = syscall.Errno(-ev.Status)
		}
		return fmt.Errorf("dgram: %s: %v: %w", step, ev.Type, errno)
	}
	return fmt.Errorf("dgram: %s: unexpected event %v (status %d)", step, ev.Type, ev.Status)
}

// withID runs steps on a new UDP-port-space id whose events come here,
// and destroys the id after unless keep says otherwise.
func (c *Conn) withID(steps func(id *verbs.CMID, w chan *verbs.Event) (keep bool, err error)) error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if err := c.failed(); err != nil {
		return err
	}
	id, err := verbs.CreateID(c.ch.EC, verbs.PortSpaceUDP)
	if err != nil {
		return err
	}
	w, err := c.events.register(id)
	if err != nil {
		id.Destroy()
		return err
	}
	keep, err := steps(id, w)
	c.events.unregister(id)
	if !keep {
		id.Destroy()
	}
	return err
}

// Resolve finds the datagram queue pair that listens on addr ("host:port":
// a Conn's Listen address, or librdmacm's udaddy server; or an Addr's
// String, whose queue pair number it resolves again) by rdma_cm's
// service ID resolution, makes the address handle to it, and returns its
// address for WriteTo. Answers are cached: resolving addr again costs
// nothing. ctx bounds the resolution. A name is looked up with net's
// resolver and its first address of the Conn's own family taken: the
// queue pair reaches no other. A port nobody listens on gives an error
// matching syscall.ECONNREFUSED.
func (c *Conn) Resolve(ctx context.Context, addr string) (*Addr, error) {
	if !c.ok() {
		return nil, syscall.EINVAL
	}
	fail := func(err error) (*Addr, error) {
		return nil, &net.OpError{Op: "resolve", Net: Network, Source: c.local, Err: fmt.Errorf("%s: %w", addr, err)}
	}
	if c.closed.Load() { // an answer cached before is no use after Close
		return fail(net.ErrClosed)
	}
	if a := c.paths.peer(addr); a != nil {
		return a, nil
	}
	host, port, err := splitHostPort(addr)
	if err != nil {
		return fail(err)
	}
	if host, err = lookup.OfFamily(ctx, host, c.local.IP); err != nil {
		return fail(err)
	}
	ai, err := verbs.GetAddrInfo(host, port, false, verbs.PortSpaceUDP)
	if err != nil {
		return fail(err)
	}
	defer ai.Free()
	var a *Addr
	err = c.withID(func(id *verbs.CMID, w chan *verbs.Event) (bool, error) {
		if err := id.ResolveAddrFrom(c.local.IP, ai, resolveMs(ctx)); err != nil {
			return false, err
		}
		if _, err := c.events.expect(ctx, w, verbs.EventAddrResolved, "resolving the address"); err != nil {
			return false, err
		}
		if err := id.ResolveRoute(resolveMs(ctx)); err != nil {
			return false, err
		}
		if _, err := c.events.expect(ctx, w, verbs.EventRouteResolved, "resolving the route"); err != nil {
			return false, err
		}
		if err := id.Connect(verbs.ConnParam{QPNum: c.local.QPN}); err != nil {
			return false, err
		}
		ev, err := c.events.expect(ctx, w, verbs.EventEstablished, "resolving the service")
		if err != nil {
			return false, err
		}
		ah, err := c.pd.PD().CreateAH(ev.UD)
		if err != nil {
			return false, err
		}
		a = &Addr{IP: ipOf(id.RemoteAddr()), Port: portOf(port), QPN: ev.UD.QPNum, QKey: ev.UD.QKey}
		c.paths.addPeer(addr, a, ah)
		return false, nil
	})
	if err != nil {
		return fail(err)
	}
	return a, nil
}

// JoinGroup joins the multicast group (an IPv4 or IPv6 multicast address)
// and returns its address: WriteTo sends to every member, and this Conn's
// reads return what members send to it (on some devices, its own
// datagrams too). Joining a group already joined returns its address
// again. ctx bounds the join. The kernel's rdma_cm joins no IPv6 group
// over RoCE v2 (Soft-RoCE among them): that is refused with an error
// matching endpoint.ErrNotSupported.
func (c *Conn) JoinGroup(ctx context.Context, groupAddr string) (*Addr, error) {
	if !c.ok() {
		return nil, syscall.EINVAL
	}
	fail := func(err error) (*Addr, error) {
		return nil, &net.OpError{Op: "join", Net: Network, Source: c.local, Err: fmt.Errorf("%s: %w", groupAddr, err)}
	}
	ip := net.ParseIP(groupAddr)
	if ip == nil || !ip.IsMulticast() {
		return fail(fmt.Errorf("%w: not a multicast IP address", endpoint.ErrInvalid))
	}
	if g := c.paths.joined(keyOf(ip)); g != nil {
		return g.addr, nil
	}
	src, err := joinSource(c.local.IP, ip)
	if err != nil {
		return fail(err)
	}
	var g *group
	err = c.withID(func(id *verbs.CMID, w chan *verbs.Event) (bool, error) {
		if err := id.BindIP(src, 0); err != nil {
			return false, err
		}
		if err := id.JoinMulticast(ip); err != nil {
			if errors.Is(err, errENOTSUPP) {
				err = fmt.Errorf("%w: %w (the kernel's rdma_cm joins no IPv6 group over RoCE v2)", endpoint.ErrNotSupported, err)
			}
			return false, err
		}
		ev, err := c.events.expect(ctx, w, verbs.EventMulticastJoin, "joining")
		if err != nil {
			id.LeaveMulticast(ip)
			return false, err
		}
		if err := c.id.AttachMulticast(ev.UD); err != nil {
			id.LeaveMulticast(ip)
			return false, err
		}
		ah, err := c.pd.PD().CreateAH(ev.UD)
		if err != nil {
			c.id.DetachMulticast(ev.UD)
			id.LeaveMulticast(ip)
			return false, err
		}
		g = &group{id: id, ud: ev.UD, ip: ip, addr: &Addr{IP: ip, QPN: ev.UD.QPNum, QKey: ev.UD.QKey}}
		c.paths.addGroup(g, ah)
		return true, nil
	})
	if err != nil {
		return fail(err)
	}
	return g.addr, nil
}

// errENOTSUPP is the kernel's ENOTSUPP (524), which Go's syscall package
// does not name: rdma_join_multicast's answer for what the transport
// cannot join.
const errENOTSUPP = syscall.Errno(524)

// joinSource is the local address a join of group binds to: the Conn's
// own, or, for a group of the other IP family, an address of that family
// on the same interface (the kernel joins a group only from its family).
func joinSource(local, group net.IP) (net.IP, error) {
	if (local.To4() != nil) == (group.To4() != nil) {
		return local, nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, ifi := range ifs {
		addrs, _ := ifi.Addrs()
		var other net.IP
		has := false
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			has = has || ipn.IP.Equal(local)
			if (ipn.IP.To4() != nil) == (group.To4() != nil) && !ipn.IP.IsLinkLocalUnicast() && other == nil {
				other = ipn.IP
			}
		}
		if has && other != nil {
			return other, nil
		}
	}
	return nil, fmt.Errorf("%w: joining %s needs an address of its IP family on the interface of %s", endpoint.ErrInvalid, group, local)
}

// LeaveGroup leaves a group joined with JoinGroup: this Conn no longer
// receives its datagrams, and its address handle is freed once no send in
// flight uses it.
func (c *Conn) LeaveGroup(groupAddr string) error {
	if !c.ok() {
		return syscall.EINVAL
	}
	ip := net.ParseIP(groupAddr)
	if ip == nil {
		return &net.OpError{Op: "leave", Net: Network, Source: c.local, Err: fmt.Errorf("%s: %w: not an IP address", groupAddr, endpoint.ErrInvalid)}
	}
	c.sendMu.Lock()
	if c.closed.Load() {
		c.sendMu.Unlock()
		return &net.OpError{Op: "leave", Net: Network, Source: c.local, Err: net.ErrClosed}
	}
	c.tx.reclaim(c.send.cq)
	g := c.paths.removeGroup(keyOf(ip), c.tx.done.Load())
	c.sendMu.Unlock()
	if g == nil {
		return &net.OpError{Op: "leave", Net: Network, Source: c.local, Err: fmt.Errorf("%s: %w: not joined", groupAddr, endpoint.ErrInvalid)}
	}
	if err := g.leave(c.id); err != nil {
		return &net.OpError{Op: "leave", Net: Network, Source: c.local, Err: err}
	}
	return nil
}
