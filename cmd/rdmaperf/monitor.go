package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The monitor comparison measures what Go's runtime adds to event mode.
// When every P of a process is idle (all goroutines wait, as they do
// between messages in event mode), the runtime's system monitor (sysmon)
// parks itself, and the next system call or cgo call wakes it: a futex
// wake and a thread to schedule for every message that finds the process
// idle. GODEBUG=schedtrace=N (N ms between scheduler trace lines) keeps
// sysmon from parking; with the largest N it prints nothing in practice.
// The comparison runs the event-mode rows that wait the most, and the
// stream's bandwidth (its writer and reader each wait for the other's
// credits and messages), in the default runtime and with sysmon kept
// awake, beside their anchors, in one boot.

// monitorAwake is the environment that keeps sysmon from parking:
// schedtrace's largest interval, about 24.8 days between trace lines.
const monitorAwake = "GODEBUG=schedtrace=2147483647"

// monitorCase is one event-mode measurement and its anchor.
type monitorCase struct {
	name    string // the row's label
	test    string
	size    int
	callers int // rpc
}

var monitorCases = []monitorCase{
	{name: "send_lat 64 B, µs", test: "send_lat", size: 64},
	{name: "stream_lat 64 B, µs", test: "stream_lat", size: 64},
	{name: "rpc 64 B, 1 caller, calls/s", test: "rpc", size: 64, callers: 1},
	{name: "rpc 64 B, 64 callers, calls/s", test: "rpc", size: 64, callers: 64},
	{name: "stream_bw 64 KiB, MiB/s", test: "stream_bw", size: 65536},
}

// chartLabel names the case's bar the way the chart names the others.
func (c monitorCase) chartLabel() string {
	if c.test == "rpc" {
		return fmt.Sprintf("rpc %d x%d callers event, sysmon awake", c.size, c.callers)
	}
	return fmt.Sprintf("%s %s event, sysmon awake", c.test, sizeLabel(c.size))
}

// higherIsBetter says whether the case's figure is a rate (calls/s,
// MiB/s) rather than a time.
func (c monitorCase) higherIsBetter() bool { return c.test == "rpc" || c.test == "stream_bw" }

// monitorRow is one case: the anchor's figure and ours in the default
// runtime (Default) and with sysmon awake (Awake), each a median.
type monitorRow struct {
	Case                               monitorCase
	Anchor, Default, Awake             float64
	AnchorRuns, DefaultRuns, AwakeRuns []float64
}

// ratio is a figure against the anchor the way the other tables put it:
// latency ours/anchor (lower is better), rates ours/anchor (higher is
// better; RPC against ib_send_bw's message rate, the stream's bandwidth
// against rstream's).
func (r monitorRow) ratio(v float64) float64 { return ratioOf(v, r.Anchor) }

// speed is how many times faster v is than the anchor, as the chart's
// other bars are.
func (r monitorRow) speed(v float64) float64 {
	if r.Case.higherIsBetter() {
		return ratioOf(v, r.Anchor)
	}
	return ratioOf(r.Anchor, v)
}

// compareMonitor runs each case's anchor and ours both ways in turn,
// repeat times.
func compareMonitor(ctx context.Context, self, device, host string, nextPort func() int, repeat int) ([]monitorRow, error) {
	var rows []monitorRow
	for _, c := range monitorCases {
		r := monitorRow{Case: c}
		iters := defaultIters(c.test, c.size)
		for range repeat {
			a, err := monitorAnchor(ctx, c, device, host, nextPort(), iters)
			if err != nil {
				fmt.Fprintf(os.Stderr, "rdmaperf: the C tool for %s failed, its figure is left out: %v\n", c.name, err)
			} else {
				r.AnchorRuns = append(r.AnchorRuns, a)
			}
			for _, awake := range []bool{false, true} {
				var env []string
				if awake {
					env = []string{monitorAwake}
				}
				var flags []string
				if c.test == "rpc" {
					flags = []string{"-callers", strconv.Itoa(c.callers)}
				}
				res, err := runOursEnv(ctx, env, self, c.test, host, nextPort(), c.size, iters, "event", flags...)
				if err != nil {
					return nil, fmt.Errorf("%s (sysmon awake %v): %w", c.name, awake, err)
				}
				v := figureOf(c.test, res)
				if awake {
					r.AwakeRuns = append(r.AwakeRuns, v)
				} else {
					r.DefaultRuns = append(r.DefaultRuns, v)
				}
			}
		}
		r.Anchor, r.Default, r.Awake = median(r.AnchorRuns), median(r.DefaultRuns), median(r.AwakeRuns)
		fmt.Printf("monitor %-30s anchor %9.2f  default %9.2f (%.2f)  awake %9.2f (%.2f)  runs %s / %s / %s\n",
			c.name, r.Anchor, r.Default, r.ratio(r.Default), r.Awake, r.ratio(r.Awake),
			spread(r.AnchorRuns), spread(r.DefaultRuns), spread(r.AwakeRuns))
		rows = append(rows, r)
	}
	return rows, nil
}

// monitorAnchor is a case's C tool, as the main tables run it:
// ib_send_lat -e, rstream -T b, ib_send_bw's message rate.
func monitorAnchor(ctx context.Context, c monitorCase, device, host string, port, iters int) (float64, error) {
	if c.test == "rpc" {
		return sendBWMsgRate(ctx, device, host, port)
	}
	return anchor(ctx, c.test, "event", device, host, port, c.size, iters, !c.higherIsBetter())
}

// monitorTable is the monitor rows as a Markdown section.
func monitorTable(rows []monitorRow) string {
	var b strings.Builder
	b.WriteString("\nEvent mode and Go's system monitor: the event-mode rows that wait the most, in the default runtime " +
		"and with `" + monitorAwake + "`, which keeps the runtime's monitor thread from parking while the process is idle " +
		"(docs/DESIGN.md, \"Event mode and the Go runtime\"), against the same anchors as above (`ib_send_lat -R -e`, " +
		"rstream `-T b`, `ib_send_bw -R -s 64`'s message rate) in the same boot. Ratios as above: latency ours/anchor, " +
		"rates (calls/s, MiB/s) ours/anchor.\n\n" +
		"| test | anchor | default | ratio | sysmon awake | ratio | anchor runs | default runs | awake runs |\n" +
		"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		anchor, ratioDefault, ratioAwake := fmt.Sprintf("%.1f", r.Anchor), fmt.Sprintf("%.3f", r.ratio(r.Default)), fmt.Sprintf("%.3f", r.ratio(r.Awake))
		if r.Anchor == 0 {
			anchor, ratioDefault, ratioAwake = "n/a", "n/a", "n/a"
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %.1f | %s | %s | %s | %s |\n", r.Case.name, anchor,
			r.Default, ratioDefault, r.Awake, ratioAwake, spread(r.AnchorRuns), spread(r.DefaultRuns), spread(r.AwakeRuns))
	}
	return b.String()
}
