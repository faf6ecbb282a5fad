package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/rpc"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"golang.org/x/net/nettest"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// rdmanetPair is a connected pair of rdmanet conns on the device: c1
// dialed, with rdmanet's defaults, and c2 accepted by a Listener made with
// listenOpts.
func rdmanetPair(t testing.TB, listenOpts ...rdmanet.Option) (c1, c2 net.Conn, stop func(), err error) {
	ctx := context.Background()
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), listenOpts...)
	if err != nil {
		return nil, nil, nil, err
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		got <- accepted{c, err}
	}()
	c1, err = rdmanet.Dial(ctx, l.Addr().String())
	if err != nil {
		l.Close()
		<-got
		return nil, nil, nil, err
	}
	a := <-got
	l.Close()
	if a.err != nil {
		c1.Close()
		return nil, nil, nil, a.err
	}
	return c1, a.c, func() { c1.Close(); a.c.Close() }, nil
}

// TestRdmanetConformance runs the Go team's net.Conn conformance suite
// (golang.org/x/net/nettest) on rdmanet conns: with rdmanet's defaults,
// and with a Listener that asks for small buffers (leanServerOptions),
// while the dialer keeps its 64 KiB ones. Each way, a 64 KiB Write of such
// a pair then goes as 16 messages or more, of at most 4 KiB.
func TestRdmanetConformance(t *testing.T) {
	rxetest.CheckResources(t)
	t.Run("defaults", func(t *testing.T) {
		nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return rdmanetPair(t) })
	})
	t.Run("lean_listener", func(t *testing.T) {
		nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return rdmanetPair(t, leanServerOptions()) })

		c1, c2, stop, err := rdmanetPair(t, leanServerOptions())
		require.NoError(t, err)
		defer stop()
		data := make([]byte, 64<<10)
		for i, dir := range [][2]net.Conn{{c1, c2}, {c2, c1}} {
			w, r := dir[0], dir[1]
			pattern(data, i)
			before := w.(*rdmanet.Conn).Stats()
			written := make(chan error, 1)
			go func() {
				_, err := w.Write(data)
				written <- err
			}()
			got := make([]byte, len(data))
			_, err := io.ReadFull(r, got)
			require.NoError(t, err)
			require.NoError(t, <-written)
			require.True(t, bytes.Equal(data, got), "direction %d", i)
			after := w.(*rdmanet.Conn).Stats()
			sent := (after.MessagesSent - after.CreditMessagesSent) - (before.MessagesSent - before.CreditMessagesSent)
			require.GreaterOrEqual(t, sent, uint64(len(data)/(leanBufferSize-msg.HeaderSize)), "direction %d: messages of data", i)
		}
	})
}

