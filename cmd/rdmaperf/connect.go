package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/endpoint"
)

// The connect test measures connection set-up and teardown the way
// librdmacm's cmtime does: the client dials -iters connections at once to
// one listener and reports connections per second until the last is up,
// then closes them all at once and reports how long that took. The server
// accepts each request in a goroutine of its own and closes the connection
// when the client's side goes. -depth is each connection's send and
// receive queue depth (cmtime's QPs hold 1 of each).

// connectIters is the number of connections, cmtime -c's in the issue.
const connectIters = 500

func serveConnect(ctx context.Context, cfg config) error {
	l, err := cm.Listen(ctx, cfg.addr, cm.WithBacklog(cfg.iters), cm.WithQueueDepth(cfg.depth))
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("ready")
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		// Each request is accepted in a goroutine of its own, so that the
		// set-ups (QP, accept, the wait for the dialer's RTU) overlap.
		req, err := l.AcceptRequest(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Go(func() {
			ep, err := req.Accept(ctx)
			if err != nil {
				fmt.Fprintf(os.Stderr, "rdmaperf: accept: %v\n", err)
				return
			}
			select {
			case <-ep.Done():
			case <-ctx.Done():
			}
			ep.Close()
		})
	}
}

func connectClient(ctx context.Context, cfg config) (result, error) {
	eps := make([]*endpoint.Endpoint, cfg.iters)
	errs := make([]error, cfg.iters)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range eps {
		wg.Go(func() { eps[i], errs[i] = cm.Dial(ctx, cfg.addr, cm.WithQueueDepth(cfg.depth)) })
	}
	wg.Wait()
	setup := since(start)
	start = time.Now()
	for _, ep := range eps {
		if ep != nil {
			wg.Go(func() { ep.Close() })
		}
	}
	wg.Wait()
	teardown := since(start)
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	return result{Test: cfg.test, Iters: cfg.iters, Conns: float64(cfg.iters) / setup, TeardownMs: teardown * 1000}, nil
}

// cmtimeSetupSteps and cmtimeTeardownSteps are the rows of cmtime's table
// that set a connection up and take it down.
var (
	cmtimeSetupSteps    = []string{"create id", "resolve addr", "resolve route", "create qp", "connect"}
	cmtimeTeardownSteps = []string{"disconnect", "destroy"}
)

// runCmtime runs cmtime's server and client with n connections and
// returns its set-up rate (connections/s over its set-up steps' summed
// totals) and its teardown time in ms (disconnect and destroy summed).
func runCmtime(ctx context.Context, host string, port, n int) (rate, teardownMs float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	p, c := strconv.Itoa(port), strconv.Itoa(n)
	srv := exec.CommandContext(ctx, "cmtime", "-b", host, "-p", p, "-c", c)
	if err := srv.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	time.Sleep(300 * time.Millisecond) // cmtime says nothing when it listens
	out, err := exec.CommandContext(ctx, "cmtime", "-s", host, "-p", p, "-c", c).CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("cmtime: %w: %s", err, out)
	}
	totals, err := parseCmtime(string(out))
	if err != nil {
		return 0, 0, err
	}
	var setup float64
	for _, s := range cmtimeSetupSteps {
		setup += totals[s]
	}
	for _, s := range cmtimeTeardownSteps {
		teardownMs += totals[s]
	}
	return float64(n) / (setup / 1000), teardownMs, nil
}

// parseCmtime reads the "total ms" column of cmtime's table by step,
// and fails unless every step measured is there.
func parseCmtime(text string) (map[string]float64, error) {
	totals := map[string]float64{}
	for _, l := range strings.Split(text, "\n") {
		step, rest, ok := strings.Cut(l, ":")
		f := strings.Fields(rest)
		if !ok || len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			totals[strings.TrimSpace(step)] = v
		}
	}
	for _, s := range append(cmtimeSetupSteps, cmtimeTeardownSteps...) {
		if _, ok := totals[s]; !ok {
			return nil, fmt.Errorf("cmtime printed no %q step:\n%s", s, text)
		}
	}
	return totals, nil
}

// connectRow is our set-up rate and teardown time against cmtime's, each
// the median of its runs. The Shallow figures are ours with cmtime's queue
// depth (1): what the library costs beyond the queues it makes and
// destroys.
type connectRow struct {
	Conns, CmtimeConns                    float64
	TeardownMs, CmtimeTeardownMs          float64
	ShallowConns, ShallowTeardownMs       float64
	ConnsRuns, CmtimeConnsRuns            []float64
	TeardownRuns, CmtimeTeardownRuns      []float64
	ShallowConnsRuns, ShallowTeardownRuns []float64
}

// cmtimeDepth is the send and receive queue depth of cmtime's QPs.
const cmtimeDepth = 1

