// Package lookup looks host names up for cm and dgram with net's resolver:
// under the caller's context, where rdma_getaddrinfo would block a thread on
// DNS, and with every address, where rdma_getaddrinfo keeps the first.
package lookup

import (
	"context"
	"net"
	"net/netip"
)

// Hosts gives host's addresses as net's resolver orders them, or host
// itself if it is empty or an IP address (with a zone or not).
func Hosts(ctx context.Context, host string) ([]string, error) {
	if _, err := netip.ParseAddr(host); host == "" || err == nil {
		return []string{host}, nil
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 { // net says so with an error; the callers rely on one
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	hosts := make([]string, len(addrs))
	for i, a := range addrs {
		hosts[i] = a.String()
	}
	return hosts, nil
}

// PreferIPv4 gives host's first IPv4 address, else its first: the address
// net's Listen and ResolveUDPAddr take of a name.
func PreferIPv4(ctx context.Context, host string) (string, error) {
	hosts, err := Hosts(ctx, host)
	if err != nil {
		return "", err
	}
	for _, h := range hosts {
		if isIPv4(h) {
			return h, nil
		}
	}
	return hosts[0], nil
}

// OfFamily gives host's first address of ip's family, for a queue pair
// bound to ip, which can reach no other; a net.AddrError if it has none.
func OfFamily(ctx context.Context, host string, ip net.IP) (string, error) {
	hosts, err := Hosts(ctx, host)
	if err != nil {
		return "", err
	}
	if kept := inFamily(hosts, ip.To4() != nil); len(kept) > 0 {
		return kept[0], nil
	}
	return "", &net.AddrError{Err: "no address of the local address's family", Addr: host}
}

// inFamily keeps the IPv4 hosts (ipv4) or the others, in order.
func inFamily(hosts []string, ipv4 bool) []string {
	var kept []string
	for _, h := range hosts {
		if isIPv4(h) == ipv4 {
			kept = append(kept, h)
		}
	}
	return kept
}

func isIPv4(host string) bool {
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().Is4()
}

// OfNetwork keeps the hosts of network's family ("tcp4": IPv4, "tcp6":
// IPv6, anything else: all), as net's Dial does; a net.AddrError for
// host if none is left. An empty host is kept, for Dial's hint about it.
func OfNetwork(hosts []string, network, host string) ([]string, error) {
	if host == "" || network != "tcp4" && network != "tcp6" {
		return hosts, nil
	}
	kept := inFamily(hosts, network == "tcp4")
	if len(kept) == 0 {
		return nil, &net.AddrError{Err: "no suitable address found", Addr: host}
	}
	return kept, nil
}
