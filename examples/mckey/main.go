// Command mckey speaks librdmacm's mckey protocol over package dgram: it
// joins a multicast group and receives -C datagrams from it, or, with -s,
// sends -C datagrams of -S bytes to it, so that it and the C tool
// (rdmacm-utils) interoperate as receiver and sender.
//
//	mckey -m 239.1.1.1 -b 10.0.0.1     # receiver
//	mckey -m 239.1.1.1 -b 10.0.0.1 -s  # sender
//
// As mckey does, a member waits -wait after joining before it sends or
// reads, so that the receivers have joined before the first datagram.
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
	group := flag.String("m", "", "the multicast group's address (IPv4 or IPv6)")
	bind := flag.String("b", os.Getenv("RDMACM_TEST_ADDR"), "the local address to bind")
	sender := flag.Bool("s", false, "send to the group (default: receive)")
	conns := flag.Int("c", 1, "members in this process, each its own queue pair")
	count := flag.Int("C", 10, "datagrams each member sends or receives")
	size := flag.Int("S", 100, "datagram size in bytes")
	wait := flag.Duration("wait", 3*time.Second, "pause after joining (mckey's is 3 s)")
	timeout := flag.Duration("timeout", time.Minute, "give up after this long")
	flag.Parse()
	if err := cmp.Or(flagcheck.AtLeast(flag.CommandLine, 1, "c"), flagcheck.AtLeast(flag.CommandLine, 0, "C", "S")); err != nil {
		fmt.Fprintln(os.Stderr, "mckey:", err)
		os.Exit(2)
	}
	role := "server"
	if *sender {
		role = "client"
	}
	fmt.Println("mckey: starting", role)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err := run(ctx, *group, *bind, *sender, *conns, *count, *size, *wait)
	fmt.Println("test complete")
	if err != nil {
		fmt.Println("mckey:", err)
		fmt.Println("return status 1")
		os.Exit(1)
	}
	fmt.Println("return status 0")
}

func run(ctx context.Context, group, bind string, sender bool, conns, count, size int, wait time.Duration) error {
	if group == "" || bind == "" {
		return fmt.Errorf("give the group (-m) and the local address (-b)")
	}
	fmt.Println("mckey: joining")
	members := make([]*dgram.Conn, conns)
	to := make([]*dgram.Addr, conns)
	for i := range members {
		c, err := dgram.Listen(ctx, net.JoinHostPort(bind, "0"))
		if err != nil {
			return err
		}
		defer c.Close()
		if size > c.MTU() {
			return fmt.Errorf("message_size %d is larger than active mtu %d", size, c.MTU())
		}
		if to[i], err = c.JoinGroup(ctx, group); err != nil {
			return err
		}
		defer c.LeaveGroup(group)
		fmt.Printf("mckey: joined group %s qpn %#x qkey %#x\n", group, to[i].QPN, to[i].QKey)
		members[i] = c
	}
	time.Sleep(wait)
	if sender {
		fmt.Println("initiating data transfers")
		for i, c := range members {
			ms := make([]dgram.Message, count)
			for j := range ms {
				ms[j] = dgram.Message{Buf: make([]byte, size), Addr: to[i], HasImm: true,
					Imm: c.LocalAddr().(*dgram.Addr).QPN}
			}
			if _, err := c.WriteBatch(ms); err != nil {
				return err
			}
		}
	} else {
		fmt.Println("receiving data transfers")
		for _, c := range members {
			if dl, ok := ctx.Deadline(); ok {
				c.SetReadDeadline(dl)
			}
			buf := make([]byte, c.MTU())
			for range count {
				if _, _, err := c.ReadFrom(buf); err != nil {
					return err
				}
			}
		}
	}
	fmt.Println("data transfers complete")
	return nil
}