// TestRdmanetHTTP: net/http unchanged over rdmanet: a server on an rdmanet
// Listener, clients whose Transport dials with rdmanet.Dialer and keeps
// connections alive, each request a 1 MiB body the handler echoes back,
// checked byte for byte: 32 clients at once.
func TestRdmanetHTTP(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(httpEcho)}
	var conns atomic.Int64
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	const requests = 2 // the second rides the kept-alive connection
	const clients = 32
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{DialContext: (&rdmanet.Dialer{}).DialContext, MaxIdleConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr}
			body := make([]byte, 1<<20)
			for j := range requests {
				pattern(body, i*requests+j)
				resp, err := cl.Post("http://"+l.Addr().String()+"/echo", "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					errs <- err
					return
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, body) {
					errs <- fmt.Errorf("client %d request %d: status %d, %d bytes back, %v", i, j, resp.StatusCode, len(got), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(clients), conns.Load(), "one connection per client, kept alive")
	require.NoError(t, srv.Shutdown(ctx))
	require.ErrorIs(t, <-served, http.ErrServerClosed)
}

// httpEcho answers a request with its body.
func httpEcho(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Write(body)
}

// The buffers of leanServerOptions: 8 of 4 KiB of payload each way.
const (
	leanBufferSize = msg.HeaderSize + 4096
	leanRecvDepth  = 8
)

// leanServerOptions is the Listener options of a server that holds many
// connections and bounds the memory each pins.
func leanServerOptions() rdmanet.Option {
	return rdmanet.WithMsgOptions(msg.WithBufferSize(leanBufferSize), msg.WithRecvDepth(leanRecvDepth))
}

// helperLeanHTTPServer serves httpEcho over rdmanet with
// leanServerOptions until it is killed.
func helperLeanHTTPServer(ctx context.Context, addr string) error {
	l, err := rdmanet.Listen(ctx, addr, leanServerOptions())
	if err != nil {
		return err
	}
	fmt.Println("listening")
	return http.Serve(l, http.HandlerFunc(httpEcho))
}

// TestRdmanetServerBoundsItsMemory: a net/http server process whose
// Listener asks for small buffers (leanServerOptions) serves clients that
// use rdmanet's defaults, 64 KiB buffers, 32 of them. Each client's
// 256 KiB body comes back whole; then, with every connection kept alive
// and idle, the kernel's table of memory regions (`rdma res show mr`)
// holds for the server process two regions a connection (its receives and
// its sends), of at most 8 buffers of 4 KiB and their headers each: its
// memory is its own choice, whatever its clients use.
func TestRdmanetServerBoundsItsMemory(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	addr := net.JoinHostPort(rxetest.Addr(t), fmt.Sprint(21000+(os.Getpid()+7)%10000))
	server := startHelper(t, "rdmanet-lean-server", "listening", addr)

	const clients = 8
	body := make([]byte, 256<<10)
	for i := range clients {
		tr := &http.Transport{DialContext: (&rdmanet.Dialer{}).DialContext}
		t.Cleanup(tr.CloseIdleConnections)
		pattern(body, i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/echo", bytes.NewReader(body))
		require.NoError(t, err)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		require.NoError(t, err, "client %d", i)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, "client %d", i)
		require.Equal(t, http.StatusOK, resp.StatusCode, "client %d", i)
		require.True(t, bytes.Equal(body, got), "client %d: %d bytes back", i, len(got))
	}

	regions, registered := rxetest.Registered(t, server.Process.Pid)
	pageSize := os.Getpagesize()
	pool := (leanRecvDepth*leanBufferSize + pageSize - 1) / pageSize * pageSize
	t.Logf("the server process holds %d regions, %d bytes, for %d connections", regions, registered, clients)
	require.Equal(t, 2*clients, regions, "a receive pool and a send pool a connection")
	require.LessOrEqual(t, registered, int64(2*clients*pool), "at most %d bytes a pool", pool)
}

// TestRdmanetTakesNoMessageLargerThanItsBuffers: a Conn tells its peers
// in the hello that it receives nothing larger than its buffers, so a msg
// peer's Send of 1 MiB fails at once with msg.ErrTooLarge and the stream
// goes on; a raw peer that offers 1 MiB by rendezvous anyway is cut off
// before anything is registered for it: the Conn's Read fails with an
// error matching msg.ErrMalformed and syscall.ECONNRESET.
func TestRdmanetTakesNoMessageLargerThanItsBuffers(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	accept := func() net.Conn {
		t.Helper()
		c, err := l.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}

	peer, err := msg.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	defer peer.Close()
	conn := accept()
	err = peer.Send(ctx, make([]byte, 1<<20))
	require.ErrorIs(t, err, msg.ErrTooLarge)
	require.ErrorContains(t, err, fmt.Sprintf("more than the %d the peer receives", 64<<10))
	require.NoError(t, peer.Send(ctx, []byte("hello")))
	got := make([]byte, 16)
	n, err := conn.Read(got)
	require.NoError(t, err)
	require.Equal(t, "hello", string(got[:n]), "the stream goes on")

	raw, err := cm.Dial(ctx, l.Addr().String(), msgHello(t))
	require.NoError(t, err)
	conn = accept()
	sent := offerRendezvous(t, raw, 1<<20)
	_, err = conn.Read(got)
	t.Logf("the Conn's Read: %v", err)
	require.ErrorIs(t, err, msg.ErrMalformed)
	require.ErrorIs(t, err, syscall.ECONNRESET)
	requireCutOff(t, raw, sent)
}

// TestRdmanetListenerDeadline: SetDeadline bounds Accept as
// *net.TCPListener's does. A deadline that passes wakes a pending Accept,
// set before or during its wait, with an error that matches
// os.ErrDeadlineExceeded and is a net.Error Timeout; once passed, Accept
// fails at once even with a connection waiting, which the next Accept
// without a deadline returns. Close wakes an Accept waiting with a
// deadline far off with net.ErrClosed, and SetDeadline after Close fails
// so too.
func TestRdmanetListenerDeadline(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	requireTimeout := func(err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, what)
		var ne net.Error
		require.ErrorAs(t, err, &ne, what)
		require.True(t, ne.Timeout(), what)
	}

	require.NoError(t, l.SetDeadline(time.Now().Add(200*time.Millisecond)))
	start := time.Now()
	_, err = l.Accept()
	requireTimeout(err, "a deadline set before the wait")
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "Accept waited for the deadline")

	require.NoError(t, l.SetDeadline(time.Time{}))
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	select {
	case err := <-accepted:
		t.Fatalf("Accept returned with no deadline and no client: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, l.SetDeadline(time.Now().Add(100*time.Millisecond)))
	requireTimeout(<-accepted, "a deadline set during the wait")

	client, err := rdmanet.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	_, err = l.Accept()
	requireTimeout(err, "a passed deadline, with a connection waiting")
	require.NoError(t, l.SetDeadline(time.Time{}))
	conn, err := l.Accept()
	require.NoError(t, err, "the waiting connection")
	defer conn.Close()
	_, err = client.Write([]byte("hi"))
	require.NoError(t, err)
	got := make([]byte, 2)
	_, err = io.ReadFull(conn, got)
	require.NoError(t, err)
	require.Equal(t, "hi", string(got))

	require.NoError(t, l.SetDeadline(time.Now().Add(time.Hour)))
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, l.Close())
	err = <-accepted
	require.ErrorIs(t, err, net.ErrClosed)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorIs(t, l.SetDeadline(time.Time{}), net.ErrClosed)
}

// TestRdmanetHTTPShutdownWaitsForRequests: net/http's graceful shutdown
// over rdmanet, as a service restarts. With 4 requests in their handlers,
// each on a connection its client keeps alive, Shutdown closes the
// listener at once (Serve returns http.ErrServerClosed, a new dial is
// refused) and waits; once the handlers return, every response arrives
// whole, Shutdown closes the connections that went idle and returns nil,
// and each client's next request, on a connection of its own, is
// refused. Nothing leaks.
func TestRdmanetHTTPShutdownWaitsForRequests(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	const clients = 4
	entered, release := make(chan struct{}, clients), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/held" {
			entered <- struct{}{}
			<-release
		}
		w.Write(body)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	url := "http://" + l.Addr().String()
	responses := make(chan error, clients)
	var transports []*http.Transport
	for i := range clients {
		tr := &http.Transport{DialContext: (&rdmanet.Dialer{}).DialContext}
		transports = append(transports, tr)
		t.Cleanup(tr.CloseIdleConnections)
		body := make([]byte, 256<<10)
		pattern(body, i)
		go func() {
			resp, err := (&http.Client{Transport: tr}).Post(url+"/held", "application/octet-stream", bytes.NewReader(body))
			if err != nil {
				responses <- err
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && (resp.StatusCode != http.StatusOK || !bytes.Equal(got, body)) {
				err = fmt.Errorf("client %d: status %d, %d bytes back", i, resp.StatusCode, len(got))
			}
			responses <- err
		}()
	}
	for range clients {
		<-entered
	}

	shutdown := make(chan error, 1)
	go func() { shutdown <- srv.Shutdown(ctx) }()
	select {
	case err := <-served:
		require.ErrorIs(t, err, http.ErrServerClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return once Shutdown began")
	}
	_, err = rdmanet.Dial(ctx, l.Addr().String())
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "a dial once the listener is closed")
	select {
	case err := <-shutdown:
		t.Fatalf("Shutdown returned with requests in their handlers: %v", err)
	case <-time.After(200 * time.Millisecond):
	}

	close(release)
	for range clients {
		require.NoError(t, <-responses)
	}
	select {
	case err := <-shutdown:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return once the requests were answered")
	}
	for i, tr := range transports {
		_, err := (&http.Client{Transport: tr}).Get(url + "/after")
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "client %d after the shutdown", i)
	}
}

