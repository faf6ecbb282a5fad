package main

import (
	"testing"

	"github.com/go-rdma/rdmacm/internal/toolrun"
)

func TestMain(m *testing.M) {
	toolrun.MainIfAsked(main)
	m.Run()
}

// TestBadFlagsAreUsageErrors: a depth, batch, read depth, caller count or
// repeat below 1, a size or iterations below 0, or a -test that names no
// test stop rdmaperf before it listens or connects, naming the flag. Such
// values went on to fail late or ran far from what was asked.
func TestBadFlagsAreUsageErrors(t *testing.T) {
	toolrun.RequireRefused(t, [][2]string{
		{"size", "-1"}, {"iters", "-1"}, {"depth", "0"}, {"batch", "0"}, {"reads", "-1"}, {"callers", "0"},
		{"test", "monitor"},
	}, "-mode", "client")
	toolrun.RequireRefused(t, [][2]string{{"test", "bogus"}}, "-mode", "server")
	toolrun.RequireRefused(t, [][2]string{{"repeat", "0"}, {"test", "send_bw,bogus"}, {"test", "rpc,connect"}}, "-compare")
}
