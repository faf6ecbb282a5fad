package cm

import (
	"testing"
	"time"
)

func TestRNRCodeRoundsUp(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint8
	}{
		{0, 1}, {time.Microsecond, 1}, {10 * time.Microsecond, 1}, {11 * time.Microsecond, 2},
		{640 * time.Microsecond, 12}, {641 * time.Microsecond, 13},
		{491520 * time.Microsecond, 31}, {500 * time.Millisecond, 0}, {time.Hour, 0},
	} {
		if got := rnrCode(c.d); got != c.want {
			t.Errorf("rnrCode(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
