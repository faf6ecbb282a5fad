package cm

import (
	"time"

	"github.com/go-rdma/rdmacm/internal/verbs"
	"github.com/rs/zerolog"
)

// rnrSteps are the RNR NAK timer's values in the InfiniBand encoding: code
// i is rnrSteps[i-1] for 1-31; code 0 is the longest, 655.36 ms.
var rnrSteps = [31]time.Duration{
	10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
	3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
	163840, 245760, 327680, 491520,
}

// maxRNRTimer is code 0's timer, the longest.
const maxRNRTimer = 655360 * time.Microsecond

// ackStep is the ack timeout's unit: exponent n means ackStep << n.
const ackStep = 4096 * time.Nanosecond

// maxAckTimeout is exponent 31's timeout, the longest.
const maxAckTimeout = ackStep << 31

// ackExponent is the smallest exponent (1-31) whose timeout is at least d.
func ackExponent(d time.Duration) uint8 {
	n := uint8(1)
	for n < 31 && ackStep<<n < d {
		n++
	}
	return n
}

// rnrCode is the shortest RNR timer code of at least d.
func rnrCode(d time.Duration) uint8 {
	for i, us := range rnrSteps {
		if d <= us*time.Microsecond {
			return uint8(i + 1)
		}
	}
	return 0
}

// setRNRTimer applies WithRNRTimer to a connected QP. A device that
// refuses only makes receiver-not-ready recovery slow: warn, go on.
func setRNRTimer(id *verbs.CMID, d time.Duration, log zerolog.Logger) {
	if err := id.SetMinRNRTimer(rnrCode(d)); err != nil {
		log.Warn().Err(err).Dur("rnr_timer", d).Msg("setting the RNR timer; receiver-not-ready retries wait the device's default")
	}
}
