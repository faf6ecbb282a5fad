package msg_test

import (
	"os"
	"testing"

	"github.com/go-rdma/rdmacm/internal/rxetest"
)

// TestMain skips the examples that need an RDMA device where there is none.
func TestMain(m *testing.M) {
	rxetest.SkipExamplesWithoutDevice("^Example(Conn|Server|Respond|WithMaxRecvSize)$")
	os.Exit(m.Run())
}
