//go:build rdmacm_faultinject

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/verbs"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// errRefusedCreation is the failure verbs.FailCreate injects: a device out
// of memory, or past a limit, refusing one object.
var errRefusedCreation = errors.New("injected: the device refused to create it")

// creation names one device object a constructor makes: the first of its
// kind after skip others of that kind (the constructor's, or its peer's
// in this process before it).
type creation struct {
	kind verbs.Resource
	skip int
}

func (c creation) String() string { return fmt.Sprintf("%s #%d", c.kind, c.skip+1) }

// creations are the first n creations of kind.
func creations(kind verbs.Resource, n int) []creation {
	cs := make([]creation, n)
	for i := range cs {
		cs[i] = creation{kind, i}
	}
	return cs
}

// steps are cs, each after skip more of its kind (a peer's, made first).
func steps(skip int, cs []creation) []creation {
	shifted := make([]creation, len(cs))
	for i, c := range cs {
		shifted[i] = creation{c.kind, c.skip + skip}
	}
	return shifted
}

// requireEachCreationRefused runs attempt once for each creation in cs,
// with that one refused (verbs.FailCreate), and requires that the refusal
// fired (attempt makes that object), that attempt failed with it, and
// that the device and the process are then as they were before attempt.
// attempt's own set-up and cleanup are its own; it must undo what
// succeeds. Last, with nothing refused, attempt must succeed.
func requireEachCreationRefused(t *testing.T, cs []creation, attempt func(t *testing.T) error) {
	t.Helper()
	for _, c := range cs {
		t.Run(c.String(), func(t *testing.T) {
			before := currentDeviceState(t)
			fired := refuse(t, c)
			err := attempt(t)
			verbs.FailCreate(0, 0, nil)
			fired()
			require.ErrorIs(t, err, errRefusedCreation)
			require.Equal(t, before, currentDeviceState(t), "what the failed attempt made is still there")
		})
	}
	require.NoError(t, attempt(t), "with nothing refused")
}

// refuse arms the refusal of the creation c until the test ends, and
// returns the check that it fired.
func refuse(t *testing.T, c creation) (fired func()) {
	t.Helper()
	t.Cleanup(disarmDeviceFaults)
	before := verbs.Injected()
	verbs.FailCreate(c.kind, c.skip, errRefusedCreation)
	return func() {
		t.Helper()
		require.Equal(t, before+1, verbs.Injected(), "the refused %s was never created", c)
	}
}

