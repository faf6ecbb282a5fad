// Package cm sets up RDMA connections the way librdmacm's rdma_cm does, with
// Go's net shapes: Listen/Accept and Dial with a context, each connection an
// *endpoint.Endpoint. The process's listeners and connections share one CM
// event channel, read by one goroutine on Go's netpoller that hands each
// event to its connection; every event is acked.
//
// Each call takes the options that mean something there, and only those:
//
//	Option           the connection (queues, polling, timers, logging, PD): Dial, Listen, Accept
//	HandshakeOption  one handshake (private data, setup): Dial, Accept
//	DialOption       Option, HandshakeOption, WithResolveTimeout
//	ListenOption     Option, WithBacklog, WithSharedReceiveQueue
//	AcceptOption     Option, HandshakeOption
//
// Options given to Listen are the defaults of every connection it accepts;
// those given to Accept are added to them. An invalid value is refused with
// an error matching endpoint.ErrInvalid before anything is created.
package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/cmevent"
	"github.com/go-rdma/rdmacm/internal/lookup"
	"github.com/go-rdma/rdmacm/internal/verbs"
)

// Dial connects to addr ("host:port"; host a name, an IPv4 or an IPv6
// address) and returns the connected endpoint. A name is looked up with
// net's resolver, and, as net's Dial does, each of its addresses is tried
// in turn until one connects; when ctx has a deadline, each try gets a
// share of what is left. ctx bounds the lookup, address and route
// resolution and the connection handshake. A peer that rejects, or a port
// nobody listens on, gives an error matching syscall.ECONNREFUSED (a
// *RejectError carrying the peer's private data); a peer that gives the
// handshake up after answering, one matching syscall.ECONNRESET; a peer
// whose CM never answers, one matching syscall.ETIMEDOUT once the kernel
// CM's retries are spent, which takes over a minute: give ctx a deadline
// to give up sooner, as with net's Dial. Where every address fails, the
// first one's error is returned. An error after the route was resolved
// names the local address the connect came from ("cm: dial host:port
// from ip:port: ..."): its port is rdma_cm's pick.
func Dial(ctx context.Context, addr string, opts ...DialOption) (*endpoint.Endpoint, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	o, err := newDialOptions(opts)
	if err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	hosts, err := lookup.Hosts(ctx, host)
	if err == nil {
		hosts, err = lookup.OfNetwork(hosts, o.conn.family, host)
	}
	if err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	var first error
	for i, h := range hosts {
		tryCtx, cancel := tryContext(ctx, len(hosts)-i)
		ep, local, err := dialHost(tryCtx, h, port, o)
		cancel()
		if err == nil {
			return ep, nil
		}
		if first == nil {
			from := ""
			if local != nil { // the local port is rdma_cm's pick, and may be part of why
				from = " from " + local.String()
			}
			first = fmt.Errorf("cm: dial %s%s: %w%s", addr, from, err, hint(h, err))
		}
		if ctx.Err() != nil || i == len(hosts)-1 {
			break
		}
		o.conn.logger.Debug().Err(err).Str("address", h).Msg("dial: trying the name's next address")
	}
	return nil, first
}

// tryContext bounds one of left tries by its share of what is left of ctx's
// deadline, as net's Dialer shares it among a name's addresses: an equal
// part, but at least minTry, or all that is left.
func tryContext(ctx context.Context, left int) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok || left <= 1 {
		return ctx, func() {}
	}
	remaining := time.Until(deadline)
	return context.WithTimeout(ctx, max(remaining/time.Duration(left), min(remaining, minTry)))
}

// minTry is the least share of a dial's time one address gets while others
// wait to be tried.
const minTry = 2 * time.Second

// dialHost dials one address (an IP address, or empty). With an error it
// returns the local address the connect came from, or nil if it failed
// before it had one.
func dialHost(ctx context.Context, host, port string, o dialOptions) (*endpoint.Endpoint, net.Addr, error) {
	ai, err := verbs.GetAddrInfo(host, port, false, verbs.PortSpaceTCP)
	if err != nil {
		return nil, nil, err
	}
	defer ai.Free()
	for attempt := 1; ; attempt++ {
		ep, local, err := dialOnce(ctx, ai, o)
		if err == nil || !errors.Is(err, errLocalPortInUse) || attempt == localPortAttempts || ctx.Err() != nil {
			return ep, local, err
		}
		o.conn.logger.Debug().Err(err).Int("attempt", attempt).Msg("dial: again from another local port")
	}
}

// errLocalPortInUse marks an iWARP connect the kernel refused before any
// packet left (connect's EADDRNOTAVAIL): rdma_cm bound the id to a local
// port that already has a TCP connection to the same address, one still
// open or closing (TIME_WAIT is reused when both ends used timestamps).
// The port was rdma_cm's pick, not the caller's, and nothing was set up,
// so Dial tries again from a new id, which rdma_cm binds to another port:
// what the kernel's own connect does when it picks an ephemeral port.
var errLocalPortInUse = errors.New("the local port rdma_cm picked already has a TCP connection to that address")

