// Command rdmaperf measures this library the way perftest measures verbs:
// bandwidth (send, write, read, write with immediate), latency (send,
// write, read: typical and percentiles; send and write as half the round
// trip, read as the whole, like ib_*_lat), rdmanet streams against
// rstream, msg's rendezvous messages, and RPC calls/s.
//
//	rdmaperf -mode server -test send_bw -size 65536 -addr 10.0.0.1:18600 &
//	rdmaperf -mode client -test send_bw -size 65536 -addr 10.0.0.1:18600
//	rdmaperf -compare -out .   # perftest and rdmaperf in turn: a table, BENCHMARKS.md, bench.png
//
// Server and client take the same -test, -size, -iters and -depth, as
// perftest's do. -sizes 2:1048576 sweeps powers of two in one connection
// per size. -json prints one JSON object per result.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/flagcheck"
)

// config is one measurement's parameters, shared by server and client.
type config struct {
	test  string
	size  int
	iters int
	depth int
	batch int // bandwidth: work requests per post call (perftest's post_list)
	reads int // RDMA reads in flight per direction (perftest's -o)
	spin  time.Duration
	poll  endpoint.PollMode
	addr  string
	// rpc
	callers int
	// rendezvous: send from a lent region (msg.Conn.SendRegion), no copy
	lend bool
}

// result is one measurement.
type result struct {
	Test    string  `json:"test"`
	Size    int     `json:"size"`
	Iters   int     `json:"iters"`
	Poll    string  `json:"poll,omitempty"`
	BW      float64 `json:"bw_mib_s,omitempty"`      // MiB/s, as perftest's MB/sec
	MsgRate float64 `json:"msg_rate_mpps,omitempty"` // million messages/s
	Typical float64 `json:"t_typical_us,omitempty"`  // median
	Avg     float64 `json:"t_avg_us,omitempty"`
	P99     float64 `json:"t_p99_us,omitempty"`
	P999    float64 `json:"t_p999_us,omitempty"`
	Calls   float64 `json:"calls_s,omitempty"`
	// Messages is the client's messages on the wire (stream tests): how
	// far its writes were combined.
	Messages uint64 `json:"messages_sent,omitempty"`
	// PerDoorbell is the client's send work requests per doorbell (rpc,
	// stream tests).
	PerDoorbell float64 `json:"sends_per_doorbell,omitempty"`
	// PerWakeup is the client's completions per CQ event (rpc and stream
	// tests, event or hybrid polling): what each wake-up carried.
	PerWakeup float64 `json:"completions_per_wakeup,omitempty"`
	// connect: connections set up per second, and the teardown of all.
	Conns      float64 `json:"conns_s,omitempty"`
	TeardownMs float64 `json:"teardown_ms,omitempty"`
}

var pollNames = map[string]endpoint.PollMode{"event": endpoint.PollEvent, "busy": endpoint.PollBusy, "hybrid": endpoint.PollHybrid}