// TestInjectedCreationFailuresInDgram: dgram.Listen, Dial and Resolve, each
// with one of the device objects it makes refused in turn, fail with the
// refusal (in a *net.OpError from Listen and Dial) and free what they
// made before it. A reply to a sender learnt from its datagram whose
// address handle is refused fails, and the next reply makes it. A
// JoinGroup whose id or handle is refused fails, leaving the group; the
// next one joins it. The Conns made before still exchange datagrams.
func TestInjectedCreationFailuresInDgram(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	if listenDgram(t, ctx) == nil {
		return // iWARP: the typed refusal is listenDgram's
	}
	bound := net.JoinHostPort(rxetest.Addr(t), "0")
	var listenSteps []creation
	for _, k := range []verbs.Resource{verbs.CMIDs, verbs.EventChannels, verbs.PDs} {
		listenSteps = append(listenSteps, creation{k, 0})
	}
	listenSteps = append(listenSteps, creations(verbs.CompChannels, 2)...)
	listenSteps = append(listenSteps, creations(verbs.CQs, 2)...)
	listenSteps = append(listenSteps, creation{verbs.QPs, 0})
	listenSteps = append(listenSteps, creations(verbs.MRs, 2)...)
	closeOnSuccess := func(t *testing.T, c *dgram.Conn, err error) error {
		if err != nil {
			var op *net.OpError
			require.ErrorAs(t, err, &op)
			return err
		}
		return c.Close()
	}
	t.Run("Listen", func(t *testing.T) {
		requireEachCreationRefused(t, listenSteps, func(t *testing.T) error {
			c, err := dgram.Listen(ctx, bound)
			return closeOnSuccess(t, c, err)
		})
	})

	srv := listenDgram(t, ctx)
	t.Run("Dial", func(t *testing.T) {
		// Dial learns its local address with an id of its own, then
		// listens there, then resolves its peer with another.
		steps := []creation{{verbs.EventChannels, 0}, {verbs.CMIDs, 0}}
		for _, s := range listenSteps {
			if s.kind == verbs.EventChannels || s.kind == verbs.CMIDs {
				s.skip++
			}
			steps = append(steps, s)
		}
		steps = append(steps, creation{verbs.CMIDs, 2}, creation{verbs.AHs, 0})
		requireEachCreationRefused(t, steps, func(t *testing.T) error {
			c, err := dgram.Dial(ctx, srv.LocalAddr().String())
			return closeOnSuccess(t, c, err)
		})
	})

	cli, other := listenDgram(t, ctx), listenDgram(t, ctx)
	t.Run("Resolve", func(t *testing.T) {
		requireEachCreationRefused(t, []creation{{verbs.CMIDs, 0}, {verbs.AHs, 0}}, func(t *testing.T) error {
			_, err := cli.Resolve(ctx, other.LocalAddr().String())
			return err
		})
	})
	t.Run("ReplyToALearntSender", func(t *testing.T) {
		// The first reply to a sender learnt from its datagram makes
		// the address handle; one refused is made again on the next.
		to, err := other.Resolve(ctx, srv.LocalAddr().String())
		require.NoError(t, err)
		src := sendDatagram(t, other, to, srv, "from a new sender")
		sent := srv.Stats().DatagramsSent
		fired := refuse(t, creation{verbs.AHs, 0})
		_, err = srv.WriteTo([]byte("refused"), src)
		fired()
		require.ErrorIs(t, err, errRefusedCreation)
		require.Equal(t, sent, srv.Stats().DatagramsSent, "the refused reply counts as sent")
		_, err = srv.WriteTo([]byte("answered"), src)
		require.NoError(t, err)
		requireReceivedExactly(t, other, "answered")
	})
	t.Run("JoinGroup", func(t *testing.T) {
		const group = "239.7.7.8"
		requireEachCreationRefused(t, []creation{{verbs.CMIDs, 0}, {verbs.AHs, 0}}, func(t *testing.T) error {
			if _, err := cli.JoinGroup(ctx, group); err != nil {
				return err
			}
			return cli.LeaveGroup(group)
		})
		ga, err := cli.JoinGroup(ctx, group)
		require.NoError(t, err)
		_, err = other.JoinGroup(ctx, group)
		require.NoError(t, err)
		sendDatagram(t, cli, ga, other, "to the group, once joined")
		require.NoError(t, cli.LeaveGroup(group))
		require.NoError(t, other.LeaveGroup(group))
	})
	sendDatagram(t, cli, srv.LocalAddr(), srv, "after the refusals")
}

// acceptOne takes l's next request and accepts it with opts, in the
// background. The caller closes what it accepted once its Dial has
// returned: on iWARP, closing an accepted endpoint that soon can fail the
// Dial (cm's Request.Accept).
func acceptOne(ctx context.Context, l *cm.Listener, opts ...cm.AcceptOption) <-chan acceptance {
	done := make(chan acceptance, 1)
	go func() {
		req, err := l.AcceptRequest(ctx)
		if err != nil {
			done <- acceptance{nil, err}
			return
		}
		ep, err := req.Accept(ctx, opts...)
		done <- acceptance{ep, err}
	}()
	return done
}

