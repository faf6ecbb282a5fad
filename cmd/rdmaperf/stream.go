package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// The stream tests measure package rdmanet the way librdmacm's rstream
// measures rsockets, in its custom mode: each iteration the client writes
// transfers of -size bytes, then reads as many back; the server reads them
// all, then writes them back. stream_bw is one iteration of -iters
// transfers (rstream -I 1 -C iters), stream_lat -iters iterations of one
// transfer (rstream -I iters -C 1). Both report rstream's figures: bytes
// both ways over the time (MiB/s), and the time per transfer, one way
// (µs, an average, as rstream's usec/xfer; what -compare compares).
// stream_lat also times each round trip, as send_lat does, for the median
// and the tail that the average hides.

// streamShape is the test's iterations and transfers per iteration.
func streamShape(cfg config) (iterations, transfers int) {
	if cfg.test == "stream_lat" {
		return cfg.iters, 1
	}
	return 1, cfg.iters
}

// streamSync is rstream's handshake before the clock starts: 16 bytes
// each way.
const streamSync = 16

func rdmanetOptions(cfg config) rdmanet.Option {
	return rdmanet.WithMsgOptions(msg.WithCMOptions(cfg.polling()))
}

// serveStream is the server side of a stream test, for one connection.
func serveStream(ctx context.Context, cfg config) error {
	l, err := rdmanet.Listen(ctx, cfg.addr, rdmanetOptions(cfg))
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("ready")
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	buf := make([]byte, max(cfg.size, streamSync))
	if err := streamRecv(c, buf[:streamSync], 1); err != nil {
		return err
	}
	if err := streamSend(c, buf[:streamSync], 1); err != nil {
		return err
	}
	iterations, transfers := streamShape(cfg)
	for range iterations {
		if err := streamRecv(c, buf[:cfg.size], transfers); err != nil {
			return err
		}
		if err := streamSend(c, buf[:cfg.size], transfers); err != nil {
			return err
		}
	}
	_, err = c.Read(buf) // until the client closes
	if err == io.EOF {
		return nil
	}
	return err
}

// streamClient is the client side: it times the iterations.
func streamClient(ctx context.Context, cfg config) (result, error) {
	c, err := rdmanet.Dial(ctx, cfg.addr, rdmanetOptions(cfg))
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	buf := make([]byte, max(cfg.size, streamSync))
	if err := streamSend(c, buf[:streamSync], 1); err != nil {
		return result{}, err
	}
	if err := streamRecv(c, buf[:streamSync], 1); err != nil {
		return result{}, err
	}
	iterations, transfers := streamShape(cfg)
	stamps := make([]time.Time, 0, iterations+1)
	for range iterations {
		stamps = append(stamps, time.Now())
		if err := streamSend(c, buf[:cfg.size], transfers); err != nil {
			return result{}, err
		}
		if err := streamRecv(c, buf[:cfg.size], transfers); err != nil {
			return result{}, err
		}
	}
	stamps = append(stamps, time.Now())
	elapsed := stamps[len(stamps)-1].Sub(stamps[0])
	xfers := 2 * iterations * transfers
	r := result{Test: cfg.test, Size: cfg.size, Iters: cfg.iters,
		BW: float64(xfers*cfg.size) / elapsed.Seconds() / (1 << 20)}
	if cfg.test == "stream_lat" {
		summarize(gaps(stamps, 2), &r) // one way: half of each round trip
	}
	r.Avg = float64(elapsed.Microseconds()) / float64(xfers)
	st := c.Stats()
	r.Messages = st.MessagesSent
	r.PerDoorbell, r.PerWakeup = st.Endpoint.SendsPerDoorbell(), st.Endpoint.CompletionsPerEvent()
	return r, nil
}

func streamSend(c net.Conn, b []byte, n int) error {
	for range n {
		if _, err := c.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func streamRecv(c net.Conn, b []byte, n int) error {
	for range n {
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
	}
	return nil
}

// rstreamArgs are rstream's flags for a stream test, in its shape, on
// port: its blocking calls (-T b) when mode is "event", its default
// non-blocking ones otherwise.
func rstreamArgs(test, mode string, port, size, iters int) []string {
	iterations, transfers := streamShape(config{test: test, iters: iters})
	args := []string{"-p", strconv.Itoa(port), "-S", strconv.Itoa(size),
		"-I", strconv.Itoa(iterations), "-C", strconv.Itoa(transfers)}
	if mode == "event" {
		args = append(args, "-T", "b")
	}
	return args
}

// runRstream runs librdmacm's rstream server in the background and its
// client on host, in the stream test's shape and mode (rstreamArgs), and
// returns the client's MiB/s, or usec/xfer for stream_lat.
func runRstream(ctx context.Context, test, mode, host string, port, size, iters int) (float64, error) {
	args := rstreamArgs(test, mode, port, size, iters)
	lat := test == "stream_lat"
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	srv := exec.CommandContext(ctx, "rstream", append([]string{"-b", host}, args...)...)
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	var out []byte
	var err error
	for range 10 {
		time.Sleep(300 * time.Millisecond) // rstream says nothing when it listens
		if out, err = exec.CommandContext(ctx, "rstream", append([]string{"-s", host}, args...)...).CombinedOutput(); err == nil {
			break
		}
	}
	if err != nil {
		return 0, fmt.Errorf("rstream: %v: %s", err, out)
	}
	return parseRstream(string(out), size, lat)
}

// parseRstream reads the line under rstream's header (name bytes xfers
// iters total time Gb/sec usec/xfer) of transfers of size bytes:
// usec/xfer for latency, and for bandwidth size bytes per usec/xfer as
// MiB/s. Its Gb/sec is the same figure rounded to 0.01 (1.19 MiB/s), too
// coarse for small writes on a slow device; usec/xfer keeps 0.01 µs.
func parseRstream(text string, size int, lat bool) (float64, error) {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "name") || i+1 >= len(lines) {
			continue
		}
		f := strings.Fields(lines[i+1])
		if len(f) != 8 {
			break
		}
		usec, err := strconv.ParseFloat(f[7], 64)
		if err != nil || lat {
			return usec, err
		}
		if usec <= 0 {
			return 0, fmt.Errorf("rstream took %v usec/xfer:\n%s", usec, text)
		}
		return float64(size) / usec * 1e6 / (1 << 20), nil
	}
	return 0, fmt.Errorf("no result in rstream's output:\n%s", text)
}
