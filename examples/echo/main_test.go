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

// TestOutOfRangeFlagsAreUsageErrors: a size or count below 1 stops echo
// before it listens or dials, naming the flag. Such values made it panic
// or fail deep in a connection.
func TestOutOfRangeFlagsAreUsageErrors(t *testing.T) {
	toolrun.RequireRefused(t, [][2]string{{"size", "0"}, {"count", "-1"}, {"concurrency", "0"}, {"concurrency", "-1"}})
}
