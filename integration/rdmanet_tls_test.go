package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// TestRdmanetHTTPS: net/http over crypto/tls over rdmanet, with HTTP/2 and
// with HTTP/1.1: the server serves a tls.NewListener of an rdmanet
// Listener, and the client's Transport dials with rdmanet.Dialer and
// verifies the server's certificate. A request, then 4 at once, each a
// 256 KiB body the handler echoes back, checked byte for byte: over
// HTTP/2 the 4 share the first one's connection (its reader and writer run
// concurrently on it); over HTTP/1.1 each has its own. The client then
// closes its connections, and the server shuts down.
func TestRdmanetHTTPS(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	serverTLS, clientTLS := testTLSConfigs(t)
	for _, h2 := range []bool{true, false} {
		t.Run(fmt.Sprintf("http2_%v", h2), func(t *testing.T) {
			l, err := rdmanet.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"))
			require.NoError(t, err)
			srv := &http.Server{Handler: http.HandlerFunc(httpEcho), TLSConfig: serverTLS.Clone()}
			srv.Protocols = new(http.Protocols)
			srv.Protocols.SetHTTP1(true)
			srv.Protocols.SetHTTP2(h2)
			var conns, open atomic.Int64
			srv.ConnState = func(_ net.Conn, s http.ConnState) {
				switch s {
				case http.StateNew:
					conns.Add(1)
					open.Add(1)
				case http.StateClosed, http.StateHijacked:
					open.Add(-1)
				}
			}
			served := make(chan error, 1)
			go func() { served <- srv.ServeTLS(l, "", "") }()

			var dialed atomic.Int64 // the client's connections not closed yet
			tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&rdmanet.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				dialed.Add(1)
				return &closeCounted{Conn: c, open: &dialed}, nil
			}, TLSClientConfig: clientTLS.Clone(), ForceAttemptHTTP2: h2}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr}
			url := "https://" + l.Addr().String() + "/echo"
			post := func(i int) error {
				body := make([]byte, 256<<10)
				pattern(body, i)
				resp, err := cl.Post(url, "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				got, err := io.ReadAll(resp.Body)
				switch {
				case err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, body):
					return fmt.Errorf("request %d: status %d, %d bytes back, %v", i, resp.StatusCode, len(got), err)
				case resp.TLS == nil || h2 != (resp.ProtoMajor == 2):
					return fmt.Errorf("request %d: %s, TLS %v", i, resp.Proto, resp.TLS != nil)
				}
				return nil
			}
			// The first request alone: HTTP/2's requests then find its
			// connection, rather than each dialing one while none is up.
			require.NoError(t, post(0))
			const requests = 4
			var wg sync.WaitGroup
			errs := make(chan error, requests)
			for i := range requests {
				wg.Go(func() { errs <- post(1 + i) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			if h2 {
				require.EqualValues(t, 1, conns.Load(), "HTTP/2: one connection for every request")
			} else {
				require.LessOrEqual(t, conns.Load(), int64(1+requests))
			}
			// The client closes first, as clients of HTTPS servers do: the
			// server's close_notify then goes to a peer already gone. (A
			// connection the Transport dialed and never used would also
			// hold Shutdown for 5 s, until net/http takes it for idle.)
			tr.CloseIdleConnections()
			require.NoError(t, srv.Shutdown(ctx))
			require.ErrorIs(t, <-served, http.ErrServerClosed)
			// Shutdown may return while a connection's own goroutine is
			// still in its Close: the Close Shutdown makes of an idle
			// connection returns at once from a tls.Conn whose Close has
			// begun. The resource check must come after every one.
			require.Eventually(t, func() bool { return open.Load() == 0 }, 10*time.Second,
				10*time.Millisecond, "the server's connections closed")
			// So may the client's: a connection whose server closed it is
			// closed by the Transport's own goroutine, not by
			// CloseIdleConnections.
			require.Eventually(t, func() bool { return dialed.Load() == 0 }, 10*time.Second,
				10*time.Millisecond, "the client's connections closed")
		})
	}
}

// closeCounted is a net.Conn that counts itself out of open once its
// first Close has returned.
type closeCounted struct {
	net.Conn
	once sync.Once
	open *atomic.Int64
}

func (c *closeCounted) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.open.Add(-1) })
	return err
}

// TestRdmanetTLSCloseDeliversWhatWasWritten: a tls.Conn's Close writes its
// close_notify under a write deadline, then sets the deadline to now and
// closes the rdmanet Conn. Close is no write: the passed deadline cuts
// nothing short. The client writes 2 MiB and closes; the server starts
// reading only after 300 ms, so that Close finds bytes held for its
// credits, and reads every byte, then io.EOF (a reset would fail its
// Read instead). The server's Close then returns nil, as over TCP: its
// close_notify goes to a peer that closed first, and the write that meets
// a peer's close is accepted (rdmanet.Conn.Write).
func TestRdmanetTLSCloseDeliversWhatWasWritten(t *testing.T) {
	rxetest.CheckResources(t)
	serverTLS, clientTLS := testTLSConfigs(t)
	c1, c2, stop, err := rdmanetPair(t)
	require.NoError(t, err)
	defer stop()
	client, server := tls.Client(c1, clientTLS), tls.Server(c2, serverTLS)
	want := make([]byte, 2<<20)
	pattern(want, 3)
	wrote := make(chan error, 1)
	go func() {
		_, err := client.Write(want)
		wrote <- errors.Join(err, client.Close())
	}()
	require.NoError(t, server.Handshake())
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, server.SetReadDeadline(time.Now().Add(30*time.Second)))
	got, err := io.ReadAll(server)
	require.NoError(t, err, "read %d of %d bytes", len(got), len(want))
	require.True(t, bytes.Equal(want, got), "read %d bytes, want %d", len(got), len(want))
	require.NoError(t, <-wrote)
	require.NoError(t, server.Close())
}

// testTLSConfigs makes a self-signed certificate for the name
// rdmanet.test, and the configurations of a server that presents it and
// of a client that trusts it alone and expects that name.
func testTLSConfigs(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	const name = "rdmanet.test"
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	client = &tls.Config{RootCAs: roots, ServerName: name}
	return server, client
}
