package main

import (
	"fmt"
	"strings"
)

// goal is a target the project's issues set for one of the chart's bars:
// the speed against the anchor (as the bar measures it) that meets it.
// A goal said as a time (latency, teardown: ours at most so many times
// the anchor's) is met at the inverse speed.
type goal struct {
	bar    string  // the bar's label (chartBars)
	speed  float64 // the least speed that meets the goal
	asTime bool    // said as ours/anchor, at most 1/speed
	issue  int     // the issue that set it
}

// goals are the speed issue's targets (15: the default event mode near
// perftest's own, busy polling near perftest's, RPC against the device's
// message rate, rendezvous against RDMA READ, connection set-up and
// teardown against cmtime) and the net.Conn issue's (16: rdmanet against
// rstream in both modes, since the issue names none: the default event
// mode against rstream's blocking calls, busy polling against its
// spinning ones).
var goals = []goal{
	{"send_lat 64 event", 1 / 1.5, true, 15},
	{"send_lat 64 busy", 1 / 1.25, true, 15},
	{"rpc 64 x64 callers event", 0.4, false, 15},
	{"rendezvous 8M event", 0.8, false, 15},
	{"connect set-up 500", 0.8, false, 15},
	{"connect teardown 500", 1, true, 15},
	{"stream_bw 64K event", 1, false, 16},
	{"stream_bw 64K busy", 1, false, 16},
	{"stream_lat 64 event", 1 / 1.25, true, 16},
	{"stream_lat 64 busy", 1 / 1.25, true, 16},
}

// goalOf is the goal set for the bar labelled label, if any.
func goalOf(label string) (goal, bool) {
	for _, g := range goals {
		if g.bar == label {
			return g, true
		}
	}
	return goal{}, false
}

// ratio says speed in the goal's own terms: ours/anchor for a time,
// speed itself for a rate.
func (g goal) ratio(speed float64) string {
	if g.asTime {
		return fmt.Sprintf("%.2fx", 1/speed)
	}
	return fmt.Sprintf("%.3g", speed)
}

// wanted says the goal as its issue does.
func (g goal) wanted() string {
	if g.asTime {
		return "at most " + g.ratio(g.speed)
	}
	return "at least " + g.ratio(g.speed)
}

// goalsTable is the bars that have a goal as a Markdown section: what
// the issue wants, what this run gave, and whether that meets it.
func goalsTable(bars []bar) string {
	var b strings.Builder
	for _, br := range bars {
		g, ok := goalOf(br.label)
		if !ok || br.speed <= 0 {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\nTargets: the speed issue's (15) and the net.Conn issue's (16), against this run's medians " +
				"(latency and teardown as ours / the anchor, lower is better; rates as ours / the anchor, higher is better; the chart marks each with a blue tick). " +
				"The notes below (\"Where the issues' targets stand\") say where a missed one's time goes and what would close it.\n\n" +
				"| row | issue | wanted | this run | met |\n| --- | ---: | --- | ---: | --- |\n")
		}
		met := "no"
		if br.speed >= g.speed {
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", br.label, g.issue, g.wanted(), g.ratio(br.speed), met)
	}
	return b.String()
}