// TestRdmanetHTTPTimeoutsCloseStalledConns: net/http's own timeouts,
// which work through the conn's read deadline, over rdmanet. A client
// that sends part of a request's header and stalls (slowloris) has its
// connection closed once ReadHeaderTimeout passes: the deadline ends
// the server's Read that waits for the rest, and net/http closes without
// a word, so the client reads io.EOF and no response. A kept-alive
// connection left idle is closed once IdleTimeout passes. Nothing leaks.
func TestRdmanetHTTPTimeoutsCloseStalledConns(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	closed := make(chan net.Conn, 4)
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 300 * time.Millisecond,
		IdleTimeout:       300 * time.Millisecond,
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				closed <- c
			}
		},
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer func() {
		require.NoError(t, srv.Shutdown(ctx))
		require.ErrorIs(t, <-served, http.ErrServerClosed)
	}()

	t.Run("ReadHeaderTimeout", func(t *testing.T) {
		c, err := rdmanet.Dial(ctx, l.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: stalled\r\n")
		require.NoError(t, err)
		requireClosedByServer(t, closed, c.LocalAddr())
		got, err := io.ReadAll(c)
		require.NoError(t, err, "the server closed the stalled connection (io.EOF)")
		require.Empty(t, string(got), "and answered nothing")
	})

	t.Run("IdleTimeout", func(t *testing.T) {
		dialed := make(chan net.Addr, 1)
		tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&rdmanet.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				dialed <- c.LocalAddr()
			}
			return c, err
		}}
		defer tr.CloseIdleConnections()
		require.Equal(t, "ok", httpGet(t, tr, "http://"+l.Addr().String()+"/"))
		requireClosedByServer(t, closed, <-dialed) // while the client keeps it alive
	})
}

// TestRdmanetHTTPHandlerSeesClientGone: a handler learns that its client
// went away, over rdmanet as over TCP, and stops working for nobody.
// net/http reads the connection in the background while a handler runs,
// and cancels the request's context when that read ends; it fails the
// handler's writes once the client closed. A long poll whose client
// cancels its request sees r.Context() end with context.Canceled, and a
// download of 64 MiB whose client closes the body after 1 MiB gets a
// write error matching EPIPE or ECONNRESET, as over TCP. Both within
// 10 s; then Shutdown finds no connection left to wait for, and nothing
// leaks.
func TestRdmanetHTTPHandlerSeesClientGone(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	const chunk, download = 64 << 10, 64 << 20
	entered := make(chan struct{}, 1)
	ended := make(chan error, 1) // how the handler learned of it
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/poll":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			entered <- struct{}{}
			select {
			case <-r.Context().Done():
				ended <- r.Context().Err()
			case <-time.After(time.Minute):
				ended <- errors.New("the request's context did not end")
			}
		case "/download":
			data := make([]byte, chunk)
			for sent := 0; sent < download; sent += chunk {
				if _, err := w.Write(data); err != nil {
					ended <- err
					return
				}
			}
			ended <- errors.New("the whole download was written")
		}
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	url := "http://" + l.Addr().String()
	tr := &http.Transport{DialContext: (&rdmanet.Dialer{}).DialContext}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	handlerEnded := func() error {
		t.Helper()
		select {
		case err := <-ended:
			return err
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the handler did not learn that its client went away")
			return nil
		}
	}

	t.Run("cancelled long poll", func(t *testing.T) {
		reqCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, url+"/poll", nil)
		require.NoError(t, err)
		resp, err := cl.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		<-entered
		cancel()
		_, err = io.ReadAll(resp.Body)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, handlerEnded(), context.Canceled)
	})

	t.Run("abandoned download", func(t *testing.T) {
		resp, err := cl.Get(url + "/download")
		require.NoError(t, err)
		n, err := io.CopyN(io.Discard, resp.Body, 1<<20)
		require.NoError(t, err)
		require.Equal(t, int64(1<<20), n)
		require.NoError(t, resp.Body.Close())
		// TCP gives either, as the close found unread bytes or not.
		err = handlerEnded()
		require.True(t, errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET), "the handler's write: %v", err)
	})

	shutCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(shutCtx), "a connection was left open")
	require.ErrorIs(t, <-served, http.ErrServerClosed)
}

// httpGet gets url through tr and returns the response's body, which must
// come whole.
func httpGet(t *testing.T, tr *http.Transport, url string) string {
	t.Helper()
	resp, err := (&http.Client{Transport: tr}).Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// requireClosedByServer waits, for 10 s at most, until the HTTP server
// has closed its connection from client, a client's local address (the
// server's ConnState hook sends each closed connection on closed).
func requireClosedByServer(t *testing.T, closed <-chan net.Conn, client net.Addr) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-closed:
			if c.RemoteAddr().String() == client.String() {
				return
			}
		case <-deadline:
			t.Fatalf("the server did not close the connection from %v", client)
		}
	}
}

// TestRdmanetCloseWrite: half-close as with TCP. The client writes 1 MiB
// and calls CloseWrite; the server echoes until io.EOF and then closes;
// the client reads back every byte, then io.EOF. A Write after CloseWrite
// fails with msg.ErrWriteClosed. The client's Stats count the messages.
func TestRdmanetCloseWrite(t *testing.T) {
	rxetest.CheckResources(t)
	c1, c2, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	client := c1.(*rdmanet.Conn)
	echoed := make(chan error, 1)
	go func() {
		_, err := io.Copy(c2, c2) // until the client's CloseWrite
		echoed <- errors.Join(err, c2.Close())
	}()
	body := make([]byte, 1<<20)
	pattern(body, 3)
	wrote := make(chan error, 1)
	go func() {
		_, err := client.Write(body)
		wrote <- errors.Join(err, client.CloseWrite())
	}()
	got, err := io.ReadAll(client) // ends with the server's Close: io.EOF
	require.NoError(t, err)
	require.NoError(t, <-wrote)
	require.NoError(t, <-echoed)
	require.True(t, bytes.Equal(body, got), "%d bytes back of %d", len(got), len(body))
	_, err = client.Write([]byte("late"))
	require.ErrorIs(t, err, msg.ErrWriteClosed)
	// The body went as whole messages, without rendezvous, and came
	// back; the end of data is one more message each way.
	st := client.Stats()
	chunks := uint64(len(body) / (64 << 10)) // a Write's messages carry up to 64 KiB
	require.GreaterOrEqual(t, st.MessagesSent, chunks+1)
	require.GreaterOrEqual(t, st.MessagesReceived, chunks+1)
	require.Zero(t, st.RendezvousSent)
	require.GreaterOrEqual(t, st.Endpoint.SendRequests, st.MessagesSent)
}

