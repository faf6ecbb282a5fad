package main

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
)

// Output of perftest 4.5 on rxe, as -compare reads it.
const (
	sendBWOutput = `---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      5000             72.66              54.73  		   0.000876
---------------------------------------------------------------------------------------
`
	sendLatOutput = `---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      1000          9.80           151.20       10.63     	11.02       	2.95   		19.40   		151.20  
---------------------------------------------------------------------------------------
`
)

func TestParsePerftestTakesAverageBandwidthAndTypicalLatency(t *testing.T) {
	bw, err := parsePerftest(sendBWOutput, colBWAverage)
	require.NoError(t, err)
	assert.Equal(t, 54.73, bw, "BW average, not BW peak (72.66): ours is an average too")

	rate, err := parsePerftest(sendBWOutput, colMsgRate)
	require.NoError(t, err)
	assert.Equal(t, 0.000876, rate, "MsgRate, in Mpps")

	lat, err := parsePerftest(sendLatOutput, colTypical)
	require.NoError(t, err)
	assert.Equal(t, 10.63, lat, "t_typical")

	_, err = parsePerftest("Couldn't connect to 10.77.0.1:18701\n", colBWAverage)
	assert.ErrorContains(t, err, "no result")
}

func TestMedianAndSpread(t *testing.T) {
	runs := []float64{72.99, 44.86, 52.52}
	assert.Equal(t, 52.52, median(runs))
	assert.Equal(t, []float64{72.99, 44.86, 52.52}, runs, "median sorts a copy")
	assert.Equal(t, "44.86-72.99", spread(runs))
	assert.Equal(t, "n/a", spread(nil))
	assert.Equal(t, 0.0, median(nil))
}

func TestMarkdownShowsEveryRunsSpread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	rows := []row{
		{Test: "read_bw", Size: 65536, Poll: "busy", Perftest: 52.52, Ours: 62.26,
			PerftestRuns: []float64{72.99, 44.86, 52.52}, OursRuns: []float64{62.26, 66.41, 51.17}},
		{Test: "write_imm_bw", Size: 64, Poll: "busy", Ours: 1.93, OursRuns: []float64{1.93}},
	}
	require.NoError(t, writeMarkdown(path, rows, "", 3))
	md, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(md), "| read_bw | 65536 | busy | 52.52 | 62.26 | 1.19 | 44.86-72.99 | 51.17-66.41 |\n")
	assert.Contains(t, string(md), "| write_imm_bw | 64 | busy | n/a | 1.93 | n/a | n/a | 1.93-1.93 |\n")
	assert.Contains(t, string(md), "during a row's runs, summed: none.\n")
	assert.True(t, strings.HasSuffix(string(md), "(bench.png)\n"), "the generated part ends with the chart")
}

// A new make bench rewrites its table and keeps the hand-kept section.
func TestMarkdownKeepsTheEarlierRunsSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	kept := keptSection + "\n| earlier | figures |\n"
	require.NoError(t, os.WriteFile(path, []byte("# Benchmarks\n\nold table\n"+kept), 0o644))
	require.NoError(t, writeMarkdown(path, nil, "", 3))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(got), "old table")
	assert.True(t, strings.HasSuffix(string(got), kept), "the kept section is carried over whole, at the end")
	require.NoError(t, writeMarkdown(path, nil, "", 3))
	again, _ := os.ReadFile(path)
	assert.Equal(t, 1, strings.Count(string(again), keptSection), "and only once")
}

func TestRNRNoteNamesTheRowsThatHadThem(t *testing.T) {
	rows := []row{
		{Test: "send_bw", Size: 64, Poll: "event", PerftestRNR: 0, OursRNR: 0},
		{Test: "send_bw", Size: 64, Poll: "busy", PerftestRNR: 1, OursRNR: 5},
		{Test: "send_bw", Size: 4096, Poll: "busy", OursRNR: 2},
	}
	note := rnrNote(rows)
	assert.Contains(t, note, "summed: send_bw 64 B busy (perftest 1, ours 5); send_bw 4096 B busy (perftest 0, ours 2).\n")
	assert.NotContains(t, note, "event")
}

func TestReadCounter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rcvd_rnr_err")
	require.NoError(t, os.WriteFile(path, []byte("42\n"), 0o644))
	v, ok := readCounter(path)
	assert.True(t, ok)
	assert.Equal(t, int64(42), v)
	_, ok = readCounter(filepath.Join(t.TempDir(), "missing"))
	assert.False(t, ok, "no device, no counter")
}