// TestInjectedCreationFailuresInCM: a cm listen, dial and accept, each
// with one of the device objects it makes refused in turn, fail with the
// refusal and free what they made before it. The dialer of a refused accept is
// rejected, and the listener accepts the next one; a Listener.Accept that
// met the refusal warns its logger and goes on to that next one. A
// listener whose shared receive queue is refused fails to listen, and
// frees its ids.
func TestInjectedCreationFailuresInCM(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	t.Run("Listen", func(t *testing.T) {
		// The first id of the process opens its shared CM event
		// channel; a refused one is opened by the next.
		requireEachCreationRefused(t, []creation{{verbs.CMIDs, 0}, {verbs.EventChannels, 0}}, func(t *testing.T) error {
			l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
			if err != nil {
				return err
			}
			return l.Close()
		})
	})
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	endpointSteps := []creation{{verbs.PDs, 0}, {verbs.CompChannels, 0}, {verbs.CQs, 0}, {verbs.QPs, 0}}

	accept := func(ctx context.Context) <-chan acceptance { return acceptOne(ctx, l) }
	connected := func(t *testing.T, dialed *endpoint.Endpoint, a acceptance) {
		require.NoError(t, a.err)
		closeAndDrain(t, dialed)
		closeAndDrain(t, a.ep)
	}

	t.Run("Dial", func(t *testing.T) {
		steps := append([]creation{{verbs.CMIDs, 0}}, endpointSteps...)
		requireEachCreationRefused(t, steps, func(t *testing.T) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			accepted := accept(ctx)
			ep, err := cm.Dial(ctx, l.Addr().String())
			if err != nil {
				cancel()
				require.ErrorIs(t, (<-accepted).err, context.Canceled, "a dial that failed reached the listener")
				return err
			}
			connected(t, ep, <-accepted)
			return nil
		})
	})

	t.Run("Accept", func(t *testing.T) {
		// The dialer makes its endpoint before its request reaches the
		// listener: the accepted endpoint's objects come second.
		requireEachCreationRefused(t, steps(1, endpointSteps), func(t *testing.T) error {
			accepted := accept(ctx)
			ep, dialErr := cm.Dial(ctx, l.Addr().String())
			a := <-accepted
			if a.err != nil {
				var rejected *cm.RejectError
				require.ErrorAs(t, dialErr, &rejected, "the dialer of a refused accept")
				return a.err
			}
			require.NoError(t, dialErr)
			connected(t, ep, a)
			return nil
		})
	})

	t.Run("ListenerAccept", func(t *testing.T) {
		var log lockedBuffer
		logged, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithLogger(zerolog.New(&log)))
		require.NoError(t, err)
		defer logged.Close()
		requireEachCreationRefused(t, steps(1, endpointSteps), func(t *testing.T) error {
			from := len(log.String())
			actx, cancel := context.WithCancel(ctx)
			defer cancel()
			accepted := acceptInBackground(actx, logged)
			ep, err := cm.Dial(ctx, logged.Addr().String())
			if err == nil {
				connected(t, ep, <-accepted)
				return nil
			}
			var rejected *cm.RejectError
			require.ErrorAs(t, err, &rejected, "the dialer of a refused accept")
			refusal := loggedRefusal(t, &log, from, errRefusedCreation)
			cancel()
			require.ErrorIs(t, (<-accepted).err, context.Canceled, "Accept returned on a refused accept")
			return refusal
		})
	})

	t.Run("ListenWithSharedReceiveQueue", func(t *testing.T) {
		requireEachCreationRefused(t, []creation{{verbs.CMIDs, 0}, {verbs.PDs, 0}, {verbs.SRQs, 0}}, func(t *testing.T) error {
			l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), cm.WithSharedReceiveQueue(8))
			if err != nil {
				return err
			}
			closeErr := l.Close()
			_, err = l.SRQ().Destroy() // the caller's, after the listener (Listener.SRQ)
			return errors.Join(closeErr, err)
		})
	})
}

// TestInjectedCreationFailuresInMsg: a msg dial, with one of the device
// objects it makes before it connects refused in turn, fails with the
// refusal and frees what it made. Where one the listener makes for an
// accepted connection is refused, the listener frees what that connection
// made, warns its logger, and goes on serving: nothing reaches Accept (in
// a server's accept loop, net/http's over rdmanet, an error would end
// it). Its dialer is rejected, or, where the connection was up already,
// disconnected.
func TestInjectedCreationFailuresInMsg(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	var log lockedBuffer
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), msg.WithLogger(zerolog.New(&log)))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	endpointSteps := []creation{{verbs.PDs, 0}, {verbs.CompChannels, 0}, {verbs.CQs, 0}, {verbs.QPs, 0}}

	t.Run("Dial", func(t *testing.T) {
		// Its receive buffers' region is registered before it connects.
		steps := append([]creation{{verbs.CMIDs, 0}}, endpointSteps...)
		steps = append(steps, creation{verbs.MRs, 0})
		requireEachCreationRefused(t, steps, func(t *testing.T) error {
			c, err := msg.Dial(ctx, l.Addr().String())
			if err != nil {
				return err
			}
			s, err := l.Accept(ctx)
			require.NoError(t, err)
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
			return nil
		})
	})

	t.Run("DialSendBuffers", func(t *testing.T) {
		// A raw cm listener, passing for a msg one (msgHello), makes no
		// region: the dialer registers its receive buffers before it
		// connects and its send buffers once connected.
		raw, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
		require.NoError(t, err)
		defer raw.Close()
		requireEachCreationRefused(t, []creation{{verbs.MRs, 1}}, func(t *testing.T) error {
			accepted := acceptOne(ctx, raw, msgHello(t))
			c, err := msg.Dial(ctx, raw.Addr().String())
			a := <-accepted
			require.NoError(t, a.err)
			closeAndDrain(t, a.ep)
			if err != nil {
				return err
			}
			return c.Close()
		})
	})

	t.Run("Accept", func(t *testing.T) {
		// A raw cm dialer (msgHello) makes its endpoint, and no region,
		// before its request reaches the listener. The listener registers
		// the connection's receive buffers before it accepts, and its
		// send buffers after.
		requireEachCreationRefused(t, append(steps(1, endpointSteps), creations(verbs.MRs, 2)...), func(t *testing.T) error {
			logged := len(log.String())
			actx, cancel := context.WithCancel(ctx)
			defer cancel()
			type msgAcceptance struct {
				c   *msg.Conn
				err error
			}
			accepted := make(chan msgAcceptance, 1)
			go func() {
				c, err := l.Accept(actx)
				accepted <- msgAcceptance{c, err}
			}()
			raw, err := cm.Dial(ctx, l.Addr().String(), msgHello(t))
			if err != nil {
				var rejected *cm.RejectError
				require.ErrorAs(t, err, &rejected, "the dialer of a connection the listener could not make")
			} else {
				select {
				case a := <-accepted:
					require.NoError(t, a.err)
					require.NoError(t, a.c.Close())
					closeAndDrain(t, raw)
					return nil // nothing was refused
				case <-raw.Done(): // the listener closed what it could not set up
				}
				closeAndDrain(t, raw)
			}
			refusal := loggedRefusal(t, &log, logged, errRefusedCreation)
			cancel()
			require.ErrorIs(t, (<-accepted).err, context.Canceled, "Accept got what the listener could not set up")
			return refusal
		})
	})
	requireListenerServes(t, ctx, l)
}

