package lookup

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
)

func TestLiteralsAreNotLookedUp(t *testing.T) {
	ctx := context.Background()
	for _, host := range []string{"", "10.0.0.1", "fd77::1", "fe80::1%eth0", "::ffff:10.0.0.1"} {
		got, err := Hosts(ctx, host)
		if err != nil || len(got) != 1 || got[0] != host {
			t.Errorf("Hosts(%q) = %q, %v; want the host itself", host, got, err)
		}
	}
}

// TestFamilies: a queue pair bound to an address of one family takes a
// host's address of that family, and a host with none is refused with a
// net.AddrError; a listener takes the IPv4 one.
func TestFamilies(t *testing.T) {
	ctx := context.Background()
	v4, v6 := net.ParseIP("10.0.0.1"), net.ParseIP("fd77::1")
	if got, err := OfFamily(ctx, "::ffff:10.0.0.2", v4); err != nil || got != "::ffff:10.0.0.2" {
		t.Errorf("an IPv4-mapped address for an IPv4 queue pair: %q, %v", got, err)
	}
	var addrErr *net.AddrError
	if _, err := OfFamily(ctx, "10.0.0.2", v6); !errors.As(err, &addrErr) {
		t.Errorf("an IPv4 address for an IPv6 queue pair: %v, want a *net.AddrError", err)
	}
	if got, err := PreferIPv4(ctx, "localhost"); err != nil || got != "127.0.0.1" {
		t.Errorf("PreferIPv4(localhost) = %q, %v", got, err)
	}
	if got, err := OfFamily(ctx, "localhost", v4); err != nil || got != "127.0.0.1" {
		t.Errorf("localhost for an IPv4 queue pair: %q, %v", got, err)
	}
	if got, err := PreferIPv4(ctx, "fd77::1"); err != nil || got != "fd77::1" {
		t.Errorf("PreferIPv4 of an IPv6 address: %q, %v", got, err)
	}
}

// TestOfNetwork: "tcp4" and "tcp6" keep their family's addresses, in
// order, and the empty host (for Dial's hint about it); any other network
// keeps all; none left is a net.AddrError.
func TestOfNetwork(t *testing.T) {
	hosts := []string{"fd77::1", "10.0.0.1", "::ffff:10.0.0.2", "fd77::2"}
	for _, c := range []struct {
		network string
		want    []string
	}{
		{"tcp4", []string{"10.0.0.1", "::ffff:10.0.0.2"}},
		{"tcp6", []string{"fd77::1", "fd77::2"}},
		{"tcp", hosts},
		{"", hosts},
	} {
		got, err := OfNetwork(hosts, c.network, "name")
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%q: %q, %v; want %q", c.network, got, err, c.want)
		}
	}
	if got, err := OfNetwork([]string{""}, "tcp4", ""); err != nil || !slices.Equal(got, []string{""}) {
		t.Errorf("the empty host for tcp4: %q, %v", got, err)
	}
	var addrErr *net.AddrError
	if _, err := OfNetwork([]string{"10.0.0.1"}, "tcp6", "name"); !errors.As(err, &addrErr) {
		t.Errorf("no IPv6 address for tcp6: %v, want a *net.AddrError", err)
	}
}
