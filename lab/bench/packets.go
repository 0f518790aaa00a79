//go:build linux

package bench

import (
	"encoding/binary"
	"math/rand/v2"
)

// PacketKind is what a flood sends.
type PacketKind string

// Flood datagram kinds.
const (
	// PacketInitial is an Initial-like 1200-byte datagram: a long header
	// that parses (version 1, 8-byte random connection IDs, no token) and
	// a random payload that fails decryption. quic-go builds a connection
	// for each before it finds out.
	PacketInitial PacketKind = "initial"
	// PacketInvalid is, in turn, a long header with an unknown version
	// (1200 bytes, which earns a Version Negotiation reply), an Initial
	// under 1200 bytes, a long header with the fixed bit 0, and one with a
	// destination connection ID length over 20.
	PacketInvalid PacketKind = "invalid"
	// PacketShort is a 1200-byte short-header datagram with a random
	// (unknown) destination connection ID.
	PacketShort PacketKind = "short"
	// PacketLongMin is the smallest long header: 7 bytes, e0 00000001 00
	// 00 (type Handshake, version 1, both connection IDs empty), the same
	// every time.
	PacketLongMin PacketKind = "long-min"
	// PacketShortSmall is short-header junk of 60 to 100 bytes: a first
	// byte from 0x40 to 0x7f, then random bytes.
	PacketShortSmall PacketKind = "short-small"
)

// MaxDatagram is the largest datagram a flood sends.
const MaxDatagram = 1200

// Sizes of the small kinds; with empty connection IDs, the SCID length
// follows the DCID length.
const (
	offMinSCIDLen     = offDCIDLen + 1
	longMinSize       = 7
	shortSmallMin     = 60
	shortSmallMax     = 100
	shortSmallRewrite = 17 // first byte and 16 bytes: any connection ID length up to 16
)

// rewrittenPrefix bounds what next writes: every kind rewrites only the first
// rewrittenPrefix bytes of a buffer, the rest keeps newBuffer's random bytes
// (a spoofed flood sums them once for the UDP checksum).
const rewrittenPrefix = 32

// The long-header layout the generator writes: first byte, version,
// DCID length and DCID (8), SCID length and SCID (8), token length (0), a
// two-byte length, then packet number and payload.
const (
	offVersion = 1
	offDCIDLen = 5
	offDCID    = 6
	offSCIDLen = 14
	offSCID    = 15
	offToken   = 23
	offLength  = 24
	longHeader = 26
)

// Invalid sub-kinds, in the order PacketInvalid cycles through them.
const (
	invalidVersion = iota
	invalidShortInitial
	invalidFixedBit
	invalidCIDLength
	invalidKinds
)

// unknownVersion follows the 0x?a?a?a?a pattern reserved for exercising
// version negotiation.
const unknownVersion = 0x5a6a7a8a

// packetGen writes flood datagrams. A buffer gets its random payload once
// (newBuffer); each datagram then rewrites only the header, with fresh
// connection IDs, so that the sender's cost stays far below the receiver's.
type packetGen struct {
	kind PacketKind
	rng  *rand.PCG
	n    uint64
}

func newPacketGen(kind PacketKind, seed uint64) *packetGen {
	return &packetGen{kind: kind, rng: rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)}
}

// newBuffer returns a MaxDatagram buffer filled with random bytes.
func (g *packetGen) newBuffer() []byte {
	b := make([]byte, MaxDatagram)
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], g.rng.Uint64())
	}
	return b
}

// next rewrites the header of buf (from newBuffer) for the next datagram and
// returns the datagram, buf or a prefix of it.
func (g *packetGen) next(buf []byte) []byte {
	r := g.rng.Uint64()
	g.n++
	switch g.kind {
	case PacketShort:
		buf[0] = 0x40 | byte(r)&0x3f // short header, fixed bit set
		binary.LittleEndian.PutUint64(buf[1:], g.rng.Uint64())
		return buf[:MaxDatagram]
	case PacketLongMin:
		buf[0] = 0xe0 // long header, fixed bit, type Handshake
		binary.BigEndian.PutUint32(buf[offVersion:], 1)
		buf[offDCIDLen] = 0
		buf[offMinSCIDLen] = 0
		return buf[:longMinSize]
	case PacketShortSmall:
		buf[0] = 0x40 | byte(r)&0x3f
		for i := 1; i < shortSmallRewrite; i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], g.rng.Uint64())
		}
		return buf[:shortSmallMin+int(r>>32)%(shortSmallMax-shortSmallMin+1)]
	case PacketInvalid:
		return g.invalid(buf, r)
	}
	return g.initial(buf, r, MaxDatagram)
}

// initial writes a version 1 Initial header for a datagram of n bytes.
func (g *packetGen) initial(buf []byte, r uint64, n int) []byte {
	buf[0] = 0xc0 | byte(r)&0x0f // long header, fixed bit, type Initial
	binary.BigEndian.PutUint32(buf[offVersion:], 1)
	buf[offDCIDLen] = 8
	binary.LittleEndian.PutUint64(buf[offDCID:], g.rng.Uint64())
	buf[offSCIDLen] = 8
	binary.LittleEndian.PutUint64(buf[offSCID:], g.rng.Uint64())
	buf[offToken] = 0
	binary.BigEndian.PutUint16(buf[offLength:], 0x4000|uint16(n-longHeader))
	return buf[:n]
}

func (g *packetGen) invalid(buf []byte, r uint64) []byte {
	switch g.n % invalidKinds {
	case invalidVersion:
		p := g.initial(buf, r, MaxDatagram)
		binary.BigEndian.PutUint32(p[offVersion:], unknownVersion)
		return p
	case invalidShortInitial:
		return g.initial(buf, r, 200+int(r>>32)%(MaxDatagram-200))
	case invalidFixedBit:
		p := g.initial(buf, r, MaxDatagram)
		p[0] &^= 0x40
		return p
	default: // invalidCIDLength
		p := g.initial(buf, r, MaxDatagram)
		p[offDCIDLen] = byte(21 + (r>>32)%235)
		return p
	}
}