// TestInjectedRefusedAcceptKeepsHTTPServing: an http.Server on an rdmanet
// listener whose device refuses an accepted connection's send buffers
// (registered once the connection is up; its dialer, a raw cm peer
// passing for a msg one, registers none) goes on serving: the dialer's
// connection ends, and the next client gets its answer. net/http's Serve
// ends on an Accept error that is not temporary: the refusal must not
// reach Accept.
func TestInjectedRefusedAcceptKeepsHTTPServing(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "still serving")
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	fired := refuse(t, creation{verbs.MRs, 1})
	raw, err := cm.Dial(ctx, l.Addr().String(), msgHello(t))
	require.NoError(t, err, "the refusal came after the connection was up")
	select {
	case <-raw.Done():
	case <-ctx.Done():
		t.Fatal("the listener kept a connection it could not set up")
	}
	closeAndDrain(t, raw)
	fired()

	tr := &http.Transport{DialContext: (&rdmanet.Dialer{}).DialContext}
	defer tr.CloseIdleConnections()
	require.Equal(t, "still serving", httpGet(t, tr, "http://"+l.Addr().String()+"/"))
	select {
	case err := <-served:
		t.Fatalf("Serve ended: %v", err)
	default:
	}
	require.NoError(t, srv.Shutdown(ctx))
	require.ErrorIs(t, <-served, http.ErrServerClosed)
}

// TestInjectedCreationFailuresInBufpool: bufpool.OpenPD, and a pool, a
// region and a listener's shared receive queue made in an opened PD, each
// with one of the device objects it makes refused in turn, fail with the
// refusal and free what they made. Each gives back the hold it took on
// the PD: once its opener closes it, the PD is freed (CheckResources).
func TestInjectedCreationFailuresInBufpool(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	host := rxetest.Addr(t)
	t.Run("OpenPD", func(t *testing.T) {
		requireEachCreationRefused(t, []creation{{verbs.CMIDs, 0}, {verbs.PDs, 0}}, func(t *testing.T) error {
			pd, err := bufpool.OpenPD(ctx, host)
			if err != nil {
				return err
			}
			return pd.Close()
		})
	})

	pd, err := bufpool.OpenPD(ctx, host)
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Close()) }()
	t.Run("New", func(t *testing.T) {
		requireEachCreationRefused(t, []creation{{verbs.MRs, 0}}, func(t *testing.T) error {
			p, err := bufpool.New(pd, bufpool.Size(4096), bufpool.Count(4))
			if err != nil {
				return err
			}
			return p.Close()
		})
	})
	t.Run("NewRegion", func(t *testing.T) {
		requireEachCreationRefused(t, []creation{{verbs.MRs, 0}}, func(t *testing.T) error {
			r, err := bufpool.NewRegion(pd, 1<<16, bufpool.RemoteRead|bufpool.RemoteWrite)
			if err != nil {
				return err
			}
			return r.Close()
		})
	})
	t.Run("SharedReceiveQueueInTheOpenedPD", func(t *testing.T) {
		requireEachCreationRefused(t, []creation{{verbs.SRQs, 0}}, func(t *testing.T) error {
			l, err := cm.Listen(ctx, net.JoinHostPort(host, "0"), cm.WithPD(pd), cm.WithSharedReceiveQueue(8))
			if err != nil {
				return err
			}
			closeErr := l.Close()
			_, err = l.SRQ().Destroy()
			return errors.Join(closeErr, err)
		})
	})
}

