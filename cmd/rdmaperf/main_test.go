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
	client, server, compare := []string{"-mode", "client"}, []string{"-mode", "server"}, []string{"-compare"}
	for _, c := range []struct {
		flag, value string
		args        []string
	}{
		{"size", "-1", client}, {"iters", "-1", client}, {"depth", "0", client},
		{"batch", "0", client}, {"reads", "-1", client}, {"callers", "0", client},
		{"repeat", "0", compare},
		{"test", "bogus", server}, {"test", "monitor", client},
		{"test", "send_bw,bogus", compare}, {"test", "rpc,connect", compare},
	} {
		toolrun.RequireRefused(t, c.flag, c.value, c.args...)
	}
}
