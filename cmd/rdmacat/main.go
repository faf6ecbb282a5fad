// Command rdmacat is netcat over RDMA: standard input to an rdmanet
// connection, the connection to standard output.
//
//	rdmacat -l -d 10.0.0.1:7000 > copy.iso   # receive only
//	rdmacat -p 10.0.0.1:7000 < disk.iso      # send, with a progress line
//
// At the end of its input it half-closes, so the peer sees end of file,
// and it exits once the peer has half-closed too. Both inputs must end,
// then: a receiving side that reads a terminal keeps the connection, and
// so the sender, open until end of input is typed there. -d reads no
// input, as OpenBSD's nc -d does, so a receiver ends with its sender
// (as does redirecting its input from /dev/null). An interrupt, a failed
// connection, or a failed read of its input or write of its output ends
// it at once, even while its input gives nothing, and resets the
// connection: the other side then exits with an error too, rather than as
// after a whole transfer.
// The other side may be another rdmacat or any program using package
// rdmanet.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-rdma/rdmacm/internal/rdmacat"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := rdmacat.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