// TestInjectedRefusedRendezvousRegion: a msg message sent by rendezvous
// whose region the device refuses to register. Refused on the sender
// (its region comes first), that Send fails with the refusal, nothing is
// sent, and the connection goes on: the next message arrives, and no
// other. Refused on the receiver, which cannot fetch a message it was
// offered, the connection ends: its reader gets the refusal, the sender's
// Send fails instead of waiting for a read that never comes, and nothing
// is left once both close.
func TestInjectedRefusedRendezvousRegion(t *testing.T) {
	big := make([]byte, 64<<10)
	pattern(big, 1)
	t.Run("Sender", func(t *testing.T) {
		ctx := testContext(t)
		rxetest.CheckResources(t)
		client, server, _ := msgPair(t, ctx)
		fired := refuse(t, creation{verbs.MRs, 0})
		require.ErrorIs(t, client.Send(ctx, big), errRefusedCreation)
		fired()
		require.NoError(t, client.Err())
		require.NoError(t, client.Send(ctx, []byte("after")))
		got, err := server.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, "after", string(got), "the refused message was sent")
		require.NoError(t, client.Send(ctx, big))
		got, err = server.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, big, got)
	})
	t.Run("Receiver", func(t *testing.T) {
		ctx := testContext(t)
		rxetest.CheckResources(t)
		client, server, _ := msgPair(t, ctx)
		fired := refuse(t, creation{verbs.MRs, 1})
		sent := make(chan error, 1)
		go func() { sent <- client.Send(ctx, big) }()
		_, err := server.Recv(ctx)
		require.ErrorIs(t, err, errRefusedCreation)
		require.ErrorIs(t, server.Err(), errRefusedCreation)
		fired()
		select {
		case err := <-sent:
			// The receiver's end, as the sender hears of it: the
			// connection's, not one this side's application asked for.
			require.ErrorIs(t, err, msg.ErrClosed, "a message its receiver never read")
			require.NotErrorIs(t, err, net.ErrClosed)
		case <-ctx.Done():
			t.Fatal("the sender's Send still waits for the read")
		}
	})
}

// TestInjectedRefusedOneSidedStaging: a msg one-sided operation stages
// its bytes in a region of the connection's cache. With its registration
// refused, WriteRemote and ReadRemote fail with the refusal, touch
// nothing at the peer, and the connection goes on: the same calls then
// work.
func TestInjectedRefusedOneSidedStaging(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	client, server, _ := msgPair(t, ctx)
	region, err := bufpool.NewRegion(server.PD(), 4096, bufpool.RemoteRead|bufpool.RemoteWrite)
	require.NoError(t, err)
	defer region.Close()
	copy(region.Bytes(), "the owner's")
	remote, err := region.Remote().Slice(0, len("the owner's"))
	require.NoError(t, err)

	for _, op := range []struct {
		name string
		call func() error
	}{
		{"WriteRemote", func() error { return client.WriteRemote(ctx, remote, []byte("overwrite!!")) }},
		{"ReadRemote", func() error { return client.ReadRemote(ctx, remote, make([]byte, remote.Len)) }},
	} {
		fired := refuse(t, creation{verbs.MRs, 0})
		require.ErrorIs(t, op.call(), errRefusedCreation, op.name)
		fired()
		require.Equal(t, "the owner's", string(region.Bytes()[:remote.Len]), op.name)
		require.NoError(t, client.Err())
	}
	back := make([]byte, remote.Len)
	require.NoError(t, client.ReadRemote(ctx, remote, back))
	require.Equal(t, "the owner's", string(back))
	require.NoError(t, client.WriteRemote(ctx, remote, []byte("overwritten")))
	require.Equal(t, "overwritten", string(region.Bytes()[:remote.Len]))
}