func main() {
	mode := flag.String("mode", "", "server or client")
	compare := flag.Bool("compare", false, "run perftest and rdmaperf in turn (needs rxe0; run under bin/rxevm)")
	out := flag.String("out", "", "with -compare: write BENCHMARKS.md and bench.png here")
	test := flag.String("test", "send_bw", "send_bw, write_bw, read_bw, write_imm_bw, send_lat, write_lat, read_lat, stream_bw, stream_lat, rendezvous, ud_bw, rpc, connect; with -compare also monitor (event mode with Go's system monitor kept awake) and grpc (examples/grpc over rdmanet and TCP)")
	size := flag.Int("size", 65536, "message size in bytes")
	sizes := flag.String("sizes", "", "a sweep MIN:MAX of powers of two (e.g. 2:1048576) or a list (64,4096), instead of -size")
	iters := flag.Int("iters", 0, "iterations (default by size)")
	depth := flag.Int("depth", 128, "work requests in flight (bandwidth tests); each connection's queue depth (connect)")
	// Each post is a cgo crossing and a doorbell (a syscall on rxe), and
	// one completion stands for a post (perftest's cq_mod is 100): more
	// requests per post, fewer of both (BENCHMARKS.md has the figures).
	batch := flag.Int("batch", 64, "bandwidth: work requests per post (one doorbell), at most -depth/2")
	reads := flag.Int("reads", 128, "RDMA reads in flight per direction, at most the device's (perftest -o: the device's maximum)")
	// Hybrid polling pays off when the spin covers a round trip.
	spin := flag.Duration("spin", 200*time.Microsecond, "hybrid polling: spin this long before sleeping")
	poll := flag.String("poll", "event", "completion polling: event, busy or hybrid")
	addr := flag.String("addr", "", "server address host:port (default $RDMACM_TEST_ADDR:18600)")
	callers := flag.Int("callers", 16, "rpc: concurrent callers")
	lend := flag.Bool("lend", false, "rendezvous: send from a registered region the client lends (SendRegion) instead of copying (Send)")
	asJSON := flag.Bool("json", false, "print JSON, one object per result")
	repeat := flag.Int("repeat", 1, "with -compare: run each pair this many times and keep the medians")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process to `file`")
	flag.Parse()
	// -size 0 is the connect test's, which moves no data.
	if err := cmp.Or(flagcheck.AtLeast(flag.CommandLine, 0, "size", "iters"),
		flagcheck.AtLeast(flag.CommandLine, 1, "depth", "batch", "reads", "callers", "repeat"),
		checkTests(*test, *compare)); err != nil {
		fmt.Fprintln(os.Stderr, "rdmaperf:", err)
		os.Exit(2)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatalf("%v", err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	if *addr == "" {
		*addr = net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "18600")
	}
	pm, ok := pollNames[*poll]
	if !ok {
		fatalf("unknown -poll %q", *poll)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *compare {
		set := compareSet{tests: deviceTests(), sizes: compareSizes, repeat: *repeat}
		flag.Visit(func(f *flag.Flag) { // -test and -sizes narrow the comparison
			switch f.Name {
			case "test":
				set.tests = strings.Split(*test, ",")
			case "sizes":
				set.sizes, set.sized = sweep(*sizes), true
			case "size":
				set.sizes, set.sized = []int{*size}, true
			}
		})
		if err := runCompare(ctx, set, *out); err != nil {
			fatalf("%v", err)
		}
		return
	}
	list := []int{*size}
	if *sizes != "" {
		list = sweep(*sizes)
	}
	for _, s := range list {
		cfg := config{test: *test, size: s, iters: *iters, depth: *depth, batch: *batch, reads: *reads, spin: *spin, poll: pm, addr: *addr, callers: *callers, lend: *lend}
		if cfg.iters == 0 {
			cfg.iters = defaultIters(cfg.test, s)
		}
		var err error
		var r result
		switch *mode {
		case "server":
			err = serve(ctx, cfg)
		case "client":
			r, err = runClient(ctx, cfg)
			r.Poll = *poll
		default:
			fatalf("give -mode server or -mode client, or -compare")
		}
		if err != nil {
			fatalf("%s %d B: %v", cfg.test, s, err)
		}
		if *mode == "client" {
			if *asJSON {
				json.NewEncoder(os.Stdout).Encode(r)
			} else {
				printResult(r)
			}
		}
	}
}

// fatalf reports and exits (a CPU profile in progress is lost).
func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "rdmaperf: "+format+"\n", a...)
	os.Exit(1)
}

// sweep reads -sizes: MIN:MAX (powers of two), a comma-separated list, or
// one size.
func sweep(spec string) []int {
	if !strings.Contains(spec, ":") { // a list, or one size
		var out []int
		for _, f := range strings.Split(spec, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				fatalf("-sizes %q: want MIN:MAX or a list of sizes", spec)
			}
			out = append(out, n)
		}
		return out
	}
	lo, hi, ok := strings.Cut(spec, ":")
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil || a < 1 || b < a {
		fatalf("-sizes %q: want MIN:MAX", spec)
	}
	var out []int
	for s := a; s <= b; s *= 2 {
		out = append(out, s)
	}
	return out
}

// defaultIters keeps each run to a few seconds under emulation.
func defaultIters(test string, size int) int {
	lat := strings.HasSuffix(test, "_lat")
	switch {
	case test == "rpc":
		return 500
	case test == "connect":
		return connectIters
	case test == "rendezvous":
		return 16
	case size <= 4096 && lat:
		return 2000
	case size <= 4096:
		return 20000
	case size <= 65536 && lat:
		return 300
	case size <= 65536:
		return 2000
	case lat:
		return 50
	default:
		return 200
	}
}

func printResult(r result) {
	if r.Conns > 0 {
		fmt.Printf("%-12s %8d connections %10.0f conn/s  teardown %8.1f ms\n", r.Test, r.Iters, r.Conns, r.TeardownMs)
		return
	}
	if r.Calls > 0 {
		fmt.Printf("%-12s %8d calls %10.0f calls/s  p50 %8.2f us  p99 %8.2f us  p99.9 %8.2f us  %.2f sends/doorbell  %.2f completions/wake-up\n",
			r.Test, r.Iters, r.Calls, r.Typical, r.P99, r.P999, r.PerDoorbell, r.PerWakeup)
		return
	}
	if r.BW > 0 && !strings.HasSuffix(r.Test, "_lat") { // stream_lat reports both
		fmt.Printf("%-12s %8d B %8d iters  BW average %9.2f MiB/s  MsgRate %.6f Mpps", r.Test, r.Size, r.Iters, r.BW, r.MsgRate)
		if r.Messages > 0 {
			fmt.Printf("  %d messages  %.2f sends/doorbell", r.Messages, r.PerDoorbell)
		}
		fmt.Println()
		return
	}
	fmt.Printf("%-12s %8d B %8d iters  t_typical %8.2f us  t_avg %8.2f us  99%% %8.2f us  99.9%% %8.2f us (%s)\n",
		r.Test, r.Size, r.Iters, r.Typical, r.Avg, r.P99, r.P999, r.Poll)
}

func since(t time.Time) float64 { return time.Since(t).Seconds() }
