package integration

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdmacm/internal/rdmacat"
	"github.com/go-rdma/rdmacm/internal/rxetest"
)

// TestRdmacat: the rdmacat command's code, both ends in this process. The
// dialer sends 8 MiB and asks for progress; the listener sends 100 KiB
// back; each side's standard output holds exactly the other's input, and
// both exit 0 after the half-closes. Bad usage exits 2, a dial to the closed listener's port 1.
func TestRdmacat(t *testing.T) {
	ctx := testContext(t)
	rxetest.CheckResources(t)
	there, back := make([]byte, 8<<20), make([]byte, 100<<10)
	pattern(there, 1)
	pattern(back, 2)

	errR, errW := io.Pipe()
	var listenerOut bytes.Buffer
	listened := make(chan int, 1)
	go func() {
		listened <- rdmacat.Main(ctx, []string{"-v", "-l", net.JoinHostPort(rxetest.Addr(t), "0")},
			bytes.NewReader(back), &listenerOut, errW)
		errW.Close()
	}()
	stderr := bufio.NewScanner(errR)
	require.True(t, stderr.Scan(), "the listener said nothing")
	addr, ok := strings.CutPrefix(stderr.Text(), "rdmacat: listening on ")
	require.True(t, ok, "first line: %q", stderr.Text())
	listenerLog := make(chan string, 1)
	go func() {
		var log strings.Builder
		for stderr.Scan() {
			log.WriteString(stderr.Text() + "\n")
		}
		listenerLog <- log.String()
	}()

	var dialerOut, dialerErr bytes.Buffer
	require.Equal(t, 0, rdmacat.Main(ctx, []string{"-p", addr}, bytes.NewReader(there), &dialerOut, &dialerErr),
		"dialer: %s", dialerErr.String())
	listenerCode := <-listened
	log := <-listenerLog // the listener's stderr, complete once it returned
	require.Equal(t, 0, listenerCode, "listener: %s", log)
	require.True(t, bytes.Equal(there, listenerOut.Bytes()), "listener got %d bytes of %d", listenerOut.Len(), len(there))
	require.True(t, bytes.Equal(back, dialerOut.Bytes()), "dialer got %d bytes of %d", dialerOut.Len(), len(back))
	require.Contains(t, dialerErr.String(), "rdmacat: sent 8.0 MiB")
	require.Contains(t, dialerErr.String(), "received 100.0 KiB")
	require.Contains(t, log, "rdmacat: connected: ")

	var out, errs bytes.Buffer
	require.Equal(t, 2, rdmacat.Main(ctx, nil, strings.NewReader(""), &out, &errs))
	require.Contains(t, errs.String(), "usage: rdmacat")
	errs.Reset()
	require.Equal(t, 1, rdmacat.Main(ctx, []string{addr}, strings.NewReader("x"), &out, &errs))
	require.Contains(t, errs.String(), "rdmacat: dial rdma")
	require.Zero(t, out.Len())
}
