package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The gRPC comparison runs examples/grpc's bench (the grpc binary that
// make build puts beside rdmaperf): the same grpc-go Echo service and
// client over rdmanet and then over TCP in one process, in the same boot.
// It has no target (on Soft-RoCE the kernel does RDMA's work in software);
// it shows what a gRPC service gets by changing only its transport.

// grpcCalls is each run's unary calls (and streamed messages).
const grpcCalls = 4000

// grpcCallers are the loads compared: one caller, and 16 sharing the
// client connection.
var grpcCallers = []int{1, 16}

// grpcReport is one transport's figures as grpc -mode bench -json prints
// them.
type grpcReport struct {
	Transport   string  `json:"transport"`
	Callers     int     `json:"callers"`
	CallsPerSec float64 `json:"calls_per_s"`
	P50         float64 `json:"p50_us"`
}

// grpcRow is one load: calls/s and p50 over rdmanet and over TCP, each
// the median of its runs.
type grpcRow struct {
	Callers                          int
	Rdmanet, TCP, RdmanetP50, TCPP50 float64
	RdmanetRuns, TCPRuns             []float64
	RdmanetP50Runs, TCPP50Runs       []float64
}

// ratio is rdmanet's calls/s against TCP's (higher is better).
func (r grpcRow) ratio() float64 { return ratioOf(r.Rdmanet, r.TCP) }

// compareGRPC runs the grpc bench at each load, repeat times.
func compareGRPC(ctx context.Context, self, host string, repeat int) ([]grpcRow, error) {
	bin := filepath.Join(filepath.Dir(self), "grpc")
	var rows []grpcRow
	for _, callers := range grpcCallers {
		r := grpcRow{Callers: callers}
		for range repeat {
			reports, err := runGRPCBench(ctx, bin, host, callers)
			if err != nil {
				return nil, fmt.Errorf("grpc bench, %d callers: %w", callers, err)
			}
			r.RdmanetRuns = append(r.RdmanetRuns, reports["rdmanet"].CallsPerSec)
			r.RdmanetP50Runs = append(r.RdmanetP50Runs, reports["rdmanet"].P50)
			r.TCPRuns = append(r.TCPRuns, reports["tcp"].CallsPerSec)
			r.TCPP50Runs = append(r.TCPP50Runs, reports["tcp"].P50)
		}
		r.Rdmanet, r.TCP = median(r.RdmanetRuns), median(r.TCPRuns)
		r.RdmanetP50, r.TCPP50 = median(r.RdmanetP50Runs), median(r.TCPP50Runs)
		fmt.Printf("grpc %2d callers  rdmanet %8.1f calls/s p50 %8.1f us  tcp %8.1f calls/s p50 %8.1f us  ratio %.2f  runs %s / %s\n",
			callers, r.Rdmanet, r.RdmanetP50, r.TCP, r.TCPP50, r.ratio(), spread(r.RdmanetRuns), spread(r.TCPRuns))
		rows = append(rows, r)
	}
	return rows, nil
}

// runGRPCBench runs one grpc bench and returns its reports by transport.
func runGRPCBench(ctx context.Context, bin, host string, callers int) (map[string]grpcReport, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-mode", "bench", "-json", "-size", "64",
		"-count", strconv.Itoa(grpcCalls), "-callers", strconv.Itoa(callers),
		"-addr", net.JoinHostPort(host, "0")).Output()
	if err != nil {
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			return nil, fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return nil, err
	}
	return parseGRPCBench(string(out), callers)
}

// parseGRPCBench reads grpc bench's JSON lines, and fails unless both
// transports reported the load asked for.
func parseGRPCBench(text string, callers int) (map[string]grpcReport, error) {
	reports := map[string]grpcReport{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var r grpcReport
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("grpc bench printed %q: %w", sc.Text(), err)
		}
		if r.Callers != callers {
			return nil, fmt.Errorf("grpc bench ran %d callers, not %d", r.Callers, callers)
		}
		reports[r.Transport] = r
	}
	for _, t := range []string{"rdmanet", "tcp"} {
		if reports[t].CallsPerSec <= 0 {
			return nil, fmt.Errorf("grpc bench printed no figure over %s:\n%s", t, text)
		}
	}
	return reports, nil
}

// grpcTable is the gRPC rows as a Markdown section.
func grpcTable(rows []grpcRow) string {
	var b strings.Builder
	b.WriteString("\ngRPC: examples/grpc's unary Echo of 64 B (`grpc -mode bench`), the same grpc-go client and server " +
		"over rdmanet and then over TCP in one process, in the same boot; reported, no target (on Soft-RoCE the kernel " +
		"does RDMA's work in software).\n\n" +
		"| callers | rdmanet calls/s | TCP calls/s | ratio | rdmanet p50 µs | TCP p50 µs | rdmanet runs | TCP runs |\n" +
		"| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.2f | %.0f | %.0f | %s | %s |\n", r.Callers, r.Rdmanet, r.TCP, r.ratio(),
			r.RdmanetP50, r.TCPP50, spread(r.RdmanetRuns), spread(r.TCPRuns))
	}
	return b.String()
}
