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
type compareSet struct {
	tests  []string
	sizes  []int
	repeat int
}

var compareTests = []string{"send_bw", "write_bw", "read_bw", "write_imm_bw", "send_lat", "write_lat", "read_lat"}

// testDevice is the RDMA device under test, as the testbed names it
// (RDMACM_TEST_DEVICE): rxe0 or siw0.
func testDevice() string {
	if d := os.Getenv("RDMACM_TEST_DEVICE"); d != "" {
		return d
	}
	return "rxe0"
}

// deviceTests are the tests the device can run: iWARP has no immediate
// data, so write_imm_bw is rxe's only.
func deviceTests() []string {
	if os.Getenv("RDMACM_TEST_TRANSPORT") != "iwarp" {
		return compareTests
	}
	return slices.DeleteFunc(slices.Clone(compareTests), func(t string) bool { return t == "write_imm_bw" })
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
	var rows []row
	add := func(r row) {
		rows = append(rows, r)
		fmt.Printf("%-13s %8d %-7s perftest %10.2f  ours %10.2f  ratio %5.2f  runs %s / %s  rnr %d / %d\n",
			r.Test, r.Size, r.Poll, r.Perftest, r.Ours, r.ratio(), spread(r.PerftestRuns), spread(r.OursRuns),
			r.PerftestRNR, r.OursRNR)
	}
	for _, test := range set.tests {
		lat := strings.HasSuffix(test, "_lat")
		polls := []string{"event", "busy"}
		if lat {
			polls = []string{"busy", "hybrid", "event"}
		}
		for _, size := range set.sizes {
			iters := defaultIters(test, size)
			var pts []float64
			var ptRNR int64
			ours := make(map[string][]float64)
			oursRNR := make(map[string]int64)
			perftest := func() {
				tool, ok := perftestTool[test]
				if !ok {
					return
				}
				// perftest itself sometimes hangs on rxe under TCG; its
				// run is then left out (n/a when no run finished).
				rnr := rnrDelta(device)
				pt, err := runPerftest(ctx, tool, device, host, nextPort(), size, iters, lat)
				ptRNR += rnr()
				if err != nil {
					fmt.Fprintf(os.Stderr, "rdmaperf: %s %d B failed, its figure is left out: %v\n", tool, size, err)
					return
				}
				pts = append(pts, pt)
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
					v := r.BW
					if lat {
						v = r.Typical
					}
					ours[poll] = append(ours[poll], v)
				}
				if i%2 == 1 {
					perftest()
				}
			}
			for _, poll := range polls {
				add(row{Test: test, Size: size, Poll: poll, Perftest: median(pts), Ours: median(ours[poll]), Lat: lat,
					PerftestRuns: pts, OursRuns: ours[poll], PerftestRNR: ptRNR, OursRNR: oursRNR[poll]})
			}
		}
	}
	if !slices.Equal(set.tests, deviceTests()) || !slices.Equal(set.sizes, compareSizes) {
		return nil // a partial comparison is not written or followed by rpc
	}
	rpc, err := runOurs(ctx, self, "rpc", host, nextPort(), 64, 500, "event")
	if err != nil {
		return fmt.Errorf("rpc: %w", err)
	}
	fmt.Printf("rpc: %d callers x 500 calls of 64 B: %.0f calls/s, p50 %.0f us, p99 %.0f us, p99.9 %.0f us\n",
		16, rpc.Calls, rpc.Typical, rpc.P99, rpc.P999)
	if out == "" {
		return nil
	}
	if device != "rxe0" { // another device's table is a section of BENCHMARKS.md
		return writeDeviceSection(filepath.Join(out, "BENCHMARKS.md"), device, rows, rpc, set.repeat)
	}
	if err := writeMarkdown(filepath.Join(out, "BENCHMARKS.md"), rows, rpc, set.repeat); err != nil {
		return err
	}
	return writeChart(filepath.Join(out, "bench.png"), rows)
}

// runPerftest runs a perftest server in the background and its client, over
// rdma_cm (-R), and returns BW average (MiB/s) or t_typical (µs).
func runPerftest(ctx context.Context, tool, device, host string, port, size, iters int, lat bool) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	args := []string{"-R", "-d", device, "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-p", strconv.Itoa(port)}
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
	return parsePerftest(outText, lat)
}

// parsePerftest reads the result line under perftest's "#bytes" header.
func parsePerftest(text string, lat bool) (float64, error) {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "#bytes") || i+1 >= len(lines) {
			continue
		}
		f := strings.Fields(lines[i+1])
		col := 3 // BW average[MB/sec]
		if lat {
			col = 4 // t_typical[usec]
		}
		if len(f) > col {
			return strconv.ParseFloat(f[col], 64)
		}
	}
	return 0, fmt.Errorf("no result in perftest's output:\n%s", text)
}

