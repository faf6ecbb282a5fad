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

// writeChart draws each row's speed relative to its anchor (perftest, or
// rstream for the stream tests) as a horizontal bar on a log scale around
// the 1.0 line: bandwidth ours/anchor, latency anchor/ours, so that right
// of the line is faster than the C tool and left slower.
func writeChart(path string, rows []row) error {
	rows = chartRows(rows)
	const rowH, w, labelW, right, top, bottom = 14, 900, 210, 30, 50, 40
	h := top + bottom + rowH*max(len(rows), 1)
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	black := color.RGBA{0, 0, 0, 255}
	grey := color.RGBA{200, 200, 200, 255}
	text := func(x, y int, s string, c color.Color) {
		d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	const lo, hi = -5.0, 3.0 // log2 of the scale's ends: 1/32x to 8x
	px := func(v float64) int {
		l := math.Min(math.Max(math.Log2(v), lo), hi)
		return labelW + int((l-lo)/(hi-lo)*float64(w-labelW-right))
	}
	for e := lo; e <= hi; e++ { // x grid, one line per doubling
		v := math.Exp2(e)
		c, thick := grey, 1
		if e == 0 {
			c, thick = black, 2
		}
		line(img, px(v), top-6, px(v), h-bottom, c, thick)
		label := fmt.Sprintf("%gx", v)
		if v < 1 {
			label = fmt.Sprintf("1/%gx", 1/v)
		}
		text(px(v)-12, h-bottom+16, label, black)
	}
	text(8, 20, "Speed relative to the C tool in the same boot, rxe0 under TCG (bandwidth ours/theirs, latency theirs/ours):", black)
	text(8, 36, "right of the 1x line is faster than perftest or rstream, left is slower; log scale.", black)
	slower, faster := color.RGBA{214, 39, 40, 255}, color.RGBA{44, 160, 44, 255}
	for i, r := range rows {
		y := top + i*rowH + rowH/2
		text(8, y+4, fmt.Sprintf("%s %s %s", r.Test, sizeLabel(r.Size), r.Poll), black)
		v := speed(r)
		c := faster
		if v < 1 {
			c = slower
		}
		x0, x1 := px(1), px(v)
		for x := min(x0, x1); x <= max(x0, x1); x++ {
			line(img, x, y-4, x, y+4, c, 1)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

// chartRows are the rows that have both figures, in the table's order.
func chartRows(rows []row) []row {
	var out []row
	for _, r := range rows {
		if r.Perftest > 0 && r.Ours > 0 {
			out = append(out, r)
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
