// Package integration runs the library on a real RDMA device: Soft-RoCE
// (rxe0) inside the testbed's guest under `make test`. Every test binary is
// checked for leaked goroutines.
package integration

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
