package integration

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

const (
	helperRoleEnv = "RDMACM_TEST_HELPER"
	helperArgsEnv = "RDMACM_TEST_HELPER_ARGS"
	// crashBound is how long a survivor may take to notice its peer was
	// killed. On one host the kernel tears the dead process's connections
	// down at once (it sends the disconnect for it); see the README for
	// the bound across a wire.
	crashBound = 5 * time.Second
)

// runHelper is the process the crash tests kill. It never returns on its own.
func runHelper(role string) int {
	args := strings.Fields(os.Getenv(helperArgsEnv))
	ctx := context.Background()
	var err error
	switch role {
	case "client":
		err = helperClient(ctx, args[0], args[1], args[2])
	case "server":
		err = helperServer(ctx, args[0])
	case "rdmanet-writer":
		err = helperRdmanetWriter(ctx, args[0])
	case "rdmanet-lean-server":
		err = helperLeanHTTPServer(ctx, args[0])
	default:
		err = fmt.Errorf("unknown helper role %q", role)
	}
	fmt.Fprintln(os.Stderr, "helper:", err)
	return 1
}

// helperClient streams RPCs, large messages (rendezvous) and RDMA writes
// until it is killed.
func helperClient(ctx context.Context, rpcAddr, dataAddr, writeAddr string) error {
	cl, err := msg.DialClient(ctx, rpcAddr)
	if err != nil {
		return err
	}
	data, err := msg.Dial(ctx, dataAddr)
	if err != nil {
		return err
	}
	// The descriptor's receive is posted before connecting: the server
	// sends it at once.
	var pool *bufpool.Pool
	ep, err := cm.Dial(ctx, writeAddr, receivesOnSetup(&pool, 4096, 2, 1))
	if err != nil {
		return err
	}
	// On iWARP the dialer speaks first (docs/DESIGN.md): a one-byte hello,
	// to which the server answers with its region's descriptor.
	hello, _ := pool.TryGet()
	if err := ep.PostSend(nil, hello, 1); err != nil {
		return err
	}
	var remote bufpool.Remote
	for got := false; !got; {
		c := <-ep.Completions()
		switch {
		case c.Err != nil:
			return fmt.Errorf("no region descriptor: %w", c.Err)
		case c.Op != endpoint.OpRecv:
			pool.Put(c.Buffer) // the hello, sent
		case remote.UnmarshalBinary(c.Buffer.Bytes()[:c.Len]) != nil:
			return fmt.Errorf("no region descriptor in %d bytes", c.Len)
		default:
			got = true
		}
	}
	fmt.Println("streaming")
	errs := make(chan error, 6)
	for g := range 4 {
		go func() {
			for i := 0; ; i++ {
				if _, err := cl.Call(ctx, "echo", fmt.Appendf(nil, "%d-%d", g, i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() {
		big := make([]byte, 64<<10)
		for {
			if err := data.Send(ctx, big); err != nil {
				errs <- err
				return
			}
		}
	}()
	go func() {
		wb, _ := pool.TryGet()
		for i := uint64(1); ; i++ {
			binary.LittleEndian.PutUint64(wb.Bytes(), i)
			if err := ep.PostWrite(nil, wb, 8, remote); err != nil {
				errs <- err
				return
			}
			if c := <-ep.Completions(); c.Err != nil {
				errs <- c.Err
				return
			}
		}
	}()
	return <-errs
}

// helperServer serves RPCs until it is killed.
func helperServer(ctx context.Context, addr string) error {
	l, err := msg.Listen(ctx, addr)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	return msg.NewServer(rpcHandler).Serve(ctx, l)
}

// startHelper runs this test binary as a helper process and waits for its
// first line on stdout.
func startHelper(t *testing.T, role string, want string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperRoleEnv+"="+role, helperArgsEnv+"="+strings.Join(args, " "))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the helper said nothing")
	require.Equal(t, want, strings.TrimSpace(line))
	return cmd
}

// TestClientKilledMidStream: a client process streaming RPCs, rendezvous
// messages and RDMA writes is killed with SIGKILL. The server notices on
// every connection within crashBound, frees everything, and serves a new
// client.
func TestClientKilledMidStream(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	host := rxetest.Addr(t)
	listen := func() *msg.Listener {
		l, err := msg.Listen(ctx, net.JoinHostPort(host, "0"))
		require.NoError(t, err)
		return l
	}
	var calls atomic.Int64
	srv := msg.NewServer(func(ctx context.Context, method string, req []byte) ([]byte, error) {
		calls.Add(1)
		return rpcHandler(ctx, method, req)
	})
	rpcL := listen()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, rpcL) }()
	t.Cleanup(func() { // also when a check fails midway, before the resources are counted
		shutdown, cancel := context.WithTimeout(context.Background(), crashBound)
		defer cancel()
		srv.Shutdown(shutdown)
	})
	dataL := listen()
	defer dataL.Close()
	writeL, err := cm.Listen(ctx, net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	defer writeL.Close()

	var wg sync.WaitGroup
	var dataMsgs atomic.Int64
	var dataErr error // the data reader's last Recv: read after wg.Wait
	dataReady := make(chan *msg.Conn, 1)
	type writeSide struct {
		ep     *endpoint.Endpoint
		region *bufpool.Region
	}
	writeReady := make(chan writeSide, 1)
	wg.Add(2)
	go func() {
		defer wg.Done()
		c, err := dataL.Accept(ctx)
		if err != nil {
			close(dataReady)
			return
		}
		dataReady <- c
		for {
			if _, err := c.Recv(ctx); err != nil {
				dataErr = err
				return
			}
			dataMsgs.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		var helloPool *bufpool.Pool
		ep, err := writeL.Accept(ctx, receivesOnSetup(&helloPool, 64, 1, 1))
		if err != nil {
			if helloPool != nil {
				helloPool.Close()
			}
			close(writeReady)
			return
		}
		hello := <-ep.Completions() // the dialer speaks first; then the descriptor
		if hello.Buffer != nil {
			helloPool.Put(hello.Buffer)
		}
		helloPool.Close()
		region, _ := bufpool.NewRegion(ep.PD(), 4096, bufpool.RemoteWrite)
		pool, _ := bufpool.New(ep.PD(), bufpool.Size(64), bufpool.Count(1))
		b, _ := pool.TryGet()
		enc, _ := region.Remote().AppendBinary(b.Bytes()[:0])
		ep.PostSend(nil, b, len(enc))
		<-ep.Completions()
		pool.Put(b)
		pool.Close()
		writeReady <- writeSide{ep, region}
	}()
	// When a check fails midway, what was accepted is closed before the
	// resource check counts: this cleanup runs after startHelper's has
	// killed the helper, and so after the data reader has seen the end.
	var dataConn *msg.Conn
	var ws writeSide
	t.Cleanup(func() {
		wg.Wait()
		select {
		case dataConn = <-dataReady:
		default:
		}
		select {
		case ws = <-writeReady:
		default:
		}
		if dataConn != nil {
			dataConn.Close()
		}
		if ws.ep != nil {
			ws.ep.CloseAndDrain(nil)
			ws.region.Close()
		}
	})
	child := startHelper(t, "client", "streaming", rpcL.Addr().String(), dataL.Addr().String(), writeL.Addr().String())
	dataConn = <-dataReady
	ws = <-writeReady
	require.NotNil(t, dataConn)
	require.NotNil(t, ws.ep)
	writeEP, region := ws.ep, ws.region
	writes := func() uint64 { return binary.LittleEndian.Uint64(region.Bytes()) } // the helper's RDMA writes count up
	require.Eventually(t, func() bool {
		return calls.Load() > 100 && dataMsgs.Load() > 5 && writes() > 100
	}, 30*time.Second, 10*time.Millisecond, "the stream never got going")
	t.Logf("before the kill: %d calls, %d 64 KiB messages, %d writes", calls.Load(), dataMsgs.Load(), writes())

	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	for name, done := range map[string]<-chan struct{}{"rendezvous conn": dataConn.Done(), "write endpoint": writeEP.Done()} {
		select {
		case <-done:
			t.Logf("%s noticed after %v", name, time.Since(killed))
		case <-time.After(crashBound):
			t.Fatalf("%s did not notice the kill within %v", name, crashBound)
		}
	}
	wg.Wait() // the data reader saw the end
	require.Error(t, dataErr)
	require.NotErrorIs(t, dataErr, io.EOF, "a killed peer said no goodbye: its end is an error, not EOF")
	// Whichever comes first, the device's flush or the CM's disconnect
	// event (siw often flushes first, rxe reports first), the end says why.
	require.ErrorIs(t, dataErr, cm.ErrPeerDisconnected)
	require.ErrorIs(t, dataConn.Err(), cm.ErrPeerDisconnected)
	require.ErrorIs(t, writeEP.Err(), cm.ErrPeerDisconnected)
	for _, err := range []error{dataErr, dataConn.Err(), writeEP.Err()} {
		require.NotErrorIs(t, err, net.ErrClosed, "net.ErrClosed is for this side's Close")
	}
	dataConn.Close()
	closeAndDrain(t, writeEP)
	require.NoError(t, region.Close())

	// The RPC server serves a new client.
	cl, err := msg.DialClient(ctx, rpcL.Addr().String())
	require.NoError(t, err)
	resp, err := cl.Call(ctx, "echo", []byte("after the crash"))
	require.NoError(t, err)
	require.Equal(t, "after the crash", string(resp))
	require.NoError(t, cl.Close())
	shutdown, cancel := context.WithTimeout(ctx, crashBound)
	defer cancel()
	require.NoError(t, srv.Shutdown(shutdown), "the dead client's calls ended")
	require.ErrorIs(t, <-served, msg.ErrShutdown)
}

// busyCallers is an RPC server process (the helper's "server" role, on a
// port of this process's picked by offset) and a client of it whose 8
// callers call until a call fails, each sending its failure, with the
// time, on failed. It returns once 200 calls succeeded; calls counts
// them. The client is closed and the process killed at cleanup.
func busyCallers(t *testing.T, ctx context.Context, offset int) (server *exec.Cmd, addr string, cl *msg.Client, calls *atomic.Int64, failed <-chan callFailure) {
	t.Helper()
	port := fmt.Sprint(21000 + (os.Getpid()+offset)%10000)
	addr = net.JoinHostPort(rxetest.Addr(t), port)
	server = startHelper(t, "server", "listening", addr)
	cl, err := msg.DialClient(ctx, addr)
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	calls = new(atomic.Int64)
	results := make(chan callFailure, 8)
	for g := range 8 {
		go func() {
			for i := 0; ; i++ {
				if _, err := cl.Call(ctx, "echo", fmt.Appendf(nil, "%d-%d", g, i)); err != nil {
					results <- callFailure{time.Now(), err}
					return
				}
				calls.Add(1)
			}
		}()
	}
	require.Eventually(t, func() bool { return calls.Load() > 200 }, 30*time.Second, 10*time.Millisecond)
	return server, addr, cl, calls, results
}

// callFailure is a busy caller's failed call: when, and why.
type callFailure struct {
	at  time.Time
	err error
}

// TestServerKilledUnderClient: a server process is killed while callers
// are busy; every call returns an error within crashBound; none hangs.
// A server restarted at once on the same port listens there (no
// "address in use" from what the killed one left) and serves a new
// client.
func TestServerKilledUnderClient(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	child, addr, cl, calls, failed := busyCallers(t, ctx, 0)
	now := time.Now()
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	for range 8 {
		select {
		case f := <-failed:
			require.Less(t, f.at.Sub(now), crashBound)
			require.ErrorIs(t, f.err, cm.ErrPeerDisconnected, "the call's error says why")
		case <-time.After(crashBound + time.Second):
			t.Fatal("a call still hangs after the server was killed")
		}
	}
	t.Logf("%d calls before the kill; all 8 callers failed within %v", calls.Load(), time.Since(now))
	_, err := cl.Call(ctx, "echo", nil)
	require.ErrorIs(t, err, cm.ErrPeerDisconnected, "later calls fail at once")

	restarted := time.Now()
	startHelper(t, "server", "listening", addr)
	t.Logf("the restarted server listened on %s after %v", addr, time.Since(restarted))
	again, err := msg.DialClient(ctx, addr)
	require.NoError(t, err, "a client of the restarted server")
	defer again.Close()
	got, err := again.Call(ctx, "echo", []byte("after the restart"))
	require.NoError(t, err)
	require.Equal(t, "after the restart", string(got))
}

// frozenBound is how long a caller of a frozen server may wait for its
// call to fail: msg's default keepalive timeout (10 s), after which the
// silent peer ends the connection, and time to notice it.
const frozenBound = 15 * time.Second

// TestServerFrozenUnderClient: a server process is stopped (SIGSTOP) while
// callers are busy. Its kernel still acknowledges what the client sends,
// so only msg's keepalive can tell: every call fails within frozenBound
// with an error matching msg.ErrPeerSilent, later calls fail at once, and
// the client frees everything. Once the server runs again (SIGCONT), it
// finds that connection over and serves a new one.
func TestServerFrozenUnderClient(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	child, addr, cl, calls, failed := busyCallers(t, ctx, 1)
	stopped := time.Now()
	require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
	defer child.Process.Signal(syscall.SIGCONT)
	for range 8 {
		select {
		case f := <-failed:
			require.ErrorIs(t, f.err, msg.ErrPeerSilent, "the call's error says why")
		case <-time.After(frozenBound - time.Since(stopped)):
			t.Fatal("a call still hangs after the server froze")
		}
	}
	t.Logf("%d calls before the stop; all 8 callers failed within %v", calls.Load(), time.Since(stopped))
	_, err := cl.Call(ctx, "echo", nil)
	require.ErrorIs(t, err, msg.ErrPeerSilent, "later calls fail at once")
	require.NoError(t, cl.Close())

	require.NoError(t, child.Process.Signal(syscall.SIGCONT))
	again, err := msg.DialClient(ctx, addr)
	require.NoError(t, err, "the server, running again, takes a new connection")
	defer again.Close()
	resp, err := again.Call(ctx, "echo", []byte("awake"))
	require.NoError(t, err)
	require.Equal(t, "awake", string(resp))
}
