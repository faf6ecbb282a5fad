package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A comparison row: one test at one size, perftest and rdmaperf in turn in
// the same boot. For bandwidth the figure is MiB/s (perftest's MB/sec), for
// latency t_typical in µs.
type row struct {
	Test     string
	Size     int
	Poll     string  // ours: event, busy or hybrid
	Perftest float64 // median of PerftestRuns
	Ours     float64 // median of OursRuns
	Lat      bool
	// Every run's figure: on a noisy machine a ratio means something
	// only where the two spreads do not overlap much.
	PerftestRuns, OursRuns []float64
	// RNR NAKs rxe counted during the runs (rnrDelta), summed: each one
	// stalls a send test, so they explain a run that fell short.
	PerftestRNR, OursRNR int64
}

func (r row) ratio() float64 {
	if r.Perftest == 0 {
		return 0
	}
	return r.Ours / r.Perftest
}

// runTimeout bounds one run (a server and its client), so that a hang
// fails the comparison instead of stalling it.
const runTimeout = 2 * time.Minute

var (
	compareSizes = []int{64, 4096, 65536, 1 << 20}
	perftestTool = map[string]string{
		"send_bw": "ib_send_bw", "write_bw": "ib_write_bw", "read_bw": "ib_read_bw",
		"send_lat": "ib_send_lat", "write_lat": "ib_write_lat", "read_lat": "ib_read_lat",
	}
)

// compareSet is what -compare runs: every test at every size by default;
// -test and -sizes narrow it, -repeat takes the median of several runs.
// sized: the sizes were given (-sizes, -size), and every test runs them,
// those with fixed sizes too.
type compareSet struct {
	tests  []string
	sizes  []int
	sized  bool
	repeat int
}

// sizesOf is the sizes test runs at.
func (set compareSet) sizesOf(test string) []int {
	if s, ok := fixedSizes[test]; ok && !set.sized {
		return s
	}
	return set.sizes
}

var compareTests = []string{"send_bw", "write_bw", "read_bw", "write_imm_bw", "send_lat", "write_lat", "read_lat",
	"stream_bw", "stream_lat", "rendezvous", "ud_bw"}

// pairedRows are the tests of compareRows that also run as a server and
// a client.
var pairedRows = []string{"rpc", "connect"}

// compareRows are the tests -compare runs alone, each its own table
// (runCompare).
var compareRows = append(slices.Clone(pairedRows), "monitor", "grpc")

// checkTests refuses a -test that names no test before anything runs: for
// a server or a client one test of compareTests or pairedRows; with
// -compare a list of compareTests, or one of compareRows alone.
func checkTests(test string, compare bool) error {
	if !compare {
		serverClient := slices.Concat(compareTests, pairedRows)
		if slices.Contains(serverClient, test) {
			return nil
		}
		return fmt.Errorf("-test %q: want one of %s", test, strings.Join(serverClient, ", "))
	}
	if slices.Contains(compareRows, test) {
		return nil
	}
	for _, t := range strings.Split(test, ",") {
		if !slices.Contains(compareTests, t) {
			return fmt.Errorf("-test %q: %q is none of %s; or give one of %s alone", test, t,
				strings.Join(compareTests, ", "), strings.Join(compareRows, ", "))
		}
	}
	return nil
}

// fixedSizes are the sizes of the tests that run one unless -sizes or
// -size says otherwise, the issues': 64 KiB
// writes for stream bandwidth (and 1 KiB, where small writes are
// combined), 64 B ping-pong for stream latency, 8 MiB
// messages for rendezvous, 64 B and rxe's MTU for datagrams; the verbs
// tests run every size.
var fixedSizes = map[string][]int{"stream_bw": {1024, 65536}, "stream_lat": {64}, "rendezvous": {8 << 20}, "ud_bw": {64, 4096}}

// rendezvousAnchorSize is the ib_read_bw message size rendezvous is
// compared with: RDMA READ at the size where it reaches its bandwidth.
const rendezvousAnchorSize = 1 << 20

