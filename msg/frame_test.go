package msg

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Type: TypeRequest, Flags: FlagWantsCredit, Credits: 17, ID: 1 << 40, Length: 5, Released: 1<<32 - 3}
	b := make([]byte, HeaderSize+5)
	h.Encode(b)
	var got Header
	require.NoError(t, got.Decode(b))
	require.Equal(t, h, got)
}

func TestHeaderRejects(t *testing.T) {
	good := func() []byte {
		b := make([]byte, HeaderSize+3)
		(&Header{Type: TypeData, Length: 3}).Encode(b)
		return b
	}
	cases := map[string]func() []byte{
		"short":         func() []byte { return good()[:HeaderSize-1] },
		"version":       func() []byte { b := good(); b[0] = 9; return b },
		"type zero":     func() []byte { b := good(); b[1] = 0; return b },
		"type unknown":  func() []byte { b := good(); b[1] = byte(typeLimit); return b },
		"flags":         func() []byte { b := good(); b[3] = 0x80; return b },
		"length long":   func() []byte { return good()[:HeaderSize+2] },
		"length short":  func() []byte { return append(good(), 0) },
		"credit+bytes":  func() []byte { b := good(); b[1] = byte(TypeCredit); return b },
		"close+bytes":   func() []byte { b := good(); b[1] = byte(TypeClose); return b },
		"eof+bytes":     func() []byte { b := good(); b[1] = byte(TypeCloseWrite); return b },
		"rendezvous sz": func() []byte { b := good(); b[1] = byte(TypeRendezvous); return b },
	}
	for name, mk := range cases {
		var h Header
		require.ErrorIs(t, h.Decode(mk()), ErrMalformed, name)
	}
}

// FuzzDecode: no input crashes the decoder, and what it accepts re-encodes
// to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, h := range []Header{
		{Type: TypeData, Length: 3},
		{Type: TypeCredit, Credits: 8},
		{Type: TypeClose},
		{Type: TypeCloseWrite, Credits: 1},
		{Type: TypeRequest, ID: 42, Length: 1},
		{Type: TypeRendezvous, Flags: FlagRendezvous, Length: rendezvousInfoSize},
		{Type: TypeRendezvous, Flags: FlagRendezvous, Length: rendezvousInfoSize + 5},
	} {
		b := make([]byte, HeaderSize+int(h.Length))
		h.Encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		if h.Decode(b) != nil {
			return
		}
		again := make([]byte, HeaderSize)
		h.Encode(again)
		require.Equal(t, b[:HeaderSize], again)
		if h.Type == TypeRendezvous {
			var ri rendezvousInfo
			if ri.decode(b[HeaderSize:]) == nil {
				out := make([]byte, ri.size())
				ri.encode(out)
				require.Equal(t, b[HeaderSize+4:], out[4:])
			}
		}
	})
}

func BenchmarkHeaderEncodeDecode(b *testing.B) {
	buf := make([]byte, HeaderSize+64)
	h := Header{Type: TypeData, Credits: 3, ID: 99, Length: 64}
	var got Header
	b.ReportAllocs()
	for b.Loop() {
		h.Encode(buf)
		if err := got.Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParseHello: no private data a peer sends crashes the hello's
// parser, and what it accepts encodes back to the same hello.
func FuzzParseHello(f *testing.F) {
	f.Add(hello{recvDepth: 32, bufSize: 4096}.encode())
	f.Add(hello{recvDepth: minRecvDepth, bufSize: HeaderSize + rendezvousInfoSize, streamReader: true}.encode())
	f.Add(append(hello{recvDepth: 1 << 20, bufSize: 1 << 30}.encode(), make([]byte, 40)...)) // CM padding
	f.Add(hello{recvDepth: 32, bufSize: 4096, maxMessage: 1 << 20}.encode()[:helloMinSize])
	f.Add(hello{recvDepth: 32, bufSize: 4096, maxMessage: 1 << 20, silence: time.Minute}.encode())
	f.Add(hello{recvDepth: 32, bufSize: 4096, maxMessage: 1 << 20}.encode()[:helloMaxMessageEnd])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		require.GreaterOrEqual(t, h.recvDepth, minRecvDepth)
		require.GreaterOrEqual(t, h.bufSize, HeaderSize+rendezvousInfoSize)
		require.Positive(t, h.maxMessage)
		require.LessOrEqual(t, h.maxMessage, maxRendezvous)
		require.GreaterOrEqual(t, h.silence, time.Duration(0))
		require.Zero(t, h.silence%time.Millisecond, "whole milliseconds")
		again, err := parseHello(h.encode())
		require.NoError(t, err)
		require.Equal(t, h, again)
	})
}

// FuzzDecodeRequest: no request payload a peer sends crashes the
// decoder, and what it accepts is a method of 1 to 255 bytes and the
// rest, which requestHead puts back together.
func FuzzDecodeRequest(f *testing.F) {
	var buf [256]byte
	for _, method := range []string{"echo", "m", strings.Repeat("x", 255)} {
		head, err := requestHead(&buf, method)
		require.NoError(f, err)
		f.Add(append(append([]byte(nil), head...), "request"...))
	}
	f.Add([]byte{})
	f.Add([]byte{255, 'a'})
	f.Fuzz(func(t *testing.T, p []byte) {
		method, req, err := decodeRequest(p)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		require.NotEmpty(t, method)
		head, err := requestHead(&buf, string(method))
		require.NoError(t, err)
		require.Equal(t, p, append(append([]byte(nil), head...), req...))
	})
}
