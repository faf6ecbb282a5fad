package msg

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// hello travels as connect and accept private data: each side's receive
// depth (its initial credits for the peer), buffer size (the largest
// message it can receive without rendezvous), flags, the largest message
// it receives at all and the silence it tolerates before it ends the
// connection (its keepalive timeout, in milliseconds). The last two were
// added later: zero is not said, as from a peer that predates them, whose
// private data the CM pads with zeros (the largest message is then
// maxRendezvous; the silence, no bound).
//
//	0 "GRDM" magic, 4 version u8, 5 flags u8 + 2 zero bytes, 8 recv depth u32, 12 buffer size u32,
//	16 max message u32, 20 silence timeout ms u32
type hello struct {
	recvDepth  int
	bufSize    int
	maxMessage int
	// silence is how long this side lets the peer be silent (0: for
	// ever): the peer sends keepalives at least every half of it.
	silence time.Duration
	// streamReader: this side reads the connection as a byte stream
	// (rdmanet's Conn), so its application releases each message it
	// receives before it waits for the next; the peer's stream may then
	// hold bytes for credits to come (Conn.holdAt).
	streamReader bool
}

// helloStreamReader is hello.streamReader's bit in the flags byte.
const helloStreamReader = 1

const helloSize = 24

// helloMinSize is the hello of a peer that does not say its largest
// message.
const helloMinSize = 16

// helloMaxMessageEnd is the end of the largest message's field, the
// hello's end before the silence's was added.
const helloMaxMessageEnd = 20

var helloMagic = [4]byte{'G', 'R', 'D', 'M'}

func (h hello) encode() []byte {
	b := make([]byte, helloSize)
	copy(b, helloMagic[:])
	b[4] = Version
	if h.streamReader {
		b[5] |= helloStreamReader
	}
	binary.LittleEndian.PutUint32(b[8:], uint32(h.recvDepth))
	binary.LittleEndian.PutUint32(b[12:], uint32(h.bufSize))
	binary.LittleEndian.PutUint32(b[16:], uint32(h.maxMessage))
	binary.LittleEndian.PutUint32(b[20:], silenceMillis(h.silence))
	return b
}

// silenceMillis is d in whole milliseconds as the hello carries it:
// rounded up, so that a bound is never said tighter than it is, nor
// below a millisecond (0 says none), and at most the field's largest.
func silenceMillis(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	ms := d / time.Millisecond
	if d%time.Millisecond != 0 {
		ms++
	}
	return uint32(min(ms, math.MaxUint32))
}

// parseHello reads a peer's hello; the CM pads private data with zeros, so
// b may be longer than helloSize.
func parseHello(b []byte) (hello, error) {
	if len(b) < helloMinSize || [4]byte(b[:4]) != helloMagic {
		return hello{}, fmt.Errorf("%w: the peer is not a msg peer (no hello in its private data)", ErrMalformed)
	}
	if b[4] != Version {
		return hello{}, fmt.Errorf("%w: the peer speaks version %d, this side %d", ErrMalformed, b[4], Version)
	}
	h := hello{recvDepth: int(binary.LittleEndian.Uint32(b[8:])), bufSize: int(binary.LittleEndian.Uint32(b[12:])),
		streamReader: b[5]&helloStreamReader != 0, maxMessage: maxRendezvous}
	if len(b) >= helloMaxMessageEnd {
		if m := int(binary.LittleEndian.Uint32(b[16:])); m != 0 {
			h.maxMessage = min(m, maxRendezvous)
		}
	}
	if len(b) >= helloSize {
		h.silence = time.Duration(binary.LittleEndian.Uint32(b[20:])) * time.Millisecond
	}
	if h.recvDepth < minRecvDepth || h.bufSize < HeaderSize+rendezvousInfoSize {
		return hello{}, fmt.Errorf("%w: peer receive depth %d, buffer size %d", ErrMalformed, h.recvDepth, h.bufSize)
	}
	return h, nil
}

// ConnectData is the private data a msg peer sends when it connects or
// accepts, announcing recvDepth receives of bufSize bytes: for peers
// written without this package. Values a msg peer would refuse, or that
// the hello cannot carry, are refused with an error matching
// endpoint.ErrInvalid, as WithRecvDepth and WithBufferSize refuse them.
// The hello it makes bounds neither the messages it takes nor the peer's
// silence, so the msg peer keeps its own keepalive interval; it still
// ends the connection when this side, able to send, sends nothing for the
// msg peer's keepalive timeout (WithKeepalive: 10 s by default).
func ConnectData(recvDepth, bufSize int) ([]byte, error) {
	if err := checkHello(recvDepth, bufSize); err != nil {
		return nil, err
	}
	return hello{recvDepth: recvDepth, bufSize: bufSize, maxMessage: maxRendezvous}.encode(), nil
}
