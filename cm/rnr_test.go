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

func TestAckExponentRoundsUp(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint8
	}{
		{time.Nanosecond, 1}, {8192 * time.Nanosecond, 1}, {8193 * time.Nanosecond, 2},
		{500 * time.Millisecond, 17}, {67 * time.Millisecond, 14}, {maxAckTimeout, 31},
	} {
		if got := ackExponent(c.d); got != c.want {
			t.Errorf("ackExponent(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