func TestChartShowsEachRowsSpeedAgainstItsAnchor(t *testing.T) {
	rows := []row{
		{Test: "send_bw", Size: 65536, Poll: "busy", Perftest: 40, Ours: 20},
		{Test: "send_lat", Size: 64, Poll: "event", Perftest: 120, Ours: 240, Lat: true},
		{Test: "write_imm_bw", Size: 64, Poll: "busy", Ours: 1.2}, // no anchor: not charted
	}
	rpc := []rpcRow{{Callers: 64, Calls: 4000, Rate: 40000}, {Callers: 1, Calls: 700}} // no rate: not charted
	conn := connectRow{Conns: 150, CmtimeConns: 600, TeardownMs: 900, CmtimeTeardownMs: 360}
	monitor := []monitorRow{
		{Case: monitorCases[0], Anchor: 150, Awake: 200},
		{Case: monitorCases[3], Anchor: 40000, Awake: 8000},
		{Case: monitorCases[1], Awake: 200}, // no anchor: not charted
		{Case: monitorCases[4], Anchor: 40, Awake: 44},
	}
	grpc := []grpcRow{{Callers: 16, Rdmanet: 2700, TCP: 3000}, {Callers: 1, Rdmanet: 500}} // no TCP figure: not charted
	got := chartBars(rows, rpc, conn, monitor, grpc)
	require.Len(t, got, 9)
	assert.Equal(t, bar{"send_bw 64K busy", 0.5}, got[0], "bandwidth: ours / perftest")
	assert.Equal(t, bar{"send_lat 64 event", 0.5}, got[1], "latency: perftest / ours, so that higher is faster")
	assert.Equal(t, bar{"rpc 64 x64 callers event", 0.1}, got[2], "rpc: calls/s against messages/s, as in its table")
	assert.Equal(t, bar{"connect set-up 500", 0.25}, got[3], "set-up: our rate / cmtime's")
	assert.Equal(t, bar{"connect teardown 500", 0.4}, got[4], "teardown: cmtime's time / ours")
	assert.Equal(t, bar{"send_lat 64 event, sysmon awake", 0.75}, got[5], "latency: the anchor / ours")
	assert.Equal(t, bar{"rpc 64 x64 callers event, sysmon awake", 0.2}, got[6], "rpc: calls/s / messages/s")
	assert.Equal(t, bar{"stream_bw 64K event, sysmon awake", 1.1}, got[7], "bandwidth: ours / the anchor")
	assert.Equal(t, bar{"grpc 64 x16 callers, rdmanet vs TCP", 0.9}, got[8], "grpc: calls/s over rdmanet / over TCP")
	assert.Equal(t, "64K", sizeLabel(65536))
	img := drawnChart(t, got)
	assert.Equal(t, chartTop+chartBottom+chartRowH*len(got), img.Bounds().Dy(), "a row per bar")
	assert.Equal(t, labelWidth(got)+plotW+rightMargin, img.Bounds().Dx(), "the plot keeps its width")
}

// The plot starts right of the longest label, measured in the chart's
// font, so no label runs into the bars; short labels keep the usual width.
func TestChartLabelsEndBeforeThePlot(t *testing.T) {
	long := bar{"rpc 64 x64 callers event, sysmon awake, and a longer one", 0.2}
	bars := []bar{{"send_bw 64 busy", 1}, long}
	width := font.MeasureString(basicfont.Face7x13, long.label).Ceil()
	assert.Greater(t, labelWidth(bars), labelX+width, "the longest label ends before the plot")
	assert.Equal(t, minLabelW, labelWidth(bars[:1]))
}

