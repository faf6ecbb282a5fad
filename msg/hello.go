package msg

import (
	"encoding/binary"
	"fmt"
)

// hello travels as connect and accept private data: each side's receive
// depth (its initial credits for the peer), buffer size (the largest
// message it can receive without rendezvous) and flags.
//
//	0 "GRDM" magic, 4 version u8, 5 flags u8 + 2 zero bytes, 8 recv depth u32, 12 buffer size u32
type hello struct {
	recvDepth int
	bufSize   int
	// streamReader: this side reads the connection as a byte stream
	// (rdmanet's Conn), so its application releases each message it
	// receives before it waits for the next; the peer's stream may then
	// hold bytes for credits to come (Conn.holdAt).
	streamReader bool
}

// helloStreamReader is hello.streamReader's bit in the flags byte.
const helloStreamReader = 1

const helloSize = 16

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
	return b
}

// parseHello reads a peer's hello; the CM pads private data with zeros, so
// b may be longer than helloSize.
func parseHello(b []byte) (hello, error) {
	if len(b) < helloSize || [4]byte(b[:4]) != helloMagic {
		return hello{}, fmt.Errorf("%w: the peer is not a msg peer (no hello in its private data)", ErrMalformed)
	}
	if b[4] != Version {
		return hello{}, fmt.Errorf("%w: the peer speaks version %d, this side %d", ErrMalformed, b[4], Version)
	}
	h := hello{recvDepth: int(binary.LittleEndian.Uint32(b[8:])), bufSize: int(binary.LittleEndian.Uint32(b[12:])),
		streamReader: b[5]&helloStreamReader != 0}
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
	return hello{recvDepth: recvDepth, bufSize: bufSize}.encode(), nil
}