// TestRdmanetDialerNetworkFamily: a Dialer's "tcp4" and "tcp6" reach a
// listener on both families by the testbed's name over the family they
// name, whatever order the resolver gives the name's addresses in; "tcp"
// takes either.
func TestRdmanetDialerNetworkFamily(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	name := testbedName(t)
	l, err := rdmanet.Listen(ctx, ":0")
	require.NoError(t, err)
	defer l.Close()
	addr := net.JoinHostPort(name, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	var d rdmanet.Dialer
	for _, network := range []string{"tcp4", "tcp6", "tcp"} {
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := l.Accept()
			accepted <- c
		}()
		c, err := d.DialContext(ctx, network, addr)
		require.NoError(t, err, "%s %s", network, addr)
		s := <-accepted
		require.NotNil(t, s)
		ip := c.RemoteAddr().(*net.TCPAddr).IP
		switch network {
		case "tcp4":
			require.NotNil(t, ip.To4(), "%s dialed %v", network, ip)
		case "tcp6":
			require.Nil(t, ip.To4(), "%s dialed %v", network, ip)
		}
		require.Equal(t, c.RemoteAddr().String(), s.LocalAddr().String())
		_, err = c.Write([]byte("hi"))
		require.NoError(t, err)
		buf := make([]byte, 2)
		_, err = io.ReadFull(s, buf)
		require.NoError(t, err)
		require.Equal(t, "hi", string(buf))
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())
	}
	require.NoError(t, l.Close())
}

// TestRdmanetCloseThatLosesBytesIsNoEOF: a writer whose peer reads
// nothing fills the peer's receives, then its stream holds the bytes of
// later writes for a credit that never comes. Close gives up on them
// within its second and disconnects without a goodbye. The peer, reading
// only then, gets the bytes that arrived, in order, and then an error,
// not io.EOF: only an orderly end, with nothing lost, reads as one.
func TestRdmanetCloseThatLosesBytesIsNoEOF(t *testing.T) {
	rxetest.CheckResources(t)
	w, r, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	body := make([]byte, 4<<20) // more than the peer's 32 receives of 64 KiB take
	pattern(body, 5)
	require.NoError(t, w.SetWriteDeadline(time.Now().Add(2*time.Second)))
	written := 0
	for written < len(body) {
		n, err := w.Write(body[written:min(written+16<<10, len(body))])
		written += n
		if err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			break
		}
	}
	require.Less(t, written, len(body), "the writes filled the peer and then waited")
	require.NoError(t, w.Close())
	got, err := io.ReadAll(r)
	require.Error(t, err, "a close that lost bytes read as io.EOF")
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.ErrorIs(t, err, cm.ErrPeerDisconnected, "on every device, whether its flush or the CM's event came first")
	require.NotErrorIs(t, err, net.ErrClosed, "net.ErrClosed is for this side's Close")
	require.Less(t, len(got), written, "bytes the stream held are lost")
	require.Positive(t, len(got))
	require.True(t, bytes.Equal(body[:len(got)], got), "the bytes that arrived, in order")
	t.Logf("%d bytes written, %d read, then %v", written, len(got), err)
}