// make bench DEVICE=siw writes its own section of BENCHMARKS.md, replacing
// the last one; a later run on rxe0 rewrites its table and keeps it.
func TestDeviceSectionSurvivesBothWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	require.NoError(t, os.WriteFile(path, []byte("# Benchmarks\n\nrxe table\n"+keptSection+"\n| earlier |\n"), 0o644))
	siwRows := []row{{Test: "send_bw", Size: 64, Poll: "busy", Perftest: 2, Ours: 1, PerftestRuns: []float64{2}, OursRuns: []float64{1}},
		{Test: "read_lat", Size: 64, Poll: "event", Perftest: 30, PerftestRuns: []float64{30}}}
	require.NoError(t, writeDeviceSection(path, "siw0", siwRows, rpcTable([]rpcRow{{Callers: 16, Calls: 1234}}), 3))
	require.NoError(t, writeDeviceSection(path, "siw0", siwRows, rpcTable([]rpcRow{{Callers: 16, Calls: 1234}}), 3))
	md, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(md), deviceSectionHead("siw0")), "replaced, not repeated")
	assert.Contains(t, string(md), "rxe table", "the rest is left as it was")
	assert.Contains(t, string(md), "| send_bw | 64 | busy | 2.00 | 1.00 | 0.50 | 2.00-2.00 | 1.00-1.00 |\n")
	assert.Contains(t, string(md), "| read_lat | 64 | event | 30.00 | n/a | n/a | 30.00-30.00 | n/a |\n", "a side with no run says n/a")
	assert.Contains(t, string(md), "| 16 | 1234 |")

	require.NoError(t, writeMarkdown(path, nil, "", 3))
	md, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(md), "rxe table", "rxe's part is rewritten")
	assert.Equal(t, 1, strings.Count(string(md), deviceSectionHead("siw0")), "and siw's section kept")
}

func TestIWARPRunsNoImmediateDataNorDatagrams(t *testing.T) {
	t.Setenv("RDMACM_TEST_TRANSPORT", "iwarp")
	assert.NotContains(t, deviceTests(), "write_imm_bw")
	assert.NotContains(t, deviceTests(), "ud_bw")
	assert.Len(t, deviceTests(), len(compareTests)-2)
	t.Setenv("RDMACM_TEST_TRANSPORT", "roce")
	assert.Equal(t, compareTests, deviceTests())
}

// TestParseRstream reads the result line of rstream's custom mode, laid out
// as rstream.c's show_perf prints it.
func TestParseRstream(t *testing.T) {
	line := func(size string, gbps, usec float64) string {
		return fmt.Sprintf("%-10s%-8s%-8s%-8s%-8s%8s %10s%13s\n", "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer") +
			fmt.Sprintf("%-10s%-8s%-8s%-8s%-8s%8.2fs%10.2f%11.2f\n", "custom", size, "2k", "1", "256m", 1.25, gbps, usec)
	}
	out := line("64k", 1.72, 305.12)
	lat, err := parseRstream(out, 65536, true)
	require.NoError(t, err)
	require.InDelta(t, 305.12, lat, 1e-9)
	bw, err := parseRstream(out, 65536, false)
	require.NoError(t, err)
	require.InDelta(t, 65536/305.12*1e6/(1<<20), bw, 1e-9, "a transfer's bytes in its time")
	// 1 KiB in 300 µs is 3.26 MiB/s, which Gb/sec rounds to 0.03 (3.58).
	bw, err = parseRstream(line("1k", 0.03, 300), 1024, false)
	require.NoError(t, err)
	require.InDelta(t, 1024/300.0*1e6/(1<<20), bw, 1e-9, "not the rounded Gb/sec")
	_, err = parseRstream(line("1k", 0, 0), 1024, false)
	require.ErrorContains(t, err, "usec/xfer", "no time is no bandwidth")
	_, err = parseRstream("rstream: connection refused\n", 64, true)
	require.Error(t, err)
}

func TestEventRowsAreComparedWithTheCToolsBlockingMode(t *testing.T) {
	assert.Equal(t, []string{"busy", "event"}, anchorModes("send_lat"))
	assert.Equal(t, "event", anchorMode("send_lat", "event"))
	assert.Equal(t, "busy", anchorMode("send_lat", "hybrid"))
	assert.Equal(t, "busy", anchorMode("write_lat", "event"), "ib_write_lat has no event mode")
	assert.Equal(t, []string{"busy"}, anchorModes("send_bw"), "bandwidth keeps perftest's default")
	assert.Equal(t, "busy", anchorMode("send_bw", "event"))
	assert.Equal(t, "event", anchorMode("stream_lat", "event"), "rstream's blocking calls")
	assert.Equal(t, "event", anchorMode("stream_bw", "event"))
	assert.Equal(t, "busy", anchorMode("stream_lat", "busy"), "rstream's default non-blocking calls spin")
	assert.Equal(t, "busy", anchorMode("stream_lat", "hybrid"))
}