// anchor runs the C tool a test is compared with: perftest's for the
// verbs tests (in its event mode, -e, when mode is "event"), rstream
// (rsockets; its blocking mode when mode is "event") for rdmanet's stream
// tests, ib_read_bw at 1 MiB for msg's rendezvous, ib_send_bw -c UD for
// datagrams.
func anchor(ctx context.Context, test, mode, device, host string, port, size, iters int, lat bool) (float64, error) {
	switch test {
	case "stream_bw", "stream_lat":
		return runRstream(ctx, test, mode, host, port, size, iters)
	case "rendezvous":
		s := rendezvousAnchorSize
		return runPerftest(ctx, "ib_read_bw", device, host, port, s, defaultIters("read_bw", s), colBWAverage)
	case "ud_bw":
		return runPerftest(ctx, "ib_send_bw", device, host, port, size, iters, colBWAverage, "-c", "UD")
	}
	tool, ok := perftestTool[test]
	if !ok {
		return 0, errNoAnchor
	}
	col, flags := colBWAverage, []string(nil)
	if lat {
		col = colTypical
	}
	if mode == "event" {
		flags = []string{"-e"}
	}
	return runPerftest(ctx, tool, device, host, port, size, iters, col, flags...)
}

// anchorModes are the modes of the C tool a test is compared in: its
// default (busy polling; rstream's non-blocking calls spin too), and, as
// the fair match for ours with event polling, perftest's event mode for
// send_lat and read_lat (ib_write_lat has none: "Events feature not
// available on WRITE verb") and rstream's blocking calls for the stream
// tests (rsockets then sleeps on its completion channel).
func anchorModes(test string) []string {
	switch test {
	case "send_lat", "read_lat", "stream_bw", "stream_lat":
		return []string{"busy", "event"}
	}
	return []string{"busy"}
}

// anchorMode is the anchor mode our poll mode is compared with.
func anchorMode(test, poll string) string {
	if poll == "event" && len(anchorModes(test)) > 1 {
		return "event"
	}
	return "busy"
}

// errNoAnchor: no C tool measures the test (write_imm_bw).
var errNoAnchor = fmt.Errorf("no C tool to compare with")

// testDevice is the RDMA device under test, as the testbed names it
// (RDMACM_TEST_DEVICE): rxe0 or siw0.
func testDevice() string {
	if d := os.Getenv("RDMACM_TEST_DEVICE"); d != "" {
		return d
	}
	return "rxe0"
}

// deviceTests are the tests the device can run: iWARP has no immediate
// data and no datagram QPs, so write_imm_bw and ud_bw are rxe's only.
func deviceTests() []string {
	if os.Getenv("RDMACM_TEST_TRANSPORT") != "iwarp" {
		return compareTests
	}
	return slices.DeleteFunc(slices.Clone(compareTests), func(t string) bool { return t == "write_imm_bw" || t == "ud_bw" })
}

