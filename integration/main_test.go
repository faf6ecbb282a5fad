// Package integration runs the library on a real RDMA device: Soft-RoCE
// (rxe0) inside the testbed's guest under `make test`. Every test binary is
// checked for leaked goroutines.
package integration

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The crash tests re-run this binary as a client or server process
	// that they kill with SIGKILL.
	if role := os.Getenv(helperRoleEnv); role != "" {
		os.Exit(runHelper(role))
	}
	goleak.VerifyTestMain(m)
}