// localPortAttempts bounds Dial's tries from fresh local ports.
const localPortAttempts = 4

// dialOnce dials from a new id on a queue of its own.
func dialOnce(ctx context.Context, ai *verbs.AddrInfo, o dialOptions) (*endpoint.Endpoint, net.Addr, error) {
	q, err := cmevent.NewQueue()
	if err != nil {
		return nil, nil, err
	}
	id, err := q.CreateID(verbs.PortSpaceTCP)
	if err != nil {
		q.Close(nil)
		return nil, nil, err
	}
	return dialOn(ctx, id, q, ai, o)
}

// hint says what to do about a dial error a newcomer would not understand.
// host is the address dialed (a name's address, such as localhost's).
func hint(host string, err error) string {
	if !errors.Is(err, syscall.ENODEV) && !errors.Is(err, syscall.EINVAL) {
		return ""
	}
	ip := net.ParseIP(host)
	switch {
	case host == "" || ip != nil && ip.IsUnspecified():
		return " (an unspecified address names no interface: dial the address of an RDMA-capable interface)"
	case ip != nil && ip.IsLoopback():
		return " (a loopback address has no RDMA device: dial the address of an RDMA-capable interface)"
	}
	return ""
}

// dialOn runs resolve addr, resolve route, create QP, connect on id. On
// failure it frees everything it was given, and returns with the error
// the local address the route chose (rdma_cm picked its port), or nil if
// it failed before setting the connection up.
func dialOn(ctx context.Context, id *verbs.CMID, q *cmevent.Queue, ai *verbs.AddrInfo, o dialOptions) (*endpoint.Endpoint, net.Addr, error) {
	fail := func(err error) (*endpoint.Endpoint, net.Addr, error) {
		q.Close(id.Destroy)
		return nil, nil, err
	}
	timeout := cmevent.ResolveTimeout(ctx, o.resolveTimeout)
	if err := id.ResolveAddr(ai, timeout); err != nil {
		return fail(err)
	}
	ev, err := expect(ctx, q, verbs.EventAddrResolved, "resolving the address")
	if err != nil {
		return fail(err)
	}
	ev.Ack()
	if err := id.ResolveRoute(cmevent.ResolveTimeout(ctx, o.resolveTimeout)); err != nil {
		return fail(err)
	}
	if ev, err = expect(ctx, q, verbs.EventRouteResolved, "resolving the route"); err != nil {
		return fail(err)
	}
	ev.Ack()

	c := newConn(id, q, o.conn.logger)
	cfg := o.conn.ep
	cfg.LocalAddr, cfg.RemoteAddr = id.LocalAddr(), id.RemoteAddr()
	ep, err := c.start(cfg)
	if err != nil {
		return fail(err)
	}
	// From here on, ep.Close frees everything (QP, CQ, then c.close).
	dev, err := id.Context().QueryDevice()
	if err == nil {
		err = c.prepare(ep, o.conn, o.hs)
	}
	if err == nil {
		resp, init := o.conn.readDepths(dev)
		param := verbs.ConnParam{PrivateData: o.hs.privateData,
			ResponderResources: resp, InitiatorDepth: init,
			RetryCount: o.conn.retryCount, RNRRetryCount: o.conn.rnrRetryCount}
		if !dev.IWARP {
			err = id.Connect(param)
		} else {
			var abandoned bool
			if abandoned, err = connectBlocking(ctx, id, param, func() { ep.CloseAndDrain(nil) }); abandoned {
				return nil, nil, err // the connection is freed when the kernel gives up
			}
			if errors.Is(err, syscall.EADDRNOTAVAIL) {
				err = fmt.Errorf("%w: %w", errLocalPortInUse, err)
			}
		}
	}
	var reply []byte
	if err == nil {
		reply, err = c.waitEstablished(ctx, nil)
	}
	if err != nil {
		ep.CloseAndDrain(nil) // puts back what WithSetup posted
		return nil, cfg.LocalAddr, err
	}
	c.ctl.Established(reply)
	setRNRTimer(id, o.conn.rnrTimer, c.log)
	return ep, cfg.LocalAddr, nil
}

// connectBlocking calls rdma_connect where it blocks: on iWARP the kernel
// makes the TCP connection inside that call, for as long as TCP tries
// (about two minutes for a host that never answers). It runs in a goroutine
// of its own so that Dial returns when ctx ends; if ctx ends first, that
// goroutine calls abandon, which frees the connection, once the kernel
// returns, and connectBlocking reports abandoned with ctx's error. (On
// InfiniBand and RoCE, rdma_connect only sends the request.)
func connectBlocking(ctx context.Context, id *verbs.CMID, param verbs.ConnParam, abandon func()) (abandoned bool, err error) {
	done := make(chan error, 1)
	go func() { done <- id.Connect(param) }()
	select {
	case err := <-done:
		return false, err
	case <-ctx.Done():
		go func() {
			<-done
			abandon()
		}()
		return true, ctx.Err()
	}
}
