package verbs

import "testing"

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
