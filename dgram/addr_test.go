package dgram

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// roceV2IPv4GRH is what the device writes ahead of a datagram that came
// over RoCE v2 from src to dst: 20 bytes of zeros, then the IPv4 header.
func roceV2IPv4GRH(src, dst net.IP) []byte {
	h := make([]byte, 40)
	ip := h[20:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], 60)
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	return h
}

func TestGRHSource(t *testing.T) {
	src, dst := net.ParseIP("10.77.0.2"), net.ParseIP("10.77.0.1")
	got, toGroup, ok := grhSource(roceV2IPv4GRH(src, dst))
	if !ok || !got.Equal(src) || toGroup {
		t.Fatalf("RoCE v2 IPv4: got %v %v %v, want %v to no group", got, toGroup, ok, src)
	}
	if _, toGroup, _ := grhSource(roceV2IPv4GRH(src, net.ParseIP("239.7.7.7"))); !toGroup {
		t.Fatal("RoCE v2 IPv4 to 239.7.7.7: not seen as sent to a group")
	}

	// An IPv6 GRH: version 6, the source GID at bytes 8-23, the
	// destination's at 24-39.
	h := make([]byte, 40)
	h[0] = 0x60
	gid := net.ParseIP("fd77::2")
	copy(h[8:], gid)
	copy(h[24:], net.ParseIP("fd77::1"))
	if got, toGroup, ok := grhSource(h); !ok || !got.Equal(gid) || toGroup {
		t.Fatalf("IPv6 GRH: got %v %v %v, want %v to no group", got, toGroup, ok, gid)
	}
	for _, group := range []string{"ff0e::7", "::ffff:239.7.7.7"} {
		copy(h[24:], net.ParseIP(group))
		if _, toGroup, _ := grhSource(h); !toGroup {
			t.Fatalf("IPv6 GRH to %s: not seen as sent to a group", group)
		}
	}

	// An IPv4 header whose checksum is wrong is not taken for one when
	// the first byte says IPv6.
	bad := roceV2IPv4GRH(src, dst)
	bad[0] = 0x60
	bad[30] ^= 0xff
	if got, _, _ := grhSource(bad); got.Equal(src) {
		t.Fatal("a header with a bad checksum was read as IPv4")
	}
	if _, _, ok := grhSource(make([]byte, 40)); ok {
		t.Fatal("zeros read as a header")
	}
	if _, _, ok := grhSource(make([]byte, 10)); ok {
		t.Fatal("a short buffer read as a header")
	}
}

func TestAddrString(t *testing.T) {
	a := &Addr{IP: net.ParseIP("10.0.0.1"), Port: 7174, QPN: 0x11}
	if s := a.String(); s != "10.0.0.1:7174/qp=0x11" {
		t.Fatalf("got %q", s)
	}
	a.Port = 0
	if s := a.String(); s != "10.0.0.1/qp=0x11" {
		t.Fatalf("got %q", s)
	}
	if a.Network() != "rdma-ud" {
		t.Fatal(a.Network())
	}
}

// A nil Option is ignored, as an option left unset: before, applying one
// panicked with a nil dereference.
func TestNilOptionIsIgnored(t *testing.T) {
	want, err := newOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := newOptions([]Option{nil})
	if err != nil || got.sendDepth != want.sendDepth || got.recvDepth != want.recvDepth {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
}

// TestConnNotMadeFailsWithEINVAL: as with net's conns, every method of a
// nil or zero Conn fails with syscall.EINVAL (addresses nil, MTU and
// Stats zero) instead of panicking.
func TestConnNotMadeFailsWithEINVAL(t *testing.T) {
	for name, c := range map[string]*Conn{"nil": nil, "zero": {}} {
		p := make([]byte, 8)
		_, _, err := c.ReadFrom(p)
		errs := []error{err}
		_, err = c.Read(p)
		errs = append(errs, err)
		_, err = c.ReadBatch([]Message{{Buf: p}})
		errs = append(errs, err)
		_, err = c.WriteTo(p, &Addr{})
		errs = append(errs, err)
		_, err = c.Write(p)
		errs = append(errs, err)
		_, err = c.WriteBatch([]Message{{Buf: p}})
		errs = append(errs, err)
		_, err = c.Resolve(context.Background(), "10.0.0.1:1")
		errs = append(errs, err)
		_, err = c.JoinGroup(context.Background(), "239.0.0.1")
		errs = append(errs, err, c.LeaveGroup("239.0.0.1"), c.SetDeadline(time.Time{}),
			c.SetReadDeadline(time.Time{}), c.SetWriteDeadline(time.Time{}), c.Close(), c.Close())
		for i, err := range errs {
			if !errors.Is(err, syscall.EINVAL) {
				t.Errorf("%s: call %d gave %v, want EINVAL", name, i, err)
			}
		}
		if c.LocalAddr() != nil || c.RemoteAddr() != nil || c.MTU() != 0 || c.Stats() != (Stats{}) {
			t.Errorf("%s: addresses %v and %v, MTU %d, Stats %+v: want nil, nil, 0 and zero", name, c.LocalAddr(), c.RemoteAddr(), c.MTU(), c.Stats())
		}
	}
}

// FuzzGRHSource: no bytes a device (or a peer shaping its packets) puts
// ahead of a datagram crash the reader of the sender's address, and an
// address it gives is an IPv4 or IPv6 one.
func FuzzGRHSource(f *testing.F) {
	f.Add(roceV2IPv4GRH(net.ParseIP("10.77.0.2"), net.ParseIP("10.77.0.1")))
	v6 := make([]byte, 40)
	v6[0] = 0x60
	copy(v6[8:], net.ParseIP("fd77::2"))
	f.Add(v6)
	f.Add(make([]byte, 39))
	f.Fuzz(func(t *testing.T, h []byte) {
		ip, _, ok := grhSource(h)
		if ok != (ip != nil) || ok && len(ip) != net.IPv6len {
			t.Fatalf("grhSource(%x) = %v, %v", h, ip, ok)
		}
	})
}

// FuzzSplitHostPort: no address string crashes Dial's and Resolve's
// parser, and every Addr's String (which net's callers pass back as an
// address) parses to its host and port.
func FuzzSplitHostPort(f *testing.F) {
	f.Add("10.0.0.1:7174/qp=0x11", []byte{10, 0, 0, 1}, uint16(7174), uint32(0x11))
	f.Add("[fd77::1]:1/qp=0x1", []byte(net.ParseIP("fd77::1")), uint16(1), uint32(1))
	f.Add("/qp=", []byte{}, uint16(0), uint32(0xffffff))
	f.Fuzz(func(t *testing.T, s string, ip []byte, port uint16, qpn uint32) {
		splitHostPort(s)
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len || port == 0 {
			return
		}
		a := &Addr{IP: ip, Port: int(port), QPN: qpn}
		host, p, err := splitHostPort(a.String())
		if err != nil || host != a.IP.String() || p != strconv.Itoa(int(port)) {
			t.Fatalf("splitHostPort(%q) = %q, %q, %v", a.String(), host, p, err)
		}
	})
}