// runOurs runs rdmaperf's server (waiting for "ready") and client.
func runOurs(ctx context.Context, self, test, host string, port, size, iters int, poll string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	addr := fmt.Sprintf("%s:%d", host, port)
	common := []string{"-test", test, "-size", strconv.Itoa(size), "-iters", strconv.Itoa(iters), "-addr", addr, "-poll", poll}
	srv := exec.CommandContext(ctx, self, append([]string{"-mode", "server"}, common...)...)
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

func writeMarkdown(path string, rows []row, rpc result, repeat int) error {
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
		"perftest busy-polls; ours is shown with each polling mode (hybrid spins 200 µs, about a 4 KiB round trip here, before it sleeps). ")
	fmt.Fprintf(&b, "Each figure is the median of %d runs; perftest's and ours alternate. "+
		"The last two columns are the lowest and highest run of each side: where they overlap, "+
		"the ratio is within this machine's noise.\n\n", repeat)
	b.WriteString(table(rows))
	b.WriteString(rnrNote(rows))
	fmt.Fprintf(&b, "\nRPC (msg.Client, 16 callers on one connection, 64 B echo, event polling): %.0f calls/s, "+
		"p50 %.0f µs, p99 %.0f µs, p99.9 %.0f µs.\n\n![bandwidth against size](bench.png)\n", rpc.Calls, rpc.Typical, rpc.P99, rpc.P999)
	b.WriteString(readingTheTable)
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
func writeDeviceSection(path, device string, rows []row, rpc result, repeat int) error {
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
	fmt.Fprintf(&b, "\nRPC (msg.Client, 16 callers on one connection, 64 B echo, event polling): %.0f calls/s, "+
		"p50 %.0f µs, p99 %.0f µs, p99.9 %.0f µs.\n", rpc.Calls, rpc.Typical, rpc.P99, rpc.P999)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// keptSection starts BENCHMARKS.md's hand-kept part (figures of earlier
// runs and of other tools), which writeMarkdown carries over as it is.
const keptSection = "\n## Earlier runs and other measurements\n"

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

// readingTheTable explains the gaps; it holds for the shape of the figures
// this tool has produced on rxe under TCG, not for any one run.
const readingTheTable = `
## Reading the table

- Latency with busy and hybrid polling waits in ` + "`Endpoint.Next`" + `, which polls the CQ in the
  caller's goroutine and takes the completion it found without a channel; a post of a receive
  and a send together (` + "`PostBatch`" + `) is one cgo crossing. What is left at 64 B is the Go
  path itself under emulation. Measured on 2026-11-22 in one guest boot: perftest 12.4-13.8 µs
  one way; a Go loop calling the same verbs through cgo (post, spin on ibv_poll_cq; no library)
  15.7 µs; C alone 13.0-15.8 µs; this library 18-20 µs. A cgo crossing costs about 0.4 µs in
  the guest (20 ns on the host) and a post or a poll through the library 1-2 µs of Go on top.
  Closing more of it needs polling that does not cross into C (reading the provider's CQ ring,
  which ties the code to one provider) or fewer Go instructions per message. A profile of our
  send_lat 64 B client (` + "`perf record -g`" + ` in the guest, 2026-11-23 08:45 UTC): the Go
  runtime's cgo transitions (entersyscall, exitsyscall, cgocall, asmcgocall) took 4.6% of its
  samples and the poll itself (go_poll_cq) 1.9%, no other Go function above 1%; 11% were the
  kernel switching threads, 4.5% of them the runtime's sysmon sleeping and waking. Ruled out
  the same day (send_lat 64 B busy, 4 alternating rounds of 10000 iterations in one boot each,
  a slow stretch): a spinning Next that never yields (no runtime.Gosched, which wakes an idle
  thread) gave 26.3-35.8 µs against 26.0-29.8 with the yield (perftest 19.0-20.2), and
  GOMAXPROCS=1 on both sides 28.2-35.4 against 17.4-38.2 with 2 (perftest 18.9-23.8).
- Event polling (the default) pays a sleep and a wake-up through Go's netpoller for every
  completion that finds the completion goroutine asleep: in ping-pong latency that is every
  message. In one boot (2026-11-22 22:31 UTC, 3 alternating rounds of 3000 iterations at 64 B)
  perftest's own event mode (` + "`ib_send_lat -e`" + `) took 74-99 µs one way and ours 316-397 µs;
  GOMAXPROCS=1 did not change ours (343-390 µs). ` + "`perf stat`" + ` on our client counted about 6.6
  context switches, 2.9 futex calls and 2.3 nanosleeps of the runtime's sysmon per round trip:
  the completion goroutine wakes on the netpoller, its first call into C wakes sysmon, and the
  Completion it hands over wakes the goroutine in ` + "`Next`" + `, often on another thread.
  perftest's thread is woken once. What would close part of it: ` + "`Next`" + ` in event mode waiting
  on the completion channel itself, so that one goroutine wakes instead of two.
- Bandwidth at 1 MiB is at perftest's or above (rxe's copying and checksumming are the
  bound). At 64 KiB the ratio moves from run to run more than between settings, and most
  of that is perftest's own spread: over 4 boots on 2026-11-23 (01:00-01:40 UTC, send_bw
  64 KiB, busy, perftest and ours alternating, 5000 messages unless said) perftest's runs gave
  46-75 MiB/s and ours 50-71. In the quietest boot perftest gave 66-74 (8 runs) and ours 66-71
  (8 runs): medians 0.93x, and 0.94x with each side pinned to its own CPU (` + "`taskset`" + `);
  in another, with 15000 messages, 0.93x and 0.95x. rxe's hardware counters
  (/sys/class/infiniband/rxe0/ports/1/hw_counters) rose alike for both tools: 1-2 retransmit
  timeouts (completer_retry_err) and 1-31 duplicate requests per 5000 messages, so loss on the
  loopback costs both the same. Our QPs keep the CM's ack timeout: perftest's -u default (14,
  67 ms) made ours retransmit 66-81 times per run and fall to 40-61 MiB/s, because 128
  messages of 64 KiB queued behind one another take longer than that to be acknowledged here.
  A system-wide profile (` + "`perf record -a`" + `, read_bw 64 KiB, busy, one boot): rxe does the
  protocol work in the kernel, in the context of the thread that rings the doorbell, and the
  loopback hands every packet to the softirq of the same CPU, so 47% of our samples are
  kernel code in our client thread, 2% our Go code and 49% the idle loop of the other CPU.
  For send_bw 64 KiB (same tool, 01:25 UTC): rxe's checksumming and copying took 33% of
  perftest's samples and 36% of ours, thread switches 1.2% and 2.4%, and the rest is each
  side spinning on its CQ (perftest in librxe's lock, ours also going in and out of C). What
  is ours to spend is the CPU time the Go runtime's other threads take from rxe's: GOMAXPROCS=1
  beat the default in 5 of 5 alternating send_bw 64 KiB pairs in one boot (64-72 against 53-67
  MiB/s) but in only 2 of 4 in another, 2 of 4 in a third and 6 of 12 (send, write and read
  at 64 KiB, 4 each) in a fourth, which this machine's noise does not let us settle. read_bw
  64 KiB moved no rxe counter in 3 alternating rounds (2026-11-23 01:32 UTC) while perftest
  gave 45-73 MiB/s and ours 51-66; 8 reads per post instead of 64 gave 51-56. Depth 16-256, 1-64 requests per post, and 16 or 128 reads in flight
  (` + "`cm.WithReadDepth`" + `, perftest asks for the device's 128) showed no difference beyond that
  noise. Telling a 5% gap from this noise needs many more runs than a ` + "`make bench`" + ` fits in
  the guest's 20 minutes.
- Message rate at 64 B depends on requests per post: each post is a crossing and a doorbell
  (a syscall on rxe), and one completion stands for a post (perftest's cq_mod is 100). With 16
  per post send_bw measured 0.69-0.99x perftest, with 32 0.77-1.16x, with 64 (the default)
  0.86-0.99x and above 32 in 4 of 5 alternating pairs. Where the time goes (` + "`perf record -a`" + `,
  send_bw 64 B, busy, one boot): perftest 43% kernel, 22% librxe, 14% libc, 11% its own code;
  ours 42% kernel, 31% Go (of which going in and out of C about 6% and ` + "`go_poll_cq`" + ` 4.5%),
  12% librxe, 8% libc, and 4% switching between the runtime's threads, which perftest's top
  symbols do not show. RDMA read at 64 B is above perftest's (1.1-1.7x; not looked into).
  Send at 64 B also meets receivers not ready (RNR), which write and read cannot: in 8 rounds
  of send_bw 64 B busy, 20000 messages, on 2026-11-23 (09:20 UTC, two boots) the device counted
  RNR NAKs in 4 of our 8 runs (1-5 each) with 512 receives posted, perftest's default, in none
  of 8 with 4096, and in none of perftest's 16 with either. Loopback rxe consumes the server's
  receives in the client's own context, so a server that stops for longer than 512 messages
  (about 15 ms here) runs dry; ours did so and perftest's did not (no garbage collection ran:
  GODEBUG=gctrace=1). The figures spread too widely (1.14-2.38 MiB/s) to show what an RNR
  costs, so the depth stays perftest's and the table counts them (above).
- The kernel's CM leaves a QP's RNR timer at 655 ms; on rxe a message that found no receive
  posted then stalled the run for ~0.7 s (send_bw 64 B fell to 0.9 MiB/s in runs that hit one).
  cm sets 0.64 ms (` + "`cm.WithRNRTimer`" + `), as perftest and rc_pingpong do.
- perftest's own figures move between runs and boots (ib_send_lat at 64 B: 10.6-21.6 µs over
  the runs of 2026-11-22 and 23), hence the medians of alternating runs; compare ratios within one table.
`