// runCompare runs each test at each size, perftest and ours in turn
// (repeat times, keeping each side's median), prints one
// table, and (with out) writes BENCHMARKS.md and bench.png.
func runCompare(ctx context.Context, set compareSet, out string) error {
	host := os.Getenv("RDMACM_TEST_ADDR")
	if host == "" {
		return fmt.Errorf("-compare runs on the testbed's device: bin/rxevm bin/rdmaperf -compare (or make bench)")
	}
	device := testDevice()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	port := 18700
	nextPort := func() int { port++; return port }
	switch { // the RPC or connection rows alone
	case slices.Equal(set.tests, []string{"rpc"}):
		_, err := compareRPC(ctx, self, device, host, nextPort, set.repeat)
		return err
	case slices.Equal(set.tests, []string{"connect"}):
		compareConnect(ctx, self, host, nextPort, set.repeat)
		return nil
	case slices.Equal(set.tests, []string{"monitor"}):
		_, err := compareMonitor(ctx, self, device, host, nextPort, set.repeat)
		return err
	case slices.Equal(set.tests, []string{"grpc"}):
		_, err := compareGRPC(ctx, self, host, set.repeat)
		return err
	}
	var rows []row
	add := func(r row) {
		rows = append(rows, r)
		fmt.Printf("%-13s %8d %-7s perftest %10.2f  ours %10.2f  ratio %5.2f  runs %s / %s  rnr %d / %d\n",
			r.Test, r.Size, r.Poll, r.Perftest, r.Ours, r.ratio(), spread(r.PerftestRuns), spread(r.OursRuns),
			r.PerftestRNR, r.OursRNR)
	}
	for _, test := range set.tests {
		lat := strings.HasSuffix(test, "_lat")
		polls := pollsOf(test)
		for _, size := range set.sizesOf(test) {
			iters := defaultIters(test, size)
			pts := make(map[string][]float64) // by anchor mode
			var ptRNR int64
			ours := make(map[string][]float64)
			oursRNR := make(map[string]int64)
			perftest := func() {
				// perftest itself sometimes hangs on rxe under TCG; its
				// run is then left out (n/a when no run finished).
				for _, mode := range anchorModes(test) {
					rnr := rnrDelta(device)
					pt, err := anchor(ctx, test, mode, device, host, nextPort(), size, iters, lat)
					ptRNR += rnr()
					if err == errNoAnchor {
						return
					}
					if err != nil {
						fmt.Fprintf(os.Stderr, "rdmaperf: the C tool for %s %d B (%s) failed, its figure is left out: %v\n", test, size, mode, err)
						continue
					}
					pts[mode] = append(pts[mode], pt)
				}
			}
			for i := range set.repeat {
				// perftest goes first in even rounds and last in odd ones,
				// so that a drift of the machine's speed within a round
				// favours neither side.
				if i%2 == 0 {
					perftest()
				}
				for _, poll := range polls {
					rnr := rnrDelta(device)
					r, err := runOurs(ctx, self, test, host, nextPort(), size, iters, poll)
					oursRNR[poll] += rnr()
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if err != nil { // left out, as perftest's failures are: the row says n/a
						fmt.Fprintf(os.Stderr, "rdmaperf %s %d B %s failed, its figure is left out: %v\n", test, size, poll, err)
						continue
					}
					ours[poll] = append(ours[poll], figureOf(test, r))
				}
				if i%2 == 1 {
					perftest()
				}
			}
			for _, poll := range polls {
				anchorRuns := pts[anchorMode(test, poll)]
				add(row{Test: test, Size: size, Poll: poll, Perftest: median(anchorRuns), Ours: median(ours[poll]), Lat: lat,
					PerftestRuns: anchorRuns, OursRuns: ours[poll], PerftestRNR: ptRNR, OursRNR: oursRNR[poll]})
			}
		}
	}
	if !slices.Equal(set.tests, deviceTests()) || set.sized {
		return nil // a partial comparison is not written or followed by rpc
	}
	rpc, err := compareRPC(ctx, self, device, host, nextPort, set.repeat)
	if err != nil {
		return err
	}
	conn := compareConnect(ctx, self, host, nextPort, set.repeat)
	monitor, err := compareMonitor(ctx, self, device, host, nextPort, set.repeat)
	if err != nil {
		return err
	}
	sections := rpcTable(rpc) + connectTable(conn) + monitorTable(monitor)
	var grpc []grpcRow
	if device == "rxe0" { // gRPC over rdmanet against TCP, on rxe0 only
		if grpc, err = compareGRPC(ctx, self, host, set.repeat); err != nil {
			return err
		}
		sections += grpcTable(grpc)
	}
	if out == "" {
		return nil
	}
	if device != "rxe0" { // another device's table is a section of BENCHMARKS.md
		return writeDeviceSection(filepath.Join(out, "BENCHMARKS.md"), device, rows, sections, set.repeat)
	}
	bars := chartBars(rows, rpc, conn, monitor, grpc)
	if err := writeMarkdown(filepath.Join(out, "BENCHMARKS.md"), rows, sections+goalsTable(bars), set.repeat); err != nil {
		return err
	}
	return writeChart(filepath.Join(out, "bench.png"), bars)
}

// pollsOf is the polling modes a test runs ours with: a latency test in
// each, a bandwidth test in event mode and busy, datagrams in event mode
// only (dgram's readers and writers wait on the channel: no mode to
// choose).
func pollsOf(test string) []string {
	switch {
	case test == "ud_bw":
		return []string{"event"}
	case strings.HasSuffix(test, "_lat"):
		return []string{"busy", "hybrid", "event"}
	}
	return []string{"event", "busy"}
}

// figureOf is the figure of r a comparison uses: calls/s for RPC, the
// average for stream_lat (rstream reports that), t_typical for the other
// latency tests, MiB/s for the rest.
func figureOf(test string, r result) float64 {
	switch {
	case test == "rpc":
		return r.Calls
	case test == "stream_lat":
		return r.Avg
	case strings.HasSuffix(test, "_lat"):
		return r.Typical
	}
	return r.BW
}

// runPerftest runs a perftest server in the background and its client, over
// rdma_cm (-R), and returns BW average (MiB/s) or t_typical (µs).
func runPerftest(ctx context.Context, tool, device, host string, port, size, iters, col int, flags ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	args := append([]string{"-R", "-d", device, "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-p", strconv.Itoa(port)}, flags...)
	srv := exec.CommandContext(ctx, tool, args...)
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	var outText string
	for attempt := 0; attempt < 10; attempt++ {
		time.Sleep(300 * time.Millisecond) // perftest says nothing when it listens
		b, err := exec.CommandContext(ctx, tool, append(args, host)...).CombinedOutput()
		outText = string(b)
		if err == nil {
			break
		}
	}
	return parsePerftest(outText, col)
}

