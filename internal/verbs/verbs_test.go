package verbs

import (
	"errors"
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