// TestRdmanetWriteAfterPeerClose: once the peer has closed in order, this
// side reads io.EOF, and its writes fail as a TCP conn's do then, with
// syscall.EPIPE and msg.ErrPeerClosed, not with net.ErrClosed, which only
// its own Close gives: after it, a write matches net.ErrClosed. The first
// write the closed connection refuses is accepted (see
// TestRdmanetTLSCloseDeliversWhatWasWritten), but only that one: every
// write after a failed one fails. CloseWrite then returns nil, as TCP's
// shutdown does after the peer's close.
func TestRdmanetWriteAfterPeerClose(t *testing.T) {
	rxetest.CheckResources(t)
	w, r, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	require.NoError(t, r.Close())
	_, err = w.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, w.SetWriteDeadline(time.Now().Add(10*time.Second)))
	for err == io.EOF || err == nil { // writes posted before the disconnect may still succeed
		_, err = w.Write([]byte("after"))
	}
	require.ErrorIs(t, err, syscall.EPIPE)
	require.ErrorIs(t, err, msg.ErrPeerClosed)
	require.NotErrorIs(t, err, net.ErrClosed, "net.ErrClosed is for this side's Close")
	_, again := w.Write([]byte("again"))
	require.ErrorIs(t, again, syscall.EPIPE, "one write is accepted after the peer's close, not more")
	var opErr *net.OpError
	require.ErrorAs(t, err, &opErr)
	require.False(t, opErr.Timeout())
	require.NoError(t, w.(*rdmanet.Conn).CloseWrite(), "as TCP's shutdown after the peer's close")
	require.NoError(t, w.Close())
	_, err = w.Write([]byte("closed"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// TestRdmanetSmallWritesCombine: while the reader reads nothing, small
// Writes go one message each until half the peer's receives are taken, and
// then into one held message, so that every one of them returns without
// the reader. Once the reader reads, the held bytes follow; Close sends
// them before its goodbye, and the reader gets every byte in order, then
// io.EOF.
func TestRdmanetSmallWritesCombine(t *testing.T) {
	rxetest.CheckResources(t)
	c1, c2, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	writer := c1.(*rdmanet.Conn)
	const writes, size = 600, 100 // 60 KB: more than 32 receives' worth of writes, less than one held message
	body := make([]byte, writes*size)
	pattern(body, 5)
	// A Write that waited for the reader would wait forever: fail it.
	require.NoError(t, writer.SetWriteDeadline(time.Now().Add(10*time.Second)))
	for i := range writes {
		n, err := writer.Write(body[i*size : (i+1)*size])
		require.NoError(t, err, "write %d, with nobody reading", i)
		require.Equal(t, size, n)
	}
	// The peer has 32 receives: at most 16 writes went as messages of
	// their own (credit messages, such as the dialer's greeting, take
	// receives too).
	st := writer.Stats()
	sent := st.MessagesSent
	require.LessOrEqual(t, st.MessagesSent-st.CreditMessagesSent, uint64(32/2), "writes went alone past half the peer's receives")
	read := make(chan []byte, 1)
	go func() {
		got, _ := io.ReadAll(c2)
		read <- got
	}()
	require.NoError(t, writer.Close())
	got := <-read
	require.True(t, bytes.Equal(body, got), "%d bytes read of %d", len(got), len(body))
	require.Greater(t, writer.Stats().MessagesSent, sent, "the held bytes left after the reader read")
}

// TestRdmanetFacingMsgPeerHoldsNothing: a msg peer may read an rdmanet
// Conn's bytes as messages, and hold those it has while it waits for
// more. Facing it, a stream holds back no bytes that a credit would let
// go: every write reaches the peer although it has released none. (A
// stream that held its last write until the peer gave back half its
// receives would wait for ever, and so would the peer.)
func TestRdmanetFacingMsgPeerHoldsNothing(t *testing.T) {
	rxetest.CheckResources(t)
	ctx := context.Background()
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	peer, err := msg.Dial(ctx, l.Addr().String(), msg.WithRecvDepth(32))
	require.NoError(t, err)
	defer peer.Close()
	writer := <-accepted
	require.NotNil(t, writer)
	defer writer.Close()

	// More writes than half the peer's 32 receives, fewer than all of
	// them less the reserve, each read before the next: each may go as
	// soon as it is written.
	const writes, size = 24, 100
	body := make([]byte, writes*size)
	pattern(body, 9)
	require.NoError(t, writer.SetWriteDeadline(time.Now().Add(10*time.Second)))
	var got []byte
	var held []*msg.Message
	defer func() {
		for _, m := range held {
			m.Release()
		}
	}()
	for i := range writes {
		_, err := writer.Write(body[i*size : (i+1)*size])
		require.NoError(t, err, "write %d", i)
		for len(got) < (i+1)*size {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			m, err := peer.RecvMessage(rctx)
			cancel()
			require.NoError(t, err, "write %d: %d bytes of %d arrived, the peer holding all %d messages", i, len(got), (i+1)*size, len(held))
			held = append(held, m)
			got = append(got, m.Payload...)
		}
	}
	require.True(t, bytes.Equal(body, got), "the bytes arrived in order")
}

// TestRdmanetCallsAfterClose: after Close, every call on the Conn fails
// as on a closed TCP conn, with a *net.OpError matching net.ErrClosed:
// Reads and Writes, of nothing too, the deadline setters and CloseWrite;
// Close again returns nil, and the peer reads io.EOF.
func TestRdmanetCallsAfterClose(t *testing.T) {
	rxetest.CheckResources(t)
	c1, c2, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	conn := c1.(*rdmanet.Conn)
	require.NoError(t, conn.SetDeadline(time.Now().Add(time.Hour)), "before Close")
	n, err := conn.Read(nil)
	require.NoError(t, err, "a Read of nothing before Close")
	require.Zero(t, n)
	require.NoError(t, conn.Close())
	calls := map[string]func() error{
		"Read":             func() error { _, err := conn.Read(make([]byte, 8)); return err },
		"Read of nothing":  func() error { _, err := conn.Read(nil); return err },
		"Write":            func() error { _, err := conn.Write([]byte("late")); return err },
		"Write of nothing": func() error { _, err := conn.Write(nil); return err },
		"SetDeadline":      func() error { return conn.SetDeadline(time.Now().Add(time.Hour)) },
		"SetReadDeadline":  func() error { return conn.SetReadDeadline(time.Time{}) },
		"SetWriteDeadline": func() error { return conn.SetWriteDeadline(time.Now()) },
		"CloseWrite":       conn.CloseWrite,
		"SetLinger":        func() error { return conn.SetLinger(0) },
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, net.ErrClosed, name)
		var opErr *net.OpError
		require.ErrorAs(t, err, &opErr, name)
	}
	require.NoError(t, conn.Close(), "Close again")
	require.NotNil(t, conn.LocalAddr())
	require.NotNil(t, conn.RemoteAddr())
	_, err = c2.Read(make([]byte, 8))
	require.ErrorIs(t, err, io.EOF)
}

// TestRdmanetSetLingerZeroResets: after SetLinger(0), Close resets the
// connection, as a TCP conn's does: the peer, reading what arrived of a
// write, gets an error matching syscall.ECONNRESET, never io.EOF, and so
// cannot take a stream cut short for a whole one; its CloseWrite then
// fails with ECONNRESET too. SetLinger(-1) puts the goodbye back (the peer
// reads every byte, then io.EOF).
func TestRdmanetSetLingerZeroResets(t *testing.T) {
	rxetest.CheckResources(t)
	for _, linger := range []int{0, -1} {
		t.Run(fmt.Sprintf("linger_%d", linger), func(t *testing.T) {
			c1, c2, stop, err := rdmanetPair(t)
			require.NoError(t, err)
			defer stop()
			conn := c1.(*rdmanet.Conn)
			require.NoError(t, conn.SetLinger(5))
			require.NoError(t, conn.SetLinger(0))
			require.NoError(t, conn.SetLinger(linger), "the last value set counts")
			data := make([]byte, 64<<10)
			pattern(data, 5)
			_, err = conn.Write(data)
			require.NoError(t, err)
			require.NoError(t, conn.Close())

			require.NoError(t, c2.SetReadDeadline(time.Now().Add(10*time.Second)))
			got, err := io.ReadAll(c2)
			require.True(t, bytes.Equal(data[:len(got)], got), "the bytes read are not the ones written")
			if linger < 0 {
				require.NoError(t, err)
				require.Equal(t, len(data), len(got), "a goodbye after a write lost bytes")
				return
			}
			require.ErrorIs(t, err, syscall.ECONNRESET, "read %d of %d bytes", len(got), len(data))
			t.Logf("read %d of %d bytes, then: %v", len(got), len(data), err)
			require.ErrorIs(t, c2.(*rdmanet.Conn).CloseWrite(), syscall.ECONNRESET, "a reset conn's half-close fails as its Write does")
		})
	}
}

// TestRdmanetSetLingerWaitsForASlowReader: Close of a Conn whose peer
// reads slowly, with bytes held for the peer's credits (a Write ran out
// of its deadline waiting for them), and the peer reading only after 2 s.
// After SetLinger(5), Close waits for the held bytes to leave and says
// goodbye: the peer reads every byte written, then io.EOF; so too after
// SetLinger(math.MaxInt), a linger longer than a time.Duration holds. With
// the default linger, Close waits a second: the held bytes are dropped and
// the peer reads what arrived, then an error matching syscall.ECONNRESET.
func TestRdmanetSetLingerWaitsForASlowReader(t *testing.T) {
	rxetest.CheckResources(t)
	for _, linger := range []int{5, math.MaxInt, -1} {
		t.Run(fmt.Sprintf("linger_%d", linger), func(t *testing.T) {
			c1, c2, stop, err := rdmanetPair(t)
			require.NoError(t, err)
			defer stop()
			data := make([]byte, 4<<20)
			pattern(data, 9)
			require.NoError(t, c1.SetWriteDeadline(time.Now().Add(500*time.Millisecond)))
			n, err := c1.Write(data)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the peer's receives are all taken")
			require.NoError(t, c1.(*rdmanet.Conn).SetLinger(linger))

			type result struct {
				got []byte
				err error
			}
			read := make(chan result, 1)
			go func() {
				time.Sleep(2 * time.Second)
				c2.SetReadDeadline(time.Now().Add(20 * time.Second))
				got, err := io.ReadAll(c2)
				read <- result{got, err}
			}()
			start := time.Now()
			require.NoError(t, c1.Close())
			t.Logf("%d bytes written, Close took %v", n, time.Since(start).Round(time.Millisecond))
			r := <-read
			require.True(t, bytes.Equal(data[:len(r.got)], r.got), "the bytes read are not the ones written")
			if linger > 0 {
				require.NoError(t, r.err)
				require.Equal(t, n, len(r.got), "every byte written, then io.EOF")
				return
			}
			require.ErrorIs(t, r.err, syscall.ECONNRESET, "read %d of %d bytes", len(r.got), n)
			require.Less(t, len(r.got), n, "the held bytes were dropped")
		})
	}
}

// TestRdmanetSetLingerCloseWithAWriteWaiting: Close after SetLinger(2)
// while another goroutine's 4 MiB Write waits for the peer's credits.
// With the peer reading after 1 s, Close lets the Write go on until the
// stream holds nothing, says goodbye and returns nil; the Write then
// fails with net.ErrClosed (or, where it won the race for each credit,
// it completed), and the peer reads exactly the bytes the Write counted,
// then io.EOF. With the peer reading only after Close, and Close coming
// once the Write waits for a credit with bytes held, the linger runs
// out: Close resets, the Write fails with net.ErrClosed, and the peer
// reads part of what the Write counted, then ECONNRESET.
func TestRdmanetSetLingerCloseWithAWriteWaiting(t *testing.T) {
	rxetest.CheckResources(t)
	for _, name := range []string{"peer_reads", "peer_waits"} {
		t.Run(name, func(t *testing.T) {
			c1, c2, stop, err := rdmanetPair(t)
			require.NoError(t, err)
			defer stop()
			require.NoError(t, c1.(*rdmanet.Conn).SetLinger(2))
			data := make([]byte, 4<<20)
			pattern(data, 3)
			type result struct {
				n   int
				err error
			}
			wrote := make(chan result, 1)
			go func() {
				n, err := c1.Write(data)
				wrote <- result{n, err}
			}()
			closed := make(chan struct{})
			read := make(chan []byte, 1)
			readErr := make(chan error, 1)
			go func() {
				if name == "peer_reads" {
					time.Sleep(time.Second)
				} else {
					<-closed
				}
				c2.SetReadDeadline(time.Now().Add(20 * time.Second))
				got, err := io.ReadAll(c2)
				read <- got
				readErr <- err
			}()
			if name == "peer_waits" {
				// Close must find the stream holding bytes the peer has
				// no room for: the Write filled the peer's receives and
				// waits for a credit with its next message held.
				require.Eventually(t, func() bool { return c1.(*rdmanet.Conn).Stats().CreditWaits > 0 },
					20*time.Second, 10*time.Millisecond, "the Write never waited for a credit")
			} else {
				time.Sleep(300 * time.Millisecond) // the Write fills the peer's receives and waits
			}
			require.NoError(t, c1.Close())
			close(closed)
			w := <-wrote
			if w.err != nil || name == "peer_waits" {
				require.ErrorIs(t, w.err, net.ErrClosed, "the Write after %d bytes", w.n)
			} else {
				require.Equal(t, len(data), w.n, "a Write that returned nil")
			}
			got := <-read
			require.True(t, bytes.Equal(data[:len(got)], got), "the bytes read are not the ones written")
			if name == "peer_reads" {
				t.Logf("the Write counted %d bytes: %v", w.n, w.err)
				require.NoError(t, <-readErr)
				require.Equal(t, w.n, len(got), "the bytes the Write counted, then io.EOF")
				return
			}
			require.ErrorIs(t, <-readErr, syscall.ECONNRESET, "read %d of the %d bytes written", len(got), w.n)
			require.Less(t, len(got), w.n)
		})
	}
}

// Arith is the net/rpc service of TestRdmanetNetRPC.
type Arith struct{}

// EchoArgs is Arith.Echo's argument.
type EchoArgs struct {
	Seq  int
	Body []byte
}

// Echo returns its argument.
func (Arith) Echo(args EchoArgs, reply *EchoArgs) error {
	*reply = args
	return nil
}

// Fail returns an error the client must see as the call's.
func (Arith) Fail(args EchoArgs, reply *EchoArgs) error {
	return fmt.Errorf("call %d refused", args.Seq)
}

// TestRdmanetNetRPC: net/rpc unchanged over rdmanet (gob over the byte
// stream): 16 goroutines share one client, each call's body (1 B to
// 256 KiB) checked on return, and a method's error comes back as the
// call's.
func TestRdmanetNetRPC(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	srv := rpc.NewServer()
	require.NoError(t, srv.Register(Arith{}))
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		srv.Accept(l) // until the listener closes
	}()
	conn, err := rdmanet.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	cl := rpc.NewClient(conn)

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				args := EchoArgs{Seq: g*100 + i, Body: make([]byte, 1<<(i%19))}
				pattern(args.Body, args.Seq)
				var reply EchoArgs
				if err := cl.Call("Arith.Echo", args, &reply); err != nil {
					errs <- err
					return
				}
				if reply.Seq != args.Seq || !bytes.Equal(reply.Body, args.Body) {
					errs <- fmt.Errorf("call %d: reply %d with %d bytes", args.Seq, reply.Seq, len(reply.Body))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var reply EchoArgs
	err = cl.Call("Arith.Fail", EchoArgs{Seq: 7}, &reply)
	require.EqualError(t, err, "call 7 refused")
	require.NoError(t, cl.Close())
	require.NoError(t, l.Close())
	<-accepted
}

// TestRdmanetDeadlinesUnderLoad: a writer streams numbered bytes while the
// reader reads with a deadline of a millisecond or two, renewed for every
// Read. Some Reads time out (a Timeout error matching
// os.ErrDeadlineExceeded), and a timeout loses nothing: the reader gets
// every byte, in order. Every 16 writes the writer waits until the reader
// has read all it wrote, then pauses for longer than the reader's
// deadlines: Reads find the stream empty and time out however much the
// connection buffers and however fast either side runs. The writer's own
// deadlines, far off, never fire.
func TestRdmanetDeadlinesUnderLoad(t *testing.T) {
	rxetest.CheckResources(t)
	c1, c2, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	const chunk, total = 48 << 10, 160 * 48 << 10
	wrote := make(chan error, 1)
	var read atomic.Int64 // bytes the reader has checked
	readerDone := make(chan struct{})
	defer close(readerDone) // before stop: a failed reader frees a waiting writer
	writeAll := func() error {
		buf := make([]byte, chunk)
		for off := 0; off < total; off += len(buf) {
			for i := range buf {
				buf[i] = byte((off + i) % 251)
			}
			c1.SetWriteDeadline(time.Now().Add(time.Minute))
			if _, err := c1.Write(buf); err != nil {
				return err
			}
			if off/chunk%16 != 15 {
				continue
			}
			caughtUp := time.Now().Add(time.Minute)
			for read.Load() < int64(off+chunk) {
				select {
				case <-readerDone:
					return errors.New("the reader stopped")
				default:
				}
				if time.Now().After(caughtUp) {
					return fmt.Errorf("the reader has %d of the %d bytes written", read.Load(), off+chunk)
				}
				time.Sleep(100 * time.Microsecond)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return c1.(*rdmanet.Conn).CloseWrite()
	}
	go func() {
		err := writeAll()
		if err != nil {
			c1.Close() // the reader reads io.EOF, then this error
		}
		wrote <- err
	}()
	buf := make([]byte, 20000)
	got, timeouts := 0, 0
	for {
		c2.SetReadDeadline(time.Now().Add(time.Duration(1+got%2) * time.Millisecond))
		n, err := c2.Read(buf)
		for i := range n {
			if buf[i] != byte((got+i)%251) {
				t.Fatalf("byte %d is %d, want %d", got+i, buf[i], (got+i)%251)
			}
		}
		got += n
		read.Store(int64(got))
		if err == io.EOF {
			break
		}
		if err != nil {
			var ne net.Error
			require.ErrorAs(t, err, &ne)
			require.True(t, ne.Timeout(), "%v", err)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			timeouts++
		}
	}
	require.NoError(t, <-wrote)
	require.Equal(t, total, got)
	t.Logf("%d bytes in order through %d timed-out Reads", got, timeouts)
	require.Positive(t, timeouts, "no Read timed out: the test did not test deadlines")
}

// TestRdmanetPeerKilledMidStream: a process streaming into an rdmanet
// conn is killed with SIGKILL. The reader's Read returns an error, not
// io.EOF, within crashBound, and everything is freed (CheckResources).
func TestRdmanetPeerKilledMidStream(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	child := startHelper(t, "rdmanet-writer", "streaming", l.Addr().String())
	c := <-accepted
	require.NotNil(t, c)
	defer c.Close()
	buf := make([]byte, 64<<10)
	read := 0
	for read < 4<<20 { // the stream is going
		n, err := c.Read(buf)
		require.NoError(t, err)
		read += n
	}
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := c.Read(buf); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		require.NotErrorIs(t, err, io.EOF, "a killed peer said no goodbye")
		require.ErrorIs(t, err, syscall.ECONNRESET, "a crash reads as TCP's reset")
		require.ErrorIs(t, err, cm.ErrPeerDisconnected, "on every device, whether its flush or the CM's event came first")
		require.NotErrorIs(t, err, net.ErrClosed, "net.ErrClosed is for this side's Close")
		t.Logf("Read failed %v after the kill: %v", time.Since(killed), err)
	case <-time.After(crashBound):
		t.Fatalf("Read did not fail within %v of the kill", crashBound)
	}
}

// helperRdmanetWriter writes to an rdmanet conn until it is killed.
func helperRdmanetWriter(ctx context.Context, addr string) error {
	c, err := rdmanet.Dial(ctx, addr)
	if err != nil {
		return err
	}
	fmt.Println("streaming")
	buf := make([]byte, 64<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
}

// chunkRecorder is an io.Writer that keeps what it is given and the size
// of each Write.
type chunkRecorder struct {
	bytes.Buffer
	largest int
}

func (r *chunkRecorder) Write(p []byte) (int, error) {
	r.largest = max(r.largest, len(p))
	return r.Buffer.Write(p)
}

// failingWriter takes up to take bytes of its first Write, then fails it;
// with bad set it claims more bytes than it was given, as a broken Writer
// might.
type failingWriter struct {
	take int
	bad  bool
}

var errWriterFailed = errors.New("the writer failed")

func (w failingWriter) Write(p []byte) (int, error) {
	if w.bad {
		return len(p) + 1, nil
	}
	return min(w.take, len(p)), errWriterFailed
}

// TestRdmanetWriteTo: io.Copy from a Conn uses its WriteTo, which hands
// the writer whole messages straight from the receive buffers (64 KiB
// Writes, where io.Copy's own buffer holds 32 KiB) and returns nil at the
// end of data with every byte in order. A writer that fails, or claims
// more than it was given, ends WriteTo with its error and loses nothing:
// the bytes it did not take are the next Read's. A passed read deadline
// fails WriteTo as it fails Read, and Close does not wait for the writer.
func TestRdmanetWriteTo(t *testing.T) {
	rxetest.CheckResources(t)
	c1, c2, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	reader := c2.(*rdmanet.Conn)

	first := make([]byte, 1000)
	pattern(first, 7)
	_, err = c1.Write(first)
	require.NoError(t, err)
	n, err := reader.WriteTo(failingWriter{take: 100})
	require.ErrorIs(t, err, errWriterFailed)
	require.EqualValues(t, 100, n)
	n, err = reader.WriteTo(failingWriter{bad: true})
	require.Error(t, err, "a Writer that claims more than it was given")
	require.Zero(t, n)
	rest := make([]byte, 900)
	_, err = io.ReadFull(c2, rest)
	require.NoError(t, err)
	require.Equal(t, first[100:], rest, "what the writers did not take is read next")

	require.NoError(t, c2.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = reader.WriteTo(io.Discard)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a timeout: %v", err)
	require.NoError(t, c2.SetReadDeadline(time.Time{}))

	body := make([]byte, 1<<20)
	pattern(body, 8)
	wrote := make(chan error, 1)
	go func() {
		var err error
		for off := 0; off < len(body) && err == nil; off += 64 << 10 {
			_, err = c1.Write(body[off : off+64<<10])
		}
		wrote <- errors.Join(err, c1.(*rdmanet.Conn).CloseWrite())
	}()
	var got chunkRecorder
	copied, err := io.Copy(&got, c2)
	require.NoError(t, err, "the end of data is no error")
	require.NoError(t, <-wrote)
	require.EqualValues(t, len(body), copied)
	require.True(t, bytes.Equal(body, got.Bytes()), "the stream differs")
	require.Equal(t, 64<<10, got.largest, "whole messages, not io.Copy's 32 KiB buffer")

	// Close does not wait for a writer WriteTo is feeding; the message
	// that writer holds goes back once it returns (CheckResources).
	c3, c4, stop2, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop2()
	_, err = c3.Write(first)
	require.NoError(t, err)
	w := blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
	closeWhileBlocked(t, c4, "the writer WriteTo was feeding", w.entered, w.release, func() error {
		_, err := c4.(*rdmanet.Conn).WriteTo(w)
		return err
	})
}

// closeWhileBlocked runs run (a copy) until it is blocked in its reader or writer
// (entered), closes c, and fails if Close waits for it; it then releases
// the copy, which must fail with net.ErrClosed.
func closeWhileBlocked(t *testing.T, c net.Conn, blocked string, entered, release chan struct{}, run func() error) {
	t.Helper()
	copying := make(chan error, 1)
	go func() { copying <- run() }()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for " + blocked)
	}
	close(release)
	require.ErrorIs(t, <-copying, net.ErrClosed)
}

// blockingWriter's Write says it was entered, then waits for release.
type blockingWriter struct{ entered, release chan struct{} }

func (w blockingWriter) Write(p []byte) (int, error) {
	close(w.entered)
	<-w.release
	return len(p), nil
}

// ReadFrom (io.Copy to a Conn) has its source read straight into the
// send buffers: the source is handed a whole message's room, not io.Copy's
// 32 KiB. A source's error comes back with the bytes it read, a broken
// source's count sends nothing of that read, and a passed write deadline
// fails the call before the source is read. Close does not wait for a
// source that blocks, and the buffer it fills goes back (CheckResources).
func TestRdmanetReadFrom(t *testing.T) {
	rxetest.CheckResources(t)
	c1, c2, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	writer := c1.(*rdmanet.Conn)
	type readAll struct {
		b   []byte
		err error
	}
	reading := make(chan readAll, 1)
	go func() {
		b, err := io.ReadAll(c2) // the credits: small reads take a message each
		reading <- readAll{b, err}
	}()

	var want bytes.Buffer
	head := make([]byte, 300)
	pattern(head, 9)
	_, err = c1.Write(head) // bytes of a Write go first, whether sent or held
	require.NoError(t, err)
	want.Write(head)
	body := make([]byte, 1<<20+12345)
	pattern(body, 10)
	src := &sizedReader{data: body, sizes: []int{1, 999, 70000, 4096, 1 << 20}}
	copied, err := io.Copy(c1, src)
	require.NoError(t, err, "the source's io.EOF is no error")
	require.EqualValues(t, len(body), copied)
	require.Equal(t, 64<<10, src.largest, "the source fills a message's room, not io.Copy's buffer")
	want.Write(body)

	tail := []byte("read with the rest")
	n, err := writer.ReadFrom(&failingReader{data: tail, err: errReaderFailed})
	require.ErrorIs(t, err, errReaderFailed)
	require.EqualValues(t, len(tail), n, "the bytes read before the error are sent")
	want.Write(tail)
	n, err = writer.ReadFrom(&failingReader{data: tail, bad: true})
	require.Error(t, err, "a Reader that claims more than it was given")
	require.Zero(t, n)

	require.NoError(t, c1.SetWriteDeadline(time.Now().Add(-time.Second)))
	untouched := &failingReader{data: tail}
	_, err = writer.ReadFrom(untouched)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a timeout: %v", err)
	require.Zero(t, untouched.reads, "the source is not read past the deadline")
	require.NoError(t, c1.SetWriteDeadline(time.Time{}))

	require.NoError(t, writer.CloseWrite())
	_, err = writer.ReadFrom(&failingReader{data: tail})
	require.ErrorIs(t, err, msg.ErrWriteClosed)
	got := <-reading
	require.NoError(t, got.err)
	require.True(t, bytes.Equal(want.Bytes(), got.b), "the stream differs: %d bytes, want %d", len(got.b), want.Len())

	// Close does not wait for a source ReadFrom is reading.
	c3, _, stop2, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop2()
	r := blockingReader{entered: make(chan struct{}), release: make(chan struct{})}
	closeWhileBlocked(t, c3, "the source ReadFrom was reading", r.entered, r.release, func() error {
		_, err := c3.(*rdmanet.Conn).ReadFrom(r)
		return err
	})
}

// sizedReader returns data in reads of the given sizes in turn (each at
// most the room it is given), and records the largest room it was given.
type sizedReader struct {
	data    []byte
	sizes   []int
	next    int
	largest int
}

func (r *sizedReader) Read(p []byte) (int, error) {
	r.largest = max(r.largest, len(p))
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.sizes[r.next%len(r.sizes)])], r.data)
	r.next++
	r.data = r.data[n:]
	return n, nil
}

// failingReader returns its data and err in one Read; with bad set it
// claims more bytes than it was given, as a broken Reader might.
type failingReader struct {
	data  []byte
	err   error
	bad   bool
	reads int
}

var errReaderFailed = errors.New("the reader failed")

func (r *failingReader) Read(p []byte) (int, error) {
	r.reads++
	if r.bad {
		return len(p) + 1, nil
	}
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, r.err
}

// blockingReader's Read says it was entered, then waits for release and
// returns a byte.
type blockingReader struct{ entered, release chan struct{} }

func (r blockingReader) Read(p []byte) (int, error) {
	close(r.entered)
	<-r.release
	p[0] = 1
	return 1, nil
}