// Columns of perftest's result line.
const (
	colBWAverage = 3 // bandwidth tests: BW average[MB/sec]
	colMsgRate   = 4 // bandwidth tests: MsgRate[Mpps]
	colTypical   = 4 // latency tests: t_typical[usec]
)

// parsePerftest reads column col of the result line under perftest's
// "#bytes" header.
func parsePerftest(text string, col int) (float64, error) {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "#bytes") || i+1 >= len(lines) {
			continue
		}
		f := strings.Fields(lines[i+1])
		if len(f) > col {
			return strconv.ParseFloat(f[col], 64)
		}
	}
	return 0, fmt.Errorf("no result in perftest's output:\n%s", text)
}

// runOurs runs rdmaperf's server (waiting for "ready") and client.
func runOurs(ctx context.Context, self, test, host string, port, size, iters int, poll string, flags ...string) (result, error) {
	return runOursEnv(ctx, nil, self, test, host, port, size, iters, poll, flags...)
}

// runOursEnv is runOurs with env added to both processes' environment.
func runOursEnv(ctx context.Context, env []string, self, test, host string, port, size, iters int, poll string, flags ...string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	addr := fmt.Sprintf("%s:%d", host, port)
	common := append([]string{"-test", test, "-size", strconv.Itoa(size), "-iters", strconv.Itoa(iters), "-addr", addr, "-poll", poll}, flags...)
	environ := append(os.Environ(), env...) // a later entry wins
	srv := exec.CommandContext(ctx, self, append([]string{"-mode", "server"}, common...)...)
	srv.Env = environ
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return result{}, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		return result{}, fmt.Errorf("the server did not start: %q %v", line, err)
	}
	go io.Copy(io.Discard, stdout)
	cl := exec.CommandContext(ctx, self, append([]string{"-mode", "client", "-json"}, common...)...)
	cl.Env = environ
	cl.Stderr = os.Stderr
	b, err := cl.Output()
	if err != nil {
		return result{}, err
	}
	var r result
	return r, json.Unmarshal(b, &r)
}

// rnrCounter counts the RNR NAKs device received: sends that found no
// receive posted at the peer. Both peers of a test are on the device, so it
// counts the test's own. rxe has it; siw (iWARP, no RNR) does not.
func rnrCounter(device string) string {
	return "/sys/class/infiniband/" + device + "/ports/1/hw_counters/rcvd_rnr_err"
}

// rnrDelta reads rnrCounter now; the function it returns gives how much it
// rose since (0 where the device has no such counter).
func rnrDelta(device string) func() int64 {
	before, ok := readCounter(rnrCounter(device))
	return func() int64 {
		after, ok2 := readCounter(rnrCounter(device))
		if !ok || !ok2 {
			return 0
		}
		return after - before
	}
}

func readCounter(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}

// spread is the lowest and highest of runs ("n/a" for none).
func spread(runs []float64) string {
	if len(runs) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f-%.2f", slices.Min(runs), slices.Max(runs))
}

