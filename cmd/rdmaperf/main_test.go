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
	for _, args := range [][]string{
		{"-mode", "client", "-size", "-1"}, {"-mode", "client", "-iters", "-1"}, {"-mode", "client", "-depth", "0"},
		{"-mode", "client", "-batch", "0"}, {"-mode", "client", "-reads", "-1"}, {"-mode", "client", "-callers", "0"},
		{"-compare", "-repeat", "0"},
		{"-mode", "server", "-test", "bogus"}, {"-mode", "client", "-test", "monitor"},
		{"-compare", "-test", "send_bw,bogus"}, {"-compare", "-test", "rpc,connect"},
	} {
		toolrun.RequireRefused(t, args[len(args)-2][1:], args...)
	}
}
