// Command udaddy speaks librdmacm's udaddy protocol over package dgram, so
// that it and the C tool (rdmacm-utils) interoperate in both roles.
//
// As a server (no -s) it binds -b (port 7174, as udaddy's), takes -C
// datagrams from each of -c clients, then sends each client -C replies.
// As a client (-s server) it resolves the server -c times, each from a
// queue pair of its own, sends -C datagrams of -S bytes from each, then
// waits for -C replies on each. Every datagram carries its sender's QP
// number as immediate data: udaddy's server answers to that number.
//
//	udaddy -b 10.0.0.1            # server
//	udaddy -s 10.0.0.1 -c 2 -C 10 # client
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/internal/flagcheck"
)

func main() {
	server := flag.String("s", "", "the server's address: run as a client")
	bind := flag.String("b", os.Getenv("RDMACM_TEST_ADDR"), "the local address to bind (a server needs one)")
	conns := flag.Int("c", 1, "connections: queue pairs (client) or clients (server)")
	count := flag.Int("C", 10, "datagrams each way per connection")
	size := flag.Int("S", 100, "datagram size in bytes")
	port := flag.String("port", "7174", "the port (librdmacm's udaddy always uses 7174)")
	timeout := flag.Duration("timeout", time.Minute, "give up after this long")
	flag.Parse()
	if err := cmp.Or(flagcheck.AtLeast(flag.CommandLine, 1, "c"), flagcheck.AtLeast(flag.CommandLine, 0, "C", "S")); err != nil {
		fmt.Fprintln(os.Stderr, "udaddy:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	if *server != "" {
		fmt.Println("udaddy: starting client")
		err = client(ctx, net.JoinHostPort(*server, *port), *conns, *count, *size)
	} else {
		fmt.Println("udaddy: starting server")
		err = serve(ctx, net.JoinHostPort(*bind, *port), *conns, *count, *size)
	}
	fmt.Println("test complete")
	if err != nil {
		fmt.Println("udaddy:", err)
		fmt.Println("return status 1")
		os.Exit(1)
	}
	fmt.Println("return status 0")
}

// withQPN is a datagram of size bytes to addr, with from's QP number as
// its immediate data.
func withQPN(from *dgram.Conn, addr net.Addr, size int) dgram.Message {
	return dgram.Message{Buf: make([]byte, size), Addr: addr, HasImm: true,
		Imm: from.LocalAddr().(*dgram.Addr).QPN}
}

func client(ctx context.Context, addr string, conns, count, size int) error {
	fmt.Println("udaddy: connecting")
	cs := make([]*dgram.Conn, conns)
	for i := range cs {
		c, err := dgram.Dial(ctx, addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if size > c.MTU() {
			return fmt.Errorf("message_size %d is larger than active mtu %d", size, c.MTU())
		}
		cs[i] = c
	}
	fmt.Println("initiating data transfers")
	for _, c := range cs {
		if err := send(c, c.RemoteAddr(), count, size); err != nil {
			return err
		}
	}
	fmt.Println("receiving data transfers")
	for _, c := range cs {
		if err := receive(ctx, c, count, nil); err != nil {
			return err
		}
	}
	fmt.Println("data transfers complete")
	return nil
}

func send(c *dgram.Conn, to net.Addr, count, size int) error {
	ms := make([]dgram.Message, count)
	for i := range ms {
		ms[i] = withQPN(c, to, size)
	}
	_, err := c.WriteBatch(ms)
	return err
}

// receive reads count datagrams; each sender's address goes to senders,
// in the order they were first seen, when it is not nil.
func receive(ctx context.Context, c *dgram.Conn, count int, senders *[]*dgram.Addr) error {
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
	}
	buf := make([]byte, c.MTU())
	for range count {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		if senders != nil && !seen(*senders, from.(*dgram.Addr)) {
			*senders = append(*senders, from.(*dgram.Addr))
		}
	}
	return nil
}

func seen(as []*dgram.Addr, a *dgram.Addr) bool {
	for _, b := range as {
		if b.QPN == a.QPN && b.IP.Equal(a.IP) {
			return true
		}
	}
	return false
}

func serve(ctx context.Context, addr string, conns, count, size int) error {
	c, err := dgram.Listen(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("receiving data transfers")
	var clients []*dgram.Addr
	if err := receive(ctx, c, conns*count, &clients); err != nil {
		return err
	}
	fmt.Println("sending replies")
	for _, to := range clients {
		if err := send(c, to, count, size); err != nil {
			return err
		}
	}
	fmt.Println("data transfers complete")
	return nil
}