// median is the middle value (0 for none).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// writeMarkdown writes BENCHMARKS.md: the table of rows, then sections
// (the RPC and connection tables, in Markdown), then the hand-kept part
// of the old file.
func writeMarkdown(path string, rows []row, sections string, repeat int) error {
	var b strings.Builder
	host := os.Getenv("RDMAPERF_HOST") // the machine under the guest, from make bench
	if host == "" {
		host, _ = os.Hostname()
	}
	cpu := "unknown"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	fmt.Fprintf(&b, "# Benchmarks\n\nWritten by `make bench` (`bin/rxevm -w . bin/rdmaperf -compare -repeat %d -out .`) on %s.\n\n",
		repeat, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Machine: %s; guest kernel %s, %d vCPUs (%s), Soft-RoCE rxe0 on dummy0 (loopback inside one guest). "+
		"perftest and rdmaperf ran in turn in the same guest boot, each as a server and a client process over rdma_cm. "+
		"Absolute figures under TCG emulation mean little; compare the ratios.\n\n",
		host, strings.TrimSpace(string(kernel)), runtime.NumCPU(), cpu)
	b.WriteString("Bandwidth is BW average in MiB/s (perftest's MB/sec; higher is better, ratio = ours / perftest). " +
		"Latency is t_typical in µs (send and write: half the round trip; read: the whole; lower is better, ratio = ours / perftest). " +
		"Ours is shown with each polling mode (hybrid spins 200 µs, about a 4 KiB round trip here, before it sleeps); perftest busy-polls, " +
		"except in the send_lat and read_lat rows with event polling, which are compared with perftest's own event mode (`-e`; ib_write_lat has none). " +
		"stream_bw and stream_lat measure package rdmanet (a net.Conn) against librdmacm's rstream (rsockets) in the perftest columns: " +
		"its default non-blocking calls, which spin, and in the rows with event polling its blocking calls (`-T b`), which sleep on the completion channel; " +
		"both in rstream's shape: writes of 64 KiB (and 1 KiB) one way then back, and a 64 B ping-pong; " +
		"bandwidth counts both directions, latency is the average time per transfer. " +
		"rendezvous is msg's large messages, 8 MiB each sent in turn (the receiver pulls each with RDMA READ), against ib_read_bw at 1 MiB. ")
	fmt.Fprintf(&b, "Each figure is the median of %d runs; perftest's and ours alternate. "+
		"The last two columns are the lowest and highest run of each side: where they overlap, "+
		"the ratio is within this machine's noise.\n\n", repeat)
	b.WriteString(table(rows))
	b.WriteString(rnrNote(rows))
	b.WriteString(sections)
	b.WriteString("\n![each test's speed against its C tool](bench.png)\n")
	if old, err := os.ReadFile(path); err == nil {
		if i := strings.Index(string(old), keptSection); i >= 0 {
			b.WriteString(string(old[i:]))
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// table is the rows as a Markdown table; a side without a run says n/a.
func table(rows []row) string {
	var b strings.Builder
	b.WriteString("| test | size | ours polling | perftest | ours | ratio | perftest runs | ours runs |\n" +
		"| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		pt, ours, ratio := fmt.Sprintf("%.2f", r.Perftest), fmt.Sprintf("%.2f", r.Ours), fmt.Sprintf("%.2f", r.ratio())
		if r.Perftest == 0 {
			pt, ratio = "n/a", "n/a"
		}
		if len(r.OursRuns) == 0 {
			ours, ratio = "n/a", "n/a"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", r.Test, r.Size, r.Poll, pt, ours, ratio,
			spread(r.PerftestRuns), spread(r.OursRuns))
	}
	return b.String()
}

// deviceSectionHead starts the section of BENCHMARKS.md that holds
// device's table (make bench DEVICE=siw). It goes after the kept section,
// so a run on rxe0, which rewrites everything before that, carries it over.
func deviceSectionHead(device string) string { return "\n## On " + device + "\n" }

// writeDeviceSection writes (or replaces) device's section of the
// BENCHMARKS.md at path and leaves the rest of the file as it was.
func writeDeviceSection(path, device string, rows []row, sections string, repeat int) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc, head := string(old), deviceSectionHead(device)
	if i := strings.Index(doc, head); i >= 0 {
		rest := doc[i+len(head):]
		if j := strings.Index(rest, "\n## "); j >= 0 {
			doc = doc[:i] + rest[j:]
		} else {
			doc = doc[:i]
		}
	}
	var b strings.Builder
	b.WriteString(strings.TrimRight(doc, "\n") + "\n" + head + "\n")
	fmt.Fprintf(&b, "Written by `make bench DEVICE=%s` on %s: the same comparison on %s, in one guest boot, "+
		"medians of %d runs, perftest's and ours alternating (columns as in the table above). iWARP has no "+
		"immediate data, so write_imm_bw is not run.\n\n",
		strings.TrimSuffix(device, "0"), time.Now().UTC().Format("2006-01-02 15:04 UTC"), device, repeat)
	b.WriteString(table(rows))
	b.WriteString(sections)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// keptSection starts BENCHMARKS.md's hand-kept part (what the figures
// mean, earlier runs, other tools' figures), which writeMarkdown carries
// over as it is.
const keptSection = "\n## Reading the table\n"

// rnrNote lists the rows during whose runs the device counted RNR NAKs.
func rnrNote(rows []row) string {
	var hit []string
	for _, r := range rows {
		if r.PerftestRNR > 0 || r.OursRNR > 0 {
			hit = append(hit, fmt.Sprintf("%s %d B %s (perftest %d, ours %d)", r.Test, r.Size, r.Poll, r.PerftestRNR, r.OursRNR))
		}
	}
	const what = "\nRNR NAKs (rxe's rcvd_rnr_err; a send that found no receive posted waits 0.64 ms and is sent again) " +
		"during a row's runs, summed: "
	if len(hit) == 0 {
		return what + "none.\n"
	}
	return what + strings.Join(hit, "; ") + ".\n"
}
