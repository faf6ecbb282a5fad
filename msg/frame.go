// Package msg is messaging on top of package endpoint: framed messages with
// credit-based flow control (a sender never sends more messages than the
// peer has receives posted for, so the peer never sees RNR), rendezvous for
// messages larger than a buffer (the receiver pulls them with RDMA READ),
// a Conn with Send and Recv, and a request/response Client and Server.
package msg

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the wire format version every header carries.
const Version = 3

// HeaderSize is the size of the fixed header in front of every message.
const HeaderSize = 24

// Type is what a message is.
type Type uint8

// Message types.
const (
	TypeData           Type = iota + 1 // Conn.Send payload
	TypeCredit                         // credits only, no payload
	TypeRequest                        // Client call
	TypeResponse                       // Server reply
	TypeError                          // Server reply: the handler's error code (u16) and text
	TypeRendezvous                     // a large payload is waiting in a region: RendezvousInfo
	TypeRendezvousDone                 // the receiver has read the region; the sender may release it
	TypeClose                          // the sender is closing: its last message (the reader's io.EOF)
	TypeCloseWrite                     // the sender sends no more data but still reads (the reader's io.EOF)
	typeLimit
)

var typeNames = [...]string{"", "data", "credit", "request", "response", "error", "rendezvous", "rendezvous-done", "close", "close-write"}

// isData says a message of type t is one of data, which the receiving
// application holds until it releases it (see Header).
func (t Type) isData() bool {
	switch t {
	case TypeCredit, TypeRendezvousDone, TypeClose:
		return false
	}
	return true
}

func (t Type) String() string {
	if t > 0 && t < typeLimit {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Flags on a message.
const (
	// FlagRendezvous: the message's payload came by rendezvous (set on the
	// TypeRendezvous message; the payload type is in RendezvousInfo).
	FlagRendezvous uint16 = 1 << iota
	// FlagWantsCredit: the sender waits for credits to send data, and the
	// peer's receives it does not hold (Released) have room for it: the
	// credits the peer has to grant would let it go.
	FlagWantsCredit
	flagsKnown = FlagRendezvous | FlagWantsCredit
)

// Header is the fixed header. On the wire, little-endian:
//
//	0  version  u8
//	1  type     u8
//	2  flags    u16
//	4  credits  u32   receives the sender has posted since it last said so
//	8  id       u64   request id (requests, responses, rendezvous)
//	16 length   u32   payload bytes that follow the header
//	20 released u32   messages of data the sender has released in all
//
// Messages of data are those a receiver's application holds until it
// releases them (data, requests, responses, errors, rendezvous offers and
// the end of data), as opposed to the control messages (credit,
// rendezvous-done, close) whose receives are reposted as they arrive. A
// peer with a receive depth of n may have n + released of them sent in
// all, so that a sender knows how many the peer's receives can ever hold
// now (the count wraps at 2^32).
type Header struct {
	Type     Type
	Flags    uint16
	Credits  uint32
	ID       uint64
	Length   uint32
	Released uint32
}

// ErrMalformed is returned for a message that cannot be decoded. It ends
// the connection it arrived on (and only that one).
var ErrMalformed = errors.New("msg: malformed message")

// Encode writes h into b[:HeaderSize]. A b shorter than HeaderSize
// panics, as encoding/binary's Put functions do.
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = Version
	b[1] = byte(h.Type)
	binary.LittleEndian.PutUint16(b[2:], h.Flags)
	binary.LittleEndian.PutUint32(b[4:], h.Credits)
	binary.LittleEndian.PutUint64(b[8:], h.ID)
	binary.LittleEndian.PutUint32(b[16:], h.Length)
	binary.LittleEndian.PutUint32(b[20:], h.Released)
}

// Decode reads a header from a received message of n bytes and checks it:
// the version, the type, the flags, and that the payload it announces is
// exactly what arrived.
func (h *Header) Decode(b []byte) error {
	if len(b) < HeaderSize {
		return fmt.Errorf("%w: %d bytes, a header is %d", ErrMalformed, len(b), HeaderSize)
	}
	if b[0] != Version {
		return fmt.Errorf("%w: version %d, this side speaks %d", ErrMalformed, b[0], Version)
	}
	h.Type = Type(b[1])
	if h.Type == 0 || h.Type >= typeLimit {
		return fmt.Errorf("%w: unknown type %d", ErrMalformed, b[1])
	}
	h.Flags = binary.LittleEndian.Uint16(b[2:])
	if h.Flags&^flagsKnown != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrMalformed, h.Flags)
	}
	h.Credits = binary.LittleEndian.Uint32(b[4:])
	h.ID = binary.LittleEndian.Uint64(b[8:])
	h.Length = binary.LittleEndian.Uint32(b[16:])
	h.Released = binary.LittleEndian.Uint32(b[20:])
	if uint64(h.Length) != uint64(len(b)-HeaderSize) {
		return fmt.Errorf("%w: header announces %d payload bytes, %d arrived", ErrMalformed, h.Length, len(b)-HeaderSize)
	}
	switch h.Type {
	case TypeCredit, TypeRendezvousDone, TypeClose, TypeCloseWrite:
		if h.Length != 0 {
			return fmt.Errorf("%w: a %v message with %d payload bytes", ErrMalformed, h.Type, h.Length)
		}
	case TypeRendezvous:
		if h.Length < rendezvousInfoSize || h.Length > rendezvousInfoSize+maxRendezvousHead {
			return fmt.Errorf("%w: rendezvous info of %d bytes, want %d to %d", ErrMalformed,
				h.Length, rendezvousInfoSize, rendezvousInfoSize+maxRendezvousHead)
		}
	}
	return nil
}

