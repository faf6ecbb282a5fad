// Package rdmacat is the command rdmacat: netcat over an rdmanet
// connection. It lives here rather than in cmd/rdmacat so that the device
// tests run the command's own code in process.
package rdmacat

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdmacm/rdmanet"
)

const usage = `usage: rdmacat [-d] [-p] [-v] host:port       connect
       rdmacat -l [-d] [-p] [-v] host:port    listen, serve one connection

Standard input goes to the connection and the connection to standard
output. At the end of standard input rdmacat half-closes (the peer reads
io.EOF) and goes on reading until the peer closes too. With -d it reads
no standard input and half-closes at once: it only receives.
`

// Main runs rdmacat with args (without the program name) and returns its
// exit status: 0 when both directions ended in order, 1 on an error, 2 on
// bad usage. It stops when ctx ends.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rdmacat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	listen := fs.Bool("l", false, "listen on host:port and serve one connection")
	progress := fs.Bool("p", false, "show bytes and rates on stderr, every second and at the end")
	verbose := fs.Bool("v", false, "say on stderr where it listens and whom it is connected to")
	noStdin := fs.Bool("d", false, "do not read standard input: half-close at once and only receive")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	addr := fs.Arg(0)
	if *noStdin {
		stdin = eof{}
	}
	logf := func(format string, a ...any) {
		if *verbose {
			fmt.Fprintf(stderr, "rdmacat: "+format+"\n", a...)
		}
	}
	conn, err := connect(ctx, *listen, addr, logf)
	if err != nil {
		fmt.Fprintln(stderr, "rdmacat:", err)
		return 1
	}
	logf("connected: %v -> %v", conn.LocalAddr(), conn.RemoteAddr())
	var c counters
	if *progress {
		stop := c.report(stderr)
		defer stop()
	}
	if err := cat(ctx, conn, stdin, stdout, &c); err != nil {
		fmt.Fprintln(stderr, "rdmacat:", err)
		return 1
	}
	return 0
}

// connect dials addr, or listens on it and accepts one connection.
func connect(ctx context.Context, listen bool, addr string, logf func(string, ...any)) (*rdmanet.Conn, error) {
	if !listen {
		return rdmanet.Dial(ctx, addr)
	}
	l, err := rdmanet.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	logf("listening on %v", l.Addr())
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	c, err := l.Accept()
	if err != nil {
		return nil, err
	}
	return c.(*rdmanet.Conn), nil
}

// cat copies stdin to conn (then half-closes it) and conn to stdout, until
// both directions ended, and closes conn. The first error ends both, and so
// does ctx; either resets the connection (SetLinger(0)), so that the peer
// gets an error rather than the end of the data, and cannot take what it
// received for the whole. The bytes pass through no buffer of cat's: stdin
// reads into conn's send buffers (ReadFrom), and stdout is handed its
// receive buffers (WriteTo).
//
// Once the connection failed or ctx ended, cat returns without waiting for
// a read of stdin in progress: nothing interrupts a read of a terminal or
// of a pipe nobody writes to, and rdmacat must not hang on its input after
// an interrupt or a peer that crashed. That read's goroutine ends when the
// read returns (the process exits first, in the command). Only after the
// peer's orderly end of data does cat wait for stdin's end, as a
// half-closed connection still carries this side's bytes.
func cat(ctx context.Context, conn *rdmanet.Conn, stdin io.Reader, stdout io.Writer, c *counters) error {
	// Every Close resets but the last one of a whole transfer, which puts
	// the goodbye back below.
	conn.SetLinger(0)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// Buffered: a sender left behind in a read of stdin sends when it ends.
	sent, received := make(chan error, 1), make(chan error, 1)
	go func() { sent <- send(conn, stdin, c) }()
	go func() { received <- receive(conn, stdout, c) }()
	var sendErr, recvErr error
	both := false // both directions ended, not only the one cat waited for first
	select {
	case sendErr = <-sent:
		if sendErr != nil {
			conn.Close() // the other direction ends too
		}
		recvErr, both = <-received, true
	case recvErr = <-received:
		if recvErr != nil {
			conn.Close()
			break
		}
		select {
		case sendErr = <-sent:
			both = true
		case <-ctx.Done():
		}
	}
	err := errors.Join(sendErr, recvErr)
	if err == nil && both {
		conn.SetLinger(-1) // both directions ended in order: say goodbye
	}
	closeErr := conn.Close()
	switch {
	case ctx.Err() != nil && (err != nil || !both):
		return ctx.Err() // what ending ctx cut short
	case err != nil:
		return err
	}
	return closeErr
}

// send copies stdin to conn, then half-closes it.
func send(conn *rdmanet.Conn, stdin io.Reader, c *counters) error {
	if _, err := conn.ReadFrom(countingReader{stdin, &c.sent}); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	if err := conn.CloseWrite(); err != nil {
		return fmt.Errorf("half-closing: %w", err)
	}
	return nil
}

// receive copies conn to stdout until the peer's end of data.
func receive(conn *rdmanet.Conn, stdout io.Writer, c *counters) error {
	if _, err := conn.WriteTo(countingWriter{stdout, &c.received}); err != nil {
		return fmt.Errorf("receiving: %w", err)
	}
	return nil
}

// eof is standard input under -d: it ends at once.
type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }

// counters are the bytes moved each way.
type counters struct{ sent, received atomic.Int64 }

// countingReader counts what stdin gave, as it is handed to the connection.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (cr countingReader) Read(p []byte) (int, error) {
	n, err := cr.r.Read(p)
	cr.n.Add(int64(n))
	return n, err
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (cw countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n.Add(int64(n))
	return n, err
}

// report writes a progress line to w every second, rewriting it in place,
// until the returned stop, which writes the final line.
func (c *counters) report(w io.Writer) (stop func()) {
	start := time.Now()
	line := func(end string) {
		secs := max(time.Since(start).Seconds(), 1e-9)
		sent, received := c.sent.Load(), c.received.Load()
		fmt.Fprintf(w, "\rrdmacat: sent %s (%s/s), received %s (%s/s) in %.1f s%s",
			size(sent), size(int64(float64(sent)/secs)), size(received), size(int64(float64(received)/secs)), secs, end)
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				line("")
			case <-done:
				line("\n")
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}

// size formats n in binary units.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
