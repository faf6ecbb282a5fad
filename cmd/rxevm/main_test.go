package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdmacm/internal/toolrun"
)

func TestMain(m *testing.M) {
	toolrun.MainIfAsked(main)
	goleak.VerifyTestMain(m)
}

// TestOutOfRangeFlagsAreUsageErrors: rxevm refuses, before it boots a
// guest, what the testbed took for its default (-guests 0 ran one guest,
// -memory 0 gave 2048 MiB) or for no bound at all (a negative -timeout),
// and a -kernel that names no Debian kernel.
func TestOutOfRangeFlagsAreUsageErrors(t *testing.T) {
	toolrun.RequireRefused(t, [][2]string{
		{"guests", "0"}, {"guests", "3"}, {"memory", "0"}, {"timeout", "-1s"},
		{"kernel", "6.1.0-56-amd64;reboot"}, {"kernel", "linux-image-"},
	}, "true")
}