// TestRstreamArgs: rstream runs in the stream test's shape, and blocks
// (-T b) only as the anchor of event polling.
func TestRstreamArgs(t *testing.T) {
	assert.Equal(t, []string{"-p", "18701", "-S", "64", "-I", "2000", "-C", "1"}, rstreamArgs("stream_lat", "busy", 18701, 64, 2000))
	assert.Equal(t, []string{"-p", "18702", "-S", "65536", "-I", "1", "-C", "2000", "-T", "b"}, rstreamArgs("stream_bw", "event", 18702, 65536, 2000))
}

func TestRPCTableRatiosAgainstTheMessageRate(t *testing.T) {
	md := rpcTable([]rpcRow{
		{Callers: 16, Calls: 5000, P50: 3100, P99: 9000, Rate: 50000, CallsRuns: []float64{4800, 5000, 5300}, RateRuns: []float64{41000, 50000, 54000}},
		{Callers: 64, Calls: 4000, P50: 15000, P99: 30000, CallsRuns: []float64{4000}},
	})
	assert.Contains(t, md, "| 16 | 5000 | 3100 | 9000 | 50000 | 0.100 | 4800-5300 | 41000-54000 |\n")
	assert.Contains(t, md, "| 64 | 4000 | 15000 | 30000 | n/a | n/a | 4000-4000 | n/a |\n")
}

func TestMonitorTableComparesBothRuntimesWithOneAnchor(t *testing.T) {
	md := monitorTable([]monitorRow{
		{Case: monitorCases[0], Anchor: 150, Default: 240, Awake: 180,
			AnchorRuns: []float64{140, 150}, DefaultRuns: []float64{230, 240}, AwakeRuns: []float64{170, 180}},
		{Case: monitorCases[3], Default: 6400, Awake: 9400, DefaultRuns: []float64{6400}, AwakeRuns: []float64{9400}},
		{Case: monitorCases[4], Anchor: 40, Default: 36, Awake: 42, AnchorRuns: []float64{40}, DefaultRuns: []float64{36}, AwakeRuns: []float64{42}},
	})
	assert.Contains(t, md, "| send_lat 64 B, µs | 150.0 | 240.0 | 1.600 | 180.0 | 1.200 | 140.00-150.00 | 230.00-240.00 | 170.00-180.00 |\n")
	assert.Contains(t, md, "| rpc 64 B, 64 callers, calls/s | n/a | 6400.0 | n/a | 9400.0 | n/a |", "no anchor run: no ratio")
	assert.Contains(t, md, "| stream_bw 64 KiB, MiB/s | 40.0 | 36.0 | 0.900 | 42.0 | 1.050 |", "bandwidth: ours / the anchor")
	assert.Contains(t, md, monitorAwake)
}

// cmtimeOutput is what cmtime -s printed for 500 connections on rxe0.
const cmtimeOutput = `creating id
resolving address
resolving route
creating qp
connecting
disconnecting
destroying id
step              total ms     max ms     min us  us / conn
create id    :        6.87       0.29       6.00      13.74
resolve addr :       36.18      15.08      64.00      72.37
resolve route:       20.32       8.84    1056.00      40.64
create qp    :       97.59       5.38     119.00     195.17
connect      :      775.36     687.00   33527.00    1550.73
disconnect   :      399.46     228.46     927.00     798.92
destroy      :        6.89       0.49       9.00      13.79
`

func TestParseCmtime(t *testing.T) {
	totals, err := parseCmtime(cmtimeOutput)
	require.NoError(t, err)
	require.InDelta(t, 36.18, totals["resolve addr"], 1e-9)
	require.InDelta(t, 6.89, totals["destroy"], 1e-9)
	_, err = parseCmtime(strings.Replace(cmtimeOutput, "connect      :", "connecting   :", 1))
	require.ErrorContains(t, err, `"connect"`, "a missing step is an error, not a zero")
	md := connectTable(connectRow{Conns: 400, CmtimeConns: 500, TeardownMs: 600, CmtimeTeardownMs: 400,
		ConnsRuns: []float64{400}, CmtimeConnsRuns: []float64{500}, TeardownRuns: []float64{600}, CmtimeTeardownRuns: []float64{400}})
	require.Contains(t, md, "| set-up, connections/s (higher is better) | 500 | 400 | 0.80 |")
	require.Contains(t, md, "| teardown, ms (lower is better) | 400 | 600 | 1.50 |")
	require.NotContains(t, md, "cmtime's queues", "no shallow run, no row")
	md = connectTable(connectRow{Conns: 400, CmtimeConns: 500, ShallowConns: 450, ConnsRuns: []float64{400},
		CmtimeConnsRuns: []float64{500}, ShallowConnsRuns: []float64{450},
		CmtimeTeardownMs: 400, ShallowTeardownMs: 500, CmtimeTeardownRuns: []float64{400}, ShallowTeardownRuns: []float64{500}})
	require.Contains(t, md, "| set-up with cmtime's queues (1 deep), connections/s | 500 | 450 | 0.90 |")
	require.Contains(t, md, "| teardown with cmtime's queues (1 deep), ms | 400 | 500 | 1.25 |")
	require.Empty(t, connectTable(connectRow{}), "no run, no section")
}

