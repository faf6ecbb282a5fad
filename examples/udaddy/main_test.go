package main

import (
	"context"
	"fmt"
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
// stops udaddy before it binds, naming the flag. Such values made it
// panic.
func TestOutOfRangeFlagsAreUsageErrors(t *testing.T) {
	toolrun.RequireRefused(t, [][2]string{{"c", "0"}, {"c", "-1"}, {"C", "-1"}, {"S", "-1"}})
}

// TestInteropWithLibrdmacm runs this udaddy and librdmacm's in every
// pairing of server and client: 2 clients of 10 datagrams of 100 bytes
// each way. Each side's "return status 0" says it sent and received them
// all (udaddy's own check).
func TestInteropWithLibrdmacm(t *testing.T) {
	addr := rxetest.Addr(t)
	if rxetest.IWARP() {
		t.Log("iWARP has no datagram queue pairs: the library's refusal is asserted in integration's dgram tests")
	}
	for _, pair := range [][2]string{{"go", "c"}, {"c", "go"}, {"go", "go"}, {"c", "c"}} {
		t.Run(fmt.Sprintf("server_%s_client_%s", pair[0], pair[1]), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			args := []string{"-c", "2", "-C", "10", "-S", "100"}
			run := func(kind string, args ...string) *toolrun.Proc {
				if kind == "go" {
					return toolrun.Go(t, ctx, args...)
				}
				return toolrun.C(t, ctx, "udaddy", args...)
			}
			srv := run(pair[0], append([]string{"-b", addr}, args...)...)
			// The client starts once the server listens. Started sooner,
			// one of its connections could be refused and the other
			// accepted, and the server, counting that one toward -c,
			// would never answer a second client's last connection.
			require.True(t, srv.WaitListening(20*time.Second), "%s did not listen", srv.Name)
			out, err := run(pair[1], append([]string{"-s", addr}, args...)...).Wait()
			t.Logf("client %s:\n%s", pair[1], out)
			require.NoError(t, err)
			require.Contains(t, out, "return status 0")
			out, err = srv.Wait()
			t.Logf("server %s:\n%s", pair[0], out)
			require.NoError(t, err)
			require.Contains(t, out, "return status 0")
		})
	}
}