// rendezvousInfo is the payload of a TypeRendezvous message: the region to
// read, the type of the message it carries, and the id the receiver names
// in its TypeRendezvousDone. (The header's ID stays the request id.) The
// message is the head, which follows the info in the offer, then the
// Length bytes read from the region: a sender that lends its caller's
// region (Client.CallRegion) sends a request's method this way, since it
// may not write it into the caller's memory.
//
//	0  type    u8, then 3 bytes of zero
//	4  rv id   u64
//	12 addr    u64
//	20 rkey    u32
//	24 length  u32
//	28 head    the rest of the payload, up to maxRendezvousHead bytes
type rendezvousInfo struct {
	Type   Type // TypeData, TypeRequest, TypeResponse or TypeError
	RVID   uint64
	Addr   uint64 // the region (a bufpool.Remote)
	RKey   uint32
	Length uint32
	Head   []byte // aliases the decoded bytes
}

const (
	rendezvousInfoSize = 28
	// maxRendezvousHead is the longest head an offer carries: a request's
	// method length and method.
	maxRendezvousHead = 256
)

// encode writes r into b[:r.size()].
func (r *rendezvousInfo) encode(b []byte) {
	b[0] = byte(r.Type)
	b[1], b[2], b[3] = 0, 0, 0
	binary.LittleEndian.PutUint64(b[4:], r.RVID)
	binary.LittleEndian.PutUint64(b[12:], r.Addr)
	binary.LittleEndian.PutUint32(b[20:], r.RKey)
	binary.LittleEndian.PutUint32(b[24:], r.Length)
	copy(b[rendezvousInfoSize:], r.Head)
}

// size is the length of the encoded info and head.
func (r *rendezvousInfo) size() int { return rendezvousInfoSize + len(r.Head) }

func (r *rendezvousInfo) decode(b []byte) error {
	r.Type = Type(b[0])
	switch r.Type {
	case TypeData, TypeRequest, TypeResponse, TypeError:
	default:
		return fmt.Errorf("%w: rendezvous of a %v message", ErrMalformed, r.Type)
	}
	r.RVID = binary.LittleEndian.Uint64(b[4:])
	r.Addr = binary.LittleEndian.Uint64(b[12:])
	r.RKey = binary.LittleEndian.Uint32(b[20:])
	r.Length = binary.LittleEndian.Uint32(b[24:])
	r.Head = b[rendezvousInfoSize:]
	if r.Length == 0 {
		return fmt.Errorf("%w: an empty rendezvous", ErrMalformed)
	}
	return nil
}
