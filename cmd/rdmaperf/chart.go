package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// writeChart draws bandwidth against size (log scale): ours solid,
// perftest thin, one colour per operation.
func writeChart(path string, rows []row) error {
	const w, h, left, right, top, bottom = 900, 520, 70, 170, 40, 60
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	black := color.RGBA{0, 0, 0, 255}
	grey := color.RGBA{200, 200, 200, 255}
	text := func(x, y int, s string, c color.Color) {
		d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	maxBW := 1.0
	for _, r := range rows {
		if !r.Lat {
			maxBW = math.Max(maxBW, math.Max(r.Ours, r.Perftest))
		}
	}
	maxBW = math.Ceil(maxBW/10) * 10
	minL, maxL := math.Log2(float64(compareSizes[0])), math.Log2(float64(compareSizes[len(compareSizes)-1]))
	px := func(size int) int {
		return left + int((math.Log2(float64(size))-minL)/(maxL-minL)*float64(w-left-right))
	}
	py := func(bw float64) int { return h - bottom - int(bw/maxBW*float64(h-top-bottom)) }
	for i := 0; i <= 5; i++ { // y grid
		v := maxBW * float64(i) / 5
		line(img, left, py(v), w-right, py(v), grey, 1)
		text(8, py(v)+4, fmt.Sprintf("%.0f", v), black)
	}
	for _, s := range compareSizes { // x ticks
		line(img, px(s), top, px(s), h-bottom, grey, 1)
		label := fmt.Sprintf("%d", s)
		if s >= 1024 {
			label = fmt.Sprintf("%dK", s/1024)
		}
		text(px(s)-10, h-bottom+18, label, black)
	}
	text(left, 24, "Bandwidth (MiB/s) against message size, rxe0 under TCG: ours thick (busy polling), perftest thin", black)
	text(w/2-60, h-18, "message size (bytes)", black)
	colors := map[string]color.RGBA{"send_bw": {31, 119, 180, 255}, "write_bw": {214, 39, 40, 255}, "read_bw": {44, 160, 44, 255}, "write_imm_bw": {148, 103, 189, 255}}
	y := top + 10
	for _, test := range []string{"send_bw", "write_bw", "read_bw", "write_imm_bw"} {
		c := colors[test]
		var prevOurs, prevPt image.Point
		for i, r := range chartSeries(rows, test) {
			o := image.Pt(px(r.Size), py(r.Ours))
			p := image.Pt(px(r.Size), py(r.Perftest))
			if i > 0 {
				line(img, prevOurs.X, prevOurs.Y, o.X, o.Y, c, 3)
				if r.Perftest > 0 {
					line(img, prevPt.X, prevPt.Y, p.X, p.Y, c, 1)
				}
			}
			prevOurs, prevPt = o, p
		}
		line(img, w-right+15, y, w-right+40, y, c, 3)
		text(w-right+45, y+4, test, black)
		y += 20
	}
	line(img, left, h-bottom, w-right, h-bottom, black, 1)
	line(img, left, top, left, h-bottom, black, 1)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
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

// chartPoll is the polling mode charted for ours: perftest busy-polls.
const chartPoll = "busy"

// chartSeries is test's rows in size order, ours with chartPoll only: a
// line through every polling mode's figure would jump up and down at each
// size.
func chartSeries(rows []row, test string) []row {
	var out []row
	for _, s := range compareSizes {
		for _, r := range rows {
			if r.Test == test && r.Size == s && r.Poll == chartPoll {
				out = append(out, r)
			}
		}
	}
	return out
}
