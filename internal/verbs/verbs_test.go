package verbs

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// Names come from libibverbs and librdmacm themselves; no device needed.
func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{WCRemAccessErr.String(), "remote access error"},
		{WCWRFlushErr.String(), "Work Request Flushed Error"},
		{EventEstablished.String(), "RDMA_CM_EVENT_ESTABLISHED"},
		{EventRejected.String(), "RDMA_CM_EVENT_REJECTED"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// A failed call names itself and keeps its errno for errors.Is; one that
// set no errno is EIO and says so.
func TestCallError(t *testing.T) {
	err := callError("rdma_connect", syscall.ECONNREFUSED)
	if !errors.Is(err, syscall.ECONNREFUSED) || err.Error() != "rdma_connect: connection refused" {
		t.Errorf("with an errno: %v", err)
	}
	err = callError("rdma_create_qp", nil)
	if !errors.Is(err, syscall.EIO) || err.Error() != "rdma_create_qp: failed without an errno: input/output error" {
		t.Errorf("without an errno: %v", err)
	}
}

// A port number out of range is refused before rdma_getaddrinfo, which
// would take it modulo 65536, with net's error; no device needed.
func TestPortOutOfRangeIsRefused(t *testing.T) {
	for _, port := range []string{"65536", "99999", "-1", "99999999999999999999"} {
		_, err := GetAddrInfo("10.0.0.1", port, true, PortSpaceTCP)
		var addrErr *net.AddrError
		if !errors.As(err, &addrErr) || err.Error() != "address "+port+": invalid port" {
			t.Errorf("port %q: %v, want net's invalid port", port, err)
		}
	}
	for _, port := range []string{"0", "65535", "7471", "", "http"} {
		if err := checkPort(port); err != nil {
			t.Errorf("port %q: %v", port, err)
		}
	}
}
