package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"golang.org/x/net/nettest"

	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// rdmanetPair is a connected pair of rdmanet conns on the device.
func rdmanetPair(t *testing.T) (c1, c2 net.Conn, stop func(), err error) {
	ctx := context.Background()
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
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
// (golang.org/x/net/nettest) on rdmanet conns.
func TestRdmanetConformance(t *testing.T) {
	rxetest.CheckResources(t)
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return rdmanetPair(t) })
}

// TestRdmanetHTTP: net/http unchanged over rdmanet: a server on an rdmanet
// Listener, clients whose Transport dials with rdmanet.Dialer and keeps
// connections alive, each request a 1 MiB body the handler echoes back,
// checked byte for byte. (8 clients: siw refuses more queues per process
// than 64 connections' both sides need.)
func TestRdmanetHTTP(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(body)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	const clients, requests = 8, 4
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
	require.NoError(t, srv.Shutdown(ctx))
	require.ErrorIs(t, <-served, http.ErrServerClosed)
}

// TestRdmanetCloseWrite: half-close as with TCP. The client writes 1 MiB
// and calls CloseWrite; the server echoes until io.EOF and then closes;
// the client reads back every byte, then io.EOF. A Write after CloseWrite
// fails with msg.ErrWriteClosed.
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
}
