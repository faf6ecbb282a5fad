package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// rpcCallers are the RPC comparison's numbers of concurrent callers on one
// connection (issue 15's: 1, 16 and 64).
var rpcCallers = []int{1, 16, 64}

// rpcRow is RPC calls/s with some callers against the device's message
// rate (ib_send_bw -s 64's MsgRate), measured in turn in one boot: the most
// one-way messages the verbs move, where a call is two messages.
type rpcRow struct {
	Callers             int
	Calls, P50, P99     float64 // medians: calls/s, µs
	Rate                float64 // ib_send_bw messages/s, median
	CallsRuns, RateRuns []float64
}

func (r rpcRow) ratio() float64 {
	if r.Rate == 0 {
		return 0
	}
	return r.Calls / r.Rate
}

// compareRPC runs our RPC benchmark (64 B echo, event polling, 500 calls
// per caller) with each number of callers, and ib_send_bw at 64 B, in turn.
func compareRPC(ctx context.Context, self, device, host string, nextPort func() int, repeat int) ([]rpcRow, error) {
	var rows []rpcRow
	for _, callers := range rpcCallers {
		r := rpcRow{Callers: callers}
		var p50s, p99s []float64
		for range repeat {
			rate, err := sendBWMsgRate(ctx, device, host, nextPort())
			if err != nil {
				fmt.Fprintf(os.Stderr, "rdmaperf: ib_send_bw 64 B failed, its figure is left out: %v\n", err)
			} else {
				r.RateRuns = append(r.RateRuns, rate)
			}
			res, err := runOurs(ctx, self, "rpc", host, nextPort(), 64, defaultIters("rpc", 64), "event", "-callers", strconv.Itoa(callers))
			if err != nil {
				return nil, fmt.Errorf("rpc with %d callers: %w", callers, err)
			}
			r.CallsRuns = append(r.CallsRuns, res.Calls)
			p50s, p99s = append(p50s, res.Typical), append(p99s, res.P99)
		}
		r.Calls, r.P50, r.P99, r.Rate = median(r.CallsRuns), median(p50s), median(p99s), median(r.RateRuns)
		fmt.Printf("rpc %2d callers: %8.0f calls/s  p50 %6.0f us  p99 %6.0f us  ib_send_bw %8.0f msg/s  ratio %.3f  runs %s / %s\n",
			callers, r.Calls, r.P50, r.P99, r.Rate, r.ratio(), spread(r.CallsRuns), spread(r.RateRuns))
		rows = append(rows, r)
	}
	return rows, nil
}

// sendBWMsgRate is the RPC rows' anchor: ib_send_bw -s 64's message rate,
// in messages/s.
func sendBWMsgRate(ctx context.Context, device, host string, port int) (float64, error) {
	rate, err := runPerftest(ctx, "ib_send_bw", device, host, port, 64, defaultIters("send_bw", 64), colMsgRate)
	return rate * 1e6, err
}

// rpcTable is the RPC rows as a Markdown section.
func rpcTable(rows []rpcRow) string {
	var b strings.Builder
	b.WriteString("\nRPC: msg.Client calling a msg.Server's 64 B echo on one connection with event polling, " +
		"against the device's message rate (`ib_send_bw -R -s 64`'s MsgRate) in the same boot; a call is two messages.\n\n" +
		"| callers | calls/s | p50 µs | p99 µs | ib_send_bw msg/s | ratio | calls/s runs | msg/s runs |\n" +
		"| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		rate, ratio := fmt.Sprintf("%.0f", r.Rate), fmt.Sprintf("%.3f", r.ratio())
		if r.Rate == 0 {
			rate, ratio = "n/a", "n/a"
		}
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.0f | %s | %s | %s | %s |\n", r.Callers, r.Calls, r.P50, r.P99, rate, ratio,
			spreadInt(r.CallsRuns), spreadInt(r.RateRuns))
	}
	return b.String()
}

// spreadInt is spread for figures too large for decimals.
func spreadInt(runs []float64) string {
	if len(runs) == 0 {
		return "n/a"
	}
	lo, hi := runs[0], runs[0]
	for _, v := range runs {
		lo, hi = min(lo, v), max(hi, v)
	}
	return fmt.Sprintf("%.0f-%.0f", lo, hi)
}
