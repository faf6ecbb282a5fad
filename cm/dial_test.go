package cm

import (
	"context"
	"testing"
	"time"
)

// TestTryContextSharesTheDeadline: each of a name's addresses gets an
// equal share of what is left of the dial's deadline, but at least minTry
// (or all that is left); the last, and a dial without a deadline, get the
// dial's own context.
func TestTryContextSharesTheDeadline(t *testing.T) {
	for _, c := range []struct {
		remaining time.Duration
		left      int
		want      time.Duration // 0: the dial's own context
	}{
		{9 * time.Second, 3, 3 * time.Second},
		{3 * time.Second, 3, minTry},
		{time.Second, 2, time.Second},
		{9 * time.Second, 1, 0},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), c.remaining)
		tryCtx, tryCancel := tryContext(ctx, c.left)
		got, _ := tryCtx.Deadline()
		if c.want == 0 {
			if tryCtx != ctx {
				t.Errorf("%v left, %d to try: a context of its own", c.remaining, c.left)
			}
		} else if share := time.Until(got); share > c.want || share < c.want-100*time.Millisecond {
			t.Errorf("%v left, %d to try: %v, want %v", c.remaining, c.left, share, c.want)
		}
		tryCancel()
		cancel()
	}
	tryCtx, cancel := tryContext(context.Background(), 3)
	defer cancel()
	if _, ok := tryCtx.Deadline(); ok {
		t.Error("a dial without a deadline gave its tries one")
	}
}
