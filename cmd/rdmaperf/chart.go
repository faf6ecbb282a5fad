package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"unicode/utf8"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// writeChart draws each bar's speed relative to its anchor as a
// horizontal bar on a log scale around the 1.0 line, so that right of the
// line is faster than the C tool and left slower, and a blue tick across
// each bar an issue set a target for, at that target (goals).
func writeChart(path string, bars []bar) error {
	labelW := labelWidth(bars)
	w := labelW + plotW + rightMargin
	h := chartTop + chartBottom + chartRowH*max(len(bars), 1)
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	black := color.RGBA{0, 0, 0, 255}
	grey := color.RGBA{200, 200, 200, 255}
	text := func(x, y int, s string, c color.Color) {
		d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	px := func(v float64) int { return plotX(labelW, v) }
	for e := scaleLo; e <= scaleHi; e++ { // x grid, one line per doubling
		v := math.Exp2(e)
		c, thick := grey, 1
		if e == 0 {
			c, thick = black, 2
		}
		line(img, px(v), chartTop-6, px(v), h-chartBottom, c, thick)
		label := fmt.Sprintf("%gx", v)
		if v < 1 {
			label = fmt.Sprintf("1/%gx", 1/v)
		}
		text(px(v)-12, h-chartBottom+16, label, black)
	}
	text(8, 20, "Speed relative to the anchor in the same boot, rxe0 under TCG (bandwidth ours/theirs, latency theirs/ours):", black)
	text(8, 36, "right of 1x is faster than perftest, rstream, cmtime (grpc: TCP), left slower (rpc: calls/s vs ib_send_bw msg/s); log scale.", black)
	text(8, 52, "A blue tick is the target an issue set for that row: a bar that reaches it meets it.", goalColor)
	slower, faster := color.RGBA{214, 39, 40, 255}, color.RGBA{44, 160, 44, 255}
	for i, b := range bars {
		y := rowY(i)
		text(labelX, y+4, b.label, black)
		v := b.speed
		c := faster
		if v < 1 {
			c = slower
		}
		x0, x1 := px(1), px(v)
		for x := min(x0, x1); x <= max(x0, x1); x++ {
			line(img, x, y-4, x, y+4, c, 1)
		}
		if g, ok := goalOf(b.label); ok {
			// Wider than the 1x line, so that a target at 1x shows on it.
			line(img, px(g.speed), y-6, px(g.speed), y+6, goalColor, goalThick)
		}
		// A bar cut off at the scale's end says its value beside the
		// 1x line, on the side it does not cover.
		switch l := math.Log2(v); {
		case l < scaleLo:
			text(x0+4, y+4, fmt.Sprintf("%.3gx, off the scale", v), black)
		case l > scaleHi:
			text(x0-150, y+4, fmt.Sprintf("%.3gx, off the scale", v), black)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

// The chart's rows are chartRowH pixels high, below chartTop pixels of
// heading and above chartBottom pixels of scale; its scale runs from
// 2^scaleLo to 2^scaleHi times the anchor's speed (1/32x to 8x).
const (
	chartRowH, chartTop, chartBottom = 14, 66, 40
	scaleLo, scaleHi                 = -5.0, 3.0
)

// rowY is the middle of the chart's i-th row.
func rowY(i int) int { return chartTop + i*chartRowH + chartRowH/2 }

// plotX is where speed v falls on the scale of a plot that starts at
// labelW; speeds off the scale sit at its ends.
func plotX(labelW int, v float64) int {
	l := math.Min(math.Max(math.Log2(v), scaleLo), scaleHi)
	return labelW + int((l-scaleLo)/(scaleHi-scaleLo)*float64(plotW))
}

// goalColor marks the issues' targets, with ticks goalThick wide (line's
// thickness: 5 pixels, where the 1x line's 2 gives 3).
var goalColor = color.RGBA{31, 119, 180, 255}

const goalThick = 4

// The chart's text is basicfont's 7x13 face: labelX is where a label
// starts, charW how far each character advances. The plot is plotW pixels
// wide whatever the labels, starts right of the longest one, and leaves
// rightMargin for the scale's last label.
const (
	labelX, charW = 8, 7
	plotW         = 660
	minLabelW     = 210
	rightMargin   = 30
)

// labelWidth is where the plot starts: past the longest label and a gap,
// so that no label runs into the bars.
func labelWidth(bars []bar) int {
	longest := 0
	for _, b := range bars {
		longest = max(longest, utf8.RuneCountInString(b.label))
	}
	return max(minLabelW, labelX+charW*longest+2*charW)
}

// bar is one line of the chart: what was measured, and how many times
// faster than its anchor it ran.
type bar struct {
	label string
	speed float64
}

// chartBars are a bar for each row of the table that has both figures, in
// the table's order (bandwidth ours/anchor, latency anchor/ours), then one
// for each RPC row (calls/s against the device's message rate, the
// table's ratio), the connection set-up rate and teardown time against
// cmtime's, event mode with sysmon awake against its anchor, and gRPC's
// calls/s over rdmanet against over TCP.
func chartBars(rows []row, rpc []rpcRow, conn connectRow, monitor []monitorRow, grpc []grpcRow) []bar {
	var out []bar
	for _, r := range rows {
		if r.Perftest > 0 && r.Ours > 0 {
			out = append(out, bar{fmt.Sprintf("%s %s %s", r.Test, sizeLabel(r.Size), r.Poll), speed(r)})
		}
	}
	for _, r := range rpc {
		if r.Rate > 0 && r.Calls > 0 {
			out = append(out, bar{fmt.Sprintf("rpc 64 x%d callers event", r.Callers), r.ratio()})
		}
	}
	if conn.Conns > 0 && conn.CmtimeConns > 0 {
		out = append(out, bar{fmt.Sprintf("connect set-up %d", connectIters), conn.Conns / conn.CmtimeConns})
	}
	if conn.TeardownMs > 0 && conn.CmtimeTeardownMs > 0 {
		out = append(out, bar{fmt.Sprintf("connect teardown %d", connectIters), conn.CmtimeTeardownMs / conn.TeardownMs})
	}
	for _, r := range monitor {
		if r.Anchor > 0 && r.Awake > 0 {
			out = append(out, bar{r.Case.chartLabel(), r.speed(r.Awake)})
		}
	}
	for _, r := range grpc {
		if r.Rdmanet > 0 && r.TCP > 0 {
			out = append(out, bar{fmt.Sprintf("grpc 64 x%d callers, rdmanet vs TCP", r.Callers), r.ratio()})
		}
	}
	return out
}

// speed is how many times faster ours is than the anchor.
func speed(r row) float64 {
	if r.Lat {
		return r.Perftest / r.Ours
	}
	return r.Ours / r.Perftest
}

func sizeLabel(size int) string {
	switch {
	case size >= 1<<20:
		return fmt.Sprintf("%dM", size>>20)
	case size >= 1<<10:
		return fmt.Sprintf("%dK", size>>10)
	}
	return fmt.Sprint(size)
}

// line draws a straight line of the given thickness.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color, thick int) {
	steps := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= steps; i++ {
		x := x0 + (x1-x0)*i/steps
		y := y0 + (y1-y0)*i/steps
		for dx := -thick / 2; dx <= thick/2; dx++ {
			for dy := -thick / 2; dy <= thick/2; dy++ {
				img.Set(x+dx, y+dy, c)
			}
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