// compareConnect runs cmtime and our connect test in turn, repeat times.
func compareConnect(ctx context.Context, self, host string, nextPort func() int, repeat int) connectRow {
	var r connectRow
	for range repeat {
		rate, down, err := runCmtime(ctx, host, nextPort(), connectIters)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rdmaperf: cmtime failed, its figure is left out: %v\n", err)
		} else {
			r.CmtimeConnsRuns, r.CmtimeTeardownRuns = append(r.CmtimeConnsRuns, rate), append(r.CmtimeTeardownRuns, down)
		}
		// A run of ours that fails is left out as cmtime's is, with a
		// line on stderr, so that the rest of the comparison is still
		// written.
		if res, err := runOurs(ctx, self, "connect", host, nextPort(), 0, connectIters, "event"); err != nil {
			fmt.Fprintf(os.Stderr, "rdmaperf: connect failed, its figure is left out: %v\n", err)
		} else {
			r.ConnsRuns, r.TeardownRuns = append(r.ConnsRuns, res.Conns), append(r.TeardownRuns, res.TeardownMs)
		}
		if res, err := runOurs(ctx, self, "connect", host, nextPort(), 0, connectIters, "event", "-depth", strconv.Itoa(cmtimeDepth)); err != nil {
			fmt.Fprintf(os.Stderr, "rdmaperf: connect at depth %d failed, its figure is left out: %v\n", cmtimeDepth, err)
		} else {
			r.ShallowConnsRuns, r.ShallowTeardownRuns = append(r.ShallowConnsRuns, res.Conns), append(r.ShallowTeardownRuns, res.TeardownMs)
		}
	}
	r.Conns, r.CmtimeConns, r.ShallowConns = median(r.ConnsRuns), median(r.CmtimeConnsRuns), median(r.ShallowConnsRuns)
	r.TeardownMs, r.CmtimeTeardownMs, r.ShallowTeardownMs = median(r.TeardownRuns), median(r.CmtimeTeardownRuns), median(r.ShallowTeardownRuns)
	fmt.Printf("connect %d: %6.0f conn/s  cmtime %6.0f conn/s  ratio %.2f  teardown %6.0f ms  cmtime %6.0f ms  runs %s / %s, %s / %s; depth %d: %6.0f conn/s (%s), teardown %6.0f ms (%s)\n",
		connectIters, r.Conns, r.CmtimeConns, ratioOf(r.Conns, r.CmtimeConns), r.TeardownMs, r.CmtimeTeardownMs,
		spread(r.ConnsRuns), spread(r.CmtimeConnsRuns), spread(r.TeardownRuns), spread(r.CmtimeTeardownRuns),
		cmtimeDepth, r.ShallowConns, spread(r.ShallowConnsRuns), r.ShallowTeardownMs, spread(r.ShallowTeardownRuns))
	return r
}

// ratioOf is a / b, or 0 when b is missing.
func ratioOf(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// connectTable is the connection rows as a Markdown section.
func connectTable(r connectRow) string {
	if len(r.ConnsRuns) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nConnection set-up and teardown: %d `cm.Dial`s at once to one listener, each accepted, then all "+
		"closed at once, against librdmacm's `cmtime -c %d` in the same boot (its set-up is the sum of its create id, "+
		"resolve addr, resolve route, create qp and connect steps; its teardown, disconnect and destroy). Ours runs "+
		"with the default queues (128 deep), and again with cmtime's.\n\n", connectIters, connectIters)
	b.WriteString("| what | cmtime | ours | ratio | cmtime runs | ours runs |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	fmt.Fprintf(&b, "| set-up, connections/s (higher is better) | %.0f | %.0f | %.2f | %s | %s |\n",
		r.CmtimeConns, r.Conns, ratioOf(r.Conns, r.CmtimeConns), spreadInt(r.CmtimeConnsRuns), spreadInt(r.ConnsRuns))
	if len(r.ShallowConnsRuns) > 0 {
		fmt.Fprintf(&b, "| set-up with cmtime's queues (%d deep), connections/s | %.0f | %.0f | %.2f | %s | %s |\n",
			cmtimeDepth, r.CmtimeConns, r.ShallowConns, ratioOf(r.ShallowConns, r.CmtimeConns), spreadInt(r.CmtimeConnsRuns), spreadInt(r.ShallowConnsRuns))
	}
	fmt.Fprintf(&b, "| teardown, ms (lower is better) | %.0f | %.0f | %.2f | %s | %s |\n",
		r.CmtimeTeardownMs, r.TeardownMs, ratioOf(r.TeardownMs, r.CmtimeTeardownMs), spreadInt(r.CmtimeTeardownRuns), spreadInt(r.TeardownRuns))
	if len(r.ShallowTeardownRuns) > 0 {
		fmt.Fprintf(&b, "| teardown with cmtime's queues (%d deep), ms | %.0f | %.0f | %.2f | %s | %s |\n",
			cmtimeDepth, r.CmtimeTeardownMs, r.ShallowTeardownMs, ratioOf(r.ShallowTeardownMs, r.CmtimeTeardownMs), spreadInt(r.CmtimeTeardownRuns), spreadInt(r.ShallowTeardownRuns))
	}
	return b.String()
}
