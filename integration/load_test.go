package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/msg"
)

// loadMessage is conn id, sequence number, filler, and a CRC-32 of the rest.
func loadMessage(b []byte, conn, seq int) {
	binary.LittleEndian.PutUint32(b[0:], uint32(conn))
	binary.LittleEndian.PutUint64(b[4:], uint64(seq))
	for i := 12; i < len(b)-4; i++ {
		b[i] = byte(conn*31 + seq*7 + i)
	}
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.ChecksumIEEE(b[:len(b)-4]))
}

func checkLoadMessage(b []byte, conn, seq int) error {
	if len(b) < 16 {
		return fmt.Errorf("conn %d: message %d has %d bytes", conn, seq, len(b))
	}
	if crc32.ChecksumIEEE(b[:len(b)-4]) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return fmt.Errorf("conn %d: message %d corrupted (checksum)", conn, seq)
	}
	if c, s := int(binary.LittleEndian.Uint32(b)), int(binary.LittleEndian.Uint64(b[4:])); c != conn || s != seq {
		return fmt.Errorf("conn %d: expected message %d, got conn %d message %d (lost, duplicated or reordered)", conn, seq, c, s)
	}
	return nil
}

// TestLoad64Connections: 64 connections at once, 2,500 messages each (150
// times the credits), every one checked for its sequence number and
// checksum. The first error cancels the rest. Under the race detector,
// which runs the same paths several times slower, each sends 500 (30
// times the credits): the detector needs the connections at once, not
// the volume, which the suite's run without it (make test-norace) keeps.
func TestLoad64Connections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	const size = 64
	msgs := 2500
	if raceEnabled {
		msgs = 500
	}
	const conns = 64
	l, err := msg.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), msg.WithRecvDepth(16), msg.WithBufferSize(256))
	require.NoError(t, err)
	defer l.Close()
	errs := make(chan error, 2*conns)
	report := func(err error) {
		if err != nil {
			cancel()
		}
		errs <- err
	}
	var wg sync.WaitGroup
	start := time.Now()
	for range conns {
		wg.Add(1)
		go func() { // server side: receive and check
			defer wg.Done()
			c, err := l.Accept(ctx)
			if err != nil {
				report(err)
				return
			}
			defer c.Close()
			var id int
			for seq := range msgs {
				m, err := c.RecvMessage(ctx)
				if err != nil {
					report(fmt.Errorf("receiving message %d: %w", seq, err))
					return
				}
				if seq == 0 {
					id = int(binary.LittleEndian.Uint32(m.Payload))
				}
				err = checkLoadMessage(m.Payload, id, seq)
				m.Release()
				if err != nil {
					report(err)
					return
				}
			}
			// Tell the client everything arrived, so it closes after.
			report(c.Send(ctx, []byte("all received")))
		}()
	}
	for i := range conns {
		wg.Add(1)
		go func() { // client side: send in order
			defer wg.Done()
			c, err := msg.Dial(ctx, l.Addr().String(), msg.WithRecvDepth(16), msg.WithBufferSize(256))
			if err != nil {
				report(err)
				return
			}
			defer c.Close()
			b := make([]byte, size)
			for seq := range msgs {
				loadMessage(b, i, seq)
				if err := c.Send(ctx, b); err != nil {
					report(fmt.Errorf("conn %d: sending %d: %w", i, seq, err))
					return
				}
			}
			_, err = c.Recv(ctx)
			report(err)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	elapsed := time.Since(start)
	t.Logf("%d connections x %d messages of %d B, all in order and intact, in %v (%.0f messages/s)",
		conns, msgs, size, elapsed.Round(time.Millisecond), float64(conns*msgs)/elapsed.Seconds())
}

// TestConnectCloseCycles: 1,000 connect/accept/close cycles leave no
// growth in goroutines, file descriptors, heap or verbs resources.
func TestConnectCloseCycles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rxetest.CheckResources(t)
	// Both sides log the CM's events and the listener's failed accepts,
	// which Accept itself only logs: a failed dial prints the last ones.
	var cmLog tailLog
	logTo := func(side string) cm.Option {
		return cm.WithLogger(zerolog.New(&cmLog).Level(zerolog.DebugLevel).With().Str("side", side).Logger())
	}
	l, err := cm.Listen(ctx, net.JoinHostPort(rxetest.Addr(t), "0"), logTo("listener"))
	require.NoError(t, err)
	defer l.Close()
	type accepted struct {
		ep  *endpoint.Endpoint
		err error
	}
	cycle := func() {
		got := make(chan accepted, 1)
		go func() {
			ep, err := l.Accept(ctx)
			got <- accepted{ep, err}
		}()
		// On iWARP, cm.Dial itself dials again when rdma_cm picked a
		// local port that still has a TCP connection to this listener.
		ep, err := cm.Dial(ctx, l.Addr().String(), logTo("dialer"))
		if err != nil {
			t.Logf("TCP sockets on the listener's port as the dial failed:\n%s", tcpSocketsOnPort(t, l.Addr()))
			select {
			case a := <-got:
				t.Logf("the listener's Accept: %v", a.err)
			case <-time.After(time.Second):
				t.Logf("the listener's Accept was still waiting a second later")
			}
			t.Logf("the last CM log lines of both sides:\n%s", cmLog.String())
		}
		require.NoError(t, err)
		a := <-got
		require.NoError(t, a.err)
		// Both ends close at once, but only once both have the
		// connection. On iWARP the accepting side has it first (its
		// ESTABLISHED comes as it sends the MPA reply), and closing it
		// then can reset the dialer's handshake before the dialer has
		// read the reply: Dial fails with ECONNRESET, an ending
		// TestAcceptsCancelledMidHandshake covers.
		closed := make(chan error, 1)
		go func() { closed <- a.ep.CloseAndDrain(nil) }()
		require.NoError(t, ep.CloseAndDrain(nil))
		require.NoError(t, <-closed)
	}
	measure := func() (goroutines, fds int, heap uint64, res rxetest.Resources) {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		entries, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		// goroutines wind down asynchronously after Close returns
		time.Sleep(50 * time.Millisecond)
		return runtime.NumGoroutine(), len(entries), ms.HeapInuse, rxetest.CountResources(t)
	}
	for range 50 { // warm up: caches, pools, the first device context
		cycle()
	}
	g0, f0, h0, r0 := measure()
	start := time.Now()
	for range 1000 {
		cycle()
	}
	elapsed := time.Since(start)
	g1, f1, h1, r1 := measure()
	t.Logf("1000 cycles in %v; goroutines %d -> %d, fds %d -> %d, heap %d KiB -> %d KiB, verbs %v -> %v",
		elapsed.Round(time.Millisecond), g0, g1, f0, f1, h0>>10, h1>>10, r0, r1)
	require.Equal(t, g0, g1, "goroutines grew")
	require.Equal(t, f0, f1, "file descriptors grew")
	require.Equal(t, r0, r1, "verbs resources grew")
	require.Less(t, int64(h1)-int64(h0), int64(2<<20), "heap grew by more than 2 MiB over 1000 cycles")
}

// tcpSocketsOnPort is /proc/net/tcp's header and its lines for sockets whose
// local or remote port is addr's (iWARP's connections are TCP connections).
func tcpSocketsOnPort(t *testing.T, addr net.Addr) string {
	_, port, err := net.SplitHostPort(addr.String())
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(table)), "\n")
	suffix := fmt.Sprintf(":%04X", n)
	kept := lines[:1]
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		if len(fields) > 2 && (strings.HasSuffix(fields[1], suffix) || strings.HasSuffix(fields[2], suffix)) {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

// tailLog keeps the last tailLines lines a logger wrote (zerolog writes
// one line per call), safe for concurrent writes.
type tailLog struct {
	mu    sync.Mutex
	lines [tailLines]string
	next  int
}

const tailLines = 64

func (l *tailLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines[l.next%tailLines] = strings.TrimRight(string(p), "\n")
	l.next++
	return len(p), nil
}

func (l *tailLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i := max(0, l.next-tailLines); i < l.next; i++ {
		b.WriteString(l.lines[i%tailLines])
		b.WriteByte('\n')
	}
	return b.String()
}
