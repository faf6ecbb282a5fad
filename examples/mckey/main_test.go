package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdmacm/internal/rxetest"
	"github.com/go-rdma/rdmacm/internal/toolrun"
)

func TestMain(m *testing.M) {
	toolrun.MainIfAsked(main)
	goleak.VerifyTestMain(m)
}

// TestOutOfRangeFlagsAreUsageErrors: -c below 1, or -C or -S below 0,
// stops mckey before it binds, naming the flag. Such values made it
// panic.
func TestOutOfRangeFlagsAreUsageErrors(t *testing.T) {
	toolrun.RequireRefused(t, [][2]string{{"c", "0"}, {"c", "-1"}, {"C", "-1"}, {"S", "-1"}})
}

// TestInteropWithLibrdmacm: a group of three members, each a process of
// its own: two receivers and a sender, in the pairings of this mckey and
// librdmacm's. Every receiver's "return status 0" says it received the
// sender's 10 datagrams (mckey's own check).
func TestInteropWithLibrdmacm(t *testing.T) {
	addr := rxetest.Addr(t)
	if rxetest.IWARP() {
		t.Log("iWARP has no datagram queue pairs: the library's refusal is asserted in integration's dgram tests")
	}
	for _, c := range []struct {
		name      string
		sender    string
		receivers [2]string
	}{
		{"sender_go_receivers_go_c", "go", [2]string{"go", "c"}},
		{"sender_c_receivers_go_c", "c", [2]string{"go", "c"}},
		{"sender_go_receivers_go_go", "go", [2]string{"go", "go"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			args := []string{"-m", "239.1.2.3", "-b", addr, "-C", "10", "-S", "100"}
			run := func(kind string, args ...string) *toolrun.Proc {
				if kind == "go" {
					return toolrun.Go(t, ctx, append(args, "-wait", "500ms")...)
				}
				return toolrun.C(t, ctx, "mckey", args...)
			}
			var receivers []*toolrun.Proc
			for _, kind := range c.receivers {
				r := run(kind, args...)
				require.True(t, r.WaitLine("joined", 20*time.Second), "%s did not join", r.Name)
				receivers = append(receivers, r)
			}
			out, err := run(c.sender, append(args, "-s")...).Wait()
			t.Logf("sender %s:\n%s", c.sender, out)
			require.NoError(t, err)
			require.Contains(t, out, "return status 0")
			for _, r := range receivers {
				out, err := r.Wait()
				t.Logf("receiver %s:\n%s", r.Name, out)
				require.NoError(t, err)
				require.Contains(t, out, "return status 0")
				require.True(t, strings.Contains(out, "data transfers complete"))
			}
		})
	}
}
