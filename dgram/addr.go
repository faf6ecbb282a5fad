package dgram

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Network is the name of the network of an Addr.
const Network = "rdma-ud"

// Addr is a datagram destination or source: the IP address that names
// its device port (its GID), the number of its queue pair and the Q_Key
// that QP accepts. A multicast group's QPN is 0xFFFFFF.
type Addr struct {
	IP   net.IP
	Port int // the rdma_cm port it was resolved or bound from; 0 when unknown
	QPN  uint32
	QKey uint32
}

// Network is "rdma-ud".
func (a *Addr) Network() string { return Network }

// String is host:port (or the host alone when the port is unknown) and the
// queue pair's number, e.g. "10.0.0.1:7174/qp=0x11".
func (a *Addr) String() string {
	if a == nil {
		return "<nil>"
	}
	host := a.IP.String()
	if a.Port != 0 {
		host = net.JoinHostPort(host, strconv.Itoa(a.Port))
	}
	return fmt.Sprintf("%s/qp=%#x", host, a.QPN)
}

// gidKey is the 16-byte form of an IP address: the GID of its port on RoCE
// (an IPv4 address in its IPv4-mapped form).
type gidKey [16]byte

func keyOf(ip net.IP) gidKey {
	var k gidKey
	copy(k[:], ip.To16())
	return k
}

// sameQP reports whether two addresses name the same queue pair.
func (a *Addr) sameQP(b *Addr) bool {
	return a.QPN == b.QPN && a.IP.Equal(b.IP)
}

// grhSource returns the sender's IP address from the GRHSize bytes the
// device wrote ahead of a received datagram, and whether it was sent to
// a multicast group. On RoCE v2 over IPv4 the IPv4 header fills the last
// 20 of them; otherwise they are an IPv6-shaped GRH whose source GID is
// the sender's address. An IPv6 GRH can look like an IPv4 header in its
// last 20 bytes only by chance, so, as rdma-core does, a valid IPv4
// header checksum decides.
func grhSource(h []byte) (src net.IP, toGroup, ok bool) {
	if len(h) < 40 {
		return nil, false, false
	}
	v4 := h[20:40]
	isV4 := v4[0] == 0x45 && ipv4ChecksumOK(v4)
	switch {
	case h[0]>>4 != 6 && v4[0]>>4 == 4, h[0]>>4 == 6 && isV4:
		return net.IPv4(v4[12], v4[13], v4[14], v4[15]), v4[16]>>4 == 0xe, true
	case h[0]>>4 == 6:
		return append(net.IP(nil), h[8:24]...), net.IP(h[24:40]).IsMulticast(), true
	}
	return nil, false, false
}

func ipv4ChecksumOK(h []byte) bool {
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

// splitHostPort is net.SplitHostPort for the addresses Dial and Resolve
// take: host:port, or an Addr's String ("10.0.0.1:7174/qp=0x11"), as net's
// dials take a LocalAddr's. The service resolves the queue pair again: a
// peer's listener that was opened anew answers with its new one.
func splitHostPort(addr string) (host, port string, err error) {
	if i := strings.LastIndex(addr, "/qp="); i >= 0 {
		addr = addr[:i]
	}
	return net.SplitHostPort(addr)
}