func TestGivenSizesReplaceTheFixedOnes(t *testing.T) {
	set := compareSet{tests: compareTests, sizes: compareSizes}
	assert.Equal(t, []int{1024, 65536}, set.sizesOf("stream_bw"), "stream bandwidth runs the issue's sizes by default")
	assert.Equal(t, compareSizes, set.sizesOf("send_bw"))

	set.sizes, set.sized = []int{4096}, true
	for _, test := range []string{"stream_bw", "stream_lat", "rendezvous", "send_lat"} {
		assert.Equal(t, []int{4096}, set.sizesOf(test), "-sizes 4096 with -test %s", test)
	}
}

func TestFigureOfEachTest(t *testing.T) {
	r := result{BW: 40, Typical: 12, Avg: 15, Calls: 900}
	assert.Equal(t, 40.0, figureOf("send_bw", r))
	assert.Equal(t, 40.0, figureOf("rendezvous", r))
	assert.Equal(t, 12.0, figureOf("send_lat", r), "latency: t_typical")
	assert.Equal(t, 15.0, figureOf("stream_lat", r), "rstream reports the average")
	assert.Equal(t, 900.0, figureOf("rpc", r))
}

// The gRPC rows read grpc -mode bench -json's lines, one per transport,
// and refuse output that lacks a transport or ran another load.
func TestParseGRPCBench(t *testing.T) {
	out := `{"transport":"rdmanet","size":64,"callers":16,"calls":4000,"calls_per_s":2717.5,"p50_us":5400.2,"p99_us":9000,"stream_msgs_per_s":27728}
{"transport":"tcp","size":64,"callers":16,"calls":4000,"calls_per_s":2627,"p50_us":5800,"p99_us":9900,"stream_msgs_per_s":33103}
`
	got, err := parseGRPCBench(out, 16)
	require.NoError(t, err)
	assert.Equal(t, grpcReport{Transport: "rdmanet", Callers: 16, CallsPerSec: 2717.5, P50: 5400.2}, got["rdmanet"])
	assert.Equal(t, grpcReport{Transport: "tcp", Callers: 16, CallsPerSec: 2627, P50: 5800}, got["tcp"])
	_, err = parseGRPCBench(out, 1)
	assert.ErrorContains(t, err, "ran 16 callers, not 1")
	_, err = parseGRPCBench(strings.SplitAfter(out, "\n")[0], 16)
	assert.ErrorContains(t, err, "no figure over tcp")
	_, err = parseGRPCBench("grpc over rdmanet, 64 B, 16 callers: 4000 unary calls\n", 16)
	assert.ErrorContains(t, err, "grpc bench printed")

	table := grpcTable([]grpcRow{{Callers: 16, Rdmanet: 2700, TCP: 3000, RdmanetP50: 5400, TCPP50: 5800,
		RdmanetRuns: []float64{2600, 2700, 2800}, TCPRuns: []float64{2900, 3000, 3100}}})
	assert.Contains(t, table, "| 16 | 2700 | 3000 | 0.90 | 5400 | 5800 | 2600.00-2800.00 | 2900.00-3100.00 |")
}

