package msg

import (
	"encoding/binary"
	"fmt"
)

// hello travels as connect and accept private data: each side's receive
// depth (its initial credits for the peer), buffer size (the largest
// message it can receive without rendezvous), flags and the largest
// message it receives at all (zero: not said, as from a peer that predates
// it, whose private data the CM pads with zeros: maxRendezvous).
//
//	0 "GRDM" magic, 4 version u8, 5 flags u8 + 2 zero bytes, 8 recv depth u32, 12 buffer size u32,
//	16 max message u32
type hello struct {
	recvDepth  int
	bufSize    int
	maxMessage int
	// streamReader: this side reads the connection as a byte stream
	// (rdmanet's Conn), so its application releases each message it
	// receives before it waits for the next; the peer's stream may then
	// hold bytes for credits to come (Conn.holdAt).
	streamReader bool
}

// helloStreamReader is hello.streamReader's bit in the flags byte.
const helloStreamReader = 1

const helloSize = 20

// helloMinSize is the hello of a peer that does not say its largest
// message.
const helloMinSize = 16

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
	return b
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
	if len(b) >= helloSize {
		if m := int(binary.LittleEndian.Uint32(b[16:])); m != 0 {
			h.maxMessage = min(m, maxRendezvous)
		}
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
func ConnectData(recvDepth, bufSize int) ([]byte, error) {
	if err := checkHello(recvDepth, bufSize); err != nil {
		return nil, err
	}
	return hello{recvDepth: recvDepth, bufSize: bufSize, maxMessage: maxRendezvous}.encode(), nil
}