// TestCheckTests: a server or a client runs one test, one of the compared
// tests or rpc or connect; -compare runs a list of compared tests or one
// of its own tables alone. Anything else is refused, naming what is
// accepted, before anything runs.
func TestCheckTests(t *testing.T) {
	for _, ok := range []string{"send_bw", "stream_lat", "rpc", "connect"} {
		assert.NoError(t, checkTests(ok, false), ok)
	}
	for _, bad := range []string{"", "monitor", "grpc", "send_bw,read_bw", "rcp"} {
		err := checkTests(bad, false)
		require.Error(t, err, bad)
		assert.ErrorContains(t, err, "rpc, connect", bad)
	}
	for _, ok := range []string{"send_bw", "send_bw,stream_lat", "rpc", "connect", "monitor", "grpc"} {
		assert.NoError(t, checkTests(ok, true), ok)
	}
	for _, bad := range []string{"", "rpc,send_bw", "send_bw,", "monitor,grpc", "rcp"} {
		err := checkTests(bad, true)
		require.Error(t, err, bad)
		assert.ErrorContains(t, err, "rpc, connect, monitor, grpc", bad)
	}
}

// Every target names a bar that a full comparison charts, so that a label
// changed on one side cannot leave a target unmarked and out of its table.
func TestEveryGoalNamesAChartedBar(t *testing.T) {
	var rows []row
	for _, test := range deviceTests() {
		for _, size := range (compareSet{sizes: compareSizes}).sizesOf(test) {
			for _, poll := range pollsOf(test) {
				rows = append(rows, row{Test: test, Size: size, Poll: poll, Perftest: 1, Ours: 1})
			}
		}
	}
	var rpc []rpcRow
	for _, n := range rpcCallers {
		rpc = append(rpc, rpcRow{Callers: n, Calls: 1, Rate: 1})
	}
	conn := connectRow{Conns: 1, CmtimeConns: 1, TeardownMs: 1, CmtimeTeardownMs: 1}
	labels := map[string]bool{}
	for _, b := range chartBars(rows, rpc, conn, nil, nil) {
		labels[b.label] = true
	}
	for _, g := range goals {
		assert.True(t, labels[g.bar], "goal %q names no bar", g.bar)
	}
}

// The targets' table says each in its issue's terms (a time as ours /
// the anchor, a rate as the fraction of the anchor's), and only a bar that
// reaches its target meets it; bars without one are left out.
func TestGoalsTableSaysEachTargetInItsTerms(t *testing.T) {
	md := goalsTable([]bar{
		{"send_lat 64 event", 1 / 3.7},
		{"rpc 64 x64 callers event", 0.4},
		{"connect teardown 500", 0.5},
		{"send_bw 64 busy", 0.7}, // no target
	})
	assert.Contains(t, md, "| send_lat 64 event | 15 | at most 1.50x | 3.70x | no |")
	assert.Contains(t, md, "| rpc 64 x64 callers event | 15 | at least 0.4 | 0.4 | yes |", "reaching it meets it")
	assert.Contains(t, md, "| connect teardown 500 | 15 | at most 1.00x | 2.00x | no |")
	assert.NotContains(t, md, "send_bw")
	assert.Empty(t, goalsTable([]bar{{"send_bw 64 busy", 0.7}}), "no target, no section")
}

// The chart marks a target with a blue tick on its bar's row, at the
// target's speed, and nowhere on a row without one.
func TestChartMarksEachTarget(t *testing.T) {
	bars := []bar{{"send_bw 64 busy", 0.7}, {"rpc 64 x64 callers event", 0.2}}
	img := drawnChart(t, bars)
	x := plotX(labelWidth(bars), 0.4)
	assert.Equal(t, goalColor, color.RGBAModel.Convert(img.At(x, rowY(1)-5)), "the tick, above the bar")
	assert.NotEqual(t, goalColor, color.RGBAModel.Convert(img.At(x, rowY(0)-5)), "no target, no tick")

	// A target at 1x, on the black 1x line, shows beside it.
	bars = []bar{{"connect teardown 500", 0.5}}
	img = drawnChart(t, bars)
	one := plotX(labelWidth(bars), 1)
	above := rowY(0) - 10
	assert.Equal(t, color.RGBA{0, 0, 0, 255}, color.RGBAModel.Convert(img.At(one, above)), "the 1x line, above the tick")
	assert.Equal(t, color.RGBA{255, 255, 255, 255}, color.RGBAModel.Convert(img.At(one+2, above)), "beside the 1x line, above the tick")
	assert.Equal(t, goalColor, color.RGBAModel.Convert(img.At(one+2, rowY(0)-5)), "the tick, wider than the line")
}

// drawnChart is the chart writeChart draws of bars, as read back from its
// file.
func drawnChart(t *testing.T, bars []bar) image.Image {
	path := filepath.Join(t.TempDir(), "bench.png")
	require.NoError(t, writeChart(path, bars))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	return img
}
