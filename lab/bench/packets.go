//go:build linux

package bench

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
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
	// PacketIDShort is a short header whose destination connection ID
	// starts with the server ID of the attacker's own connection (the
	// flood's serverID), 50 to 1200 bytes: what the filter verifies by
	// that ID alone today.
	PacketIDShort PacketKind = "id-short"
	// PacketIDLong is, in turn, a version 1 Initial of 1200 bytes and a
	// Handshake of 60 to 1200 bytes, both with the server ID of the
	// attacker's connection as their whole destination connection ID, a
	// random 8-byte source connection ID and a Length field that covers
	// the rest of the datagram.
	PacketIDLong PacketKind = "id-long"
	// PacketReuse is, in turn, a short header with a random destination
	// connection ID (50 to 1200 bytes) and a Handshake with a random
	// 4-byte destination connection ID (60 to 1200 bytes, Length field
	// as PacketIDLong's): what a source the server answers sends to ride
	// on being one.
	PacketReuse PacketKind = "reuse"
	// PacketGuess is, in turn, a short header with a random destination
	// connection ID (50 to 1200 bytes), a Handshake (60 to 1200 bytes) and
	// an Initial (1200 bytes) to a random 4-byte destination connection ID
	// (Length fields as PacketIDLong's): from an address the server
	// answered, each long header is a guess at one of the server IDs bound
	// to it, an attempt at a proof.
	PacketGuess PacketKind = "guess"
	// PacketShortInitial is, in turn, a short header with a random
	// destination connection ID (50 to 1200 bytes) and PacketInitial's
	// Initial-like 1200-byte datagram.
	PacketShortInitial PacketKind = "short-initial"
)

// needsServerID reports whether datagrams of kind carry the server ID of the
// attacker's connection.
func (k PacketKind) needsServerID() bool { return k == PacketIDShort || k == PacketIDLong }

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

	// Sizes of the attack kinds: short headers from realistic
	// acknowledgments to full packets, Handshake packets from a client's
	// Finished to a server's certificate flight.
	attackShortMin     = 50
	attackHandshakeMin = 60
	// attackRewrite is what a short header of the attack kinds rewrites:
	// the first byte, then 20 bytes (a connection ID of any length).
	attackRewrite = 21
	// attackSCIDLen is the source connection ID length of the attack
	// kinds' long headers.
	attackSCIDLen = 8
)

// Long-header packet types as QUIC v1 numbers them.
const (
	longTypeInitial   = 0
	longTypeHandshake = 2
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
	// serverID is the server ID the kinds that need one carry
	// (PacketKind.needsServerID).
	serverID [quicclass.ServerIDLen]byte
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
	case PacketIDShort:
		return g.short(buf, r, g.serverID[:])
	case PacketIDLong:
		if g.n%2 == 1 {
			return g.long(buf, longTypeInitial, g.serverID[:], MaxDatagram)
		}
		return g.long(buf, longTypeHandshake, g.serverID[:], sizeIn(r>>32, attackHandshakeMin, MaxDatagram))
	case PacketReuse:
		if g.n%2 == 1 {
			return g.short(buf, r, nil)
		}
		var dcid [quicclass.ServerIDLen]byte
		binary.LittleEndian.PutUint32(dcid[:], uint32(g.rng.Uint64()))
		return g.long(buf, longTypeHandshake, dcid[:], sizeIn(r>>32, attackHandshakeMin, MaxDatagram))
	case PacketGuess:
		var dcid [quicclass.ServerIDLen]byte
		switch g.n % 3 {
		case 1:
			return g.short(buf, r, nil)
		case 2:
			binary.LittleEndian.PutUint32(dcid[:], uint32(g.rng.Uint64()))
			return g.long(buf, longTypeHandshake, dcid[:], sizeIn(r>>32, attackHandshakeMin, MaxDatagram))
		}
		binary.LittleEndian.PutUint32(dcid[:], uint32(g.rng.Uint64()))
		return g.long(buf, longTypeInitial, dcid[:], MaxDatagram)
	case PacketShortInitial:
		if g.n%2 == 1 {
			return g.short(buf, r, nil)
		}
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

// sizeIn maps r to a size from lo to hi.
func sizeIn(r uint64, lo, hi int) int { return lo + int(r%uint64(hi-lo+1)) }

// short writes a short header of attackShortMin to MaxDatagram bytes
// whose destination connection ID starts with id (random bytes follow it;
// all random for a nil id).
func (g *packetGen) short(buf []byte, r uint64, id []byte) []byte {
	buf[0] = 0x40 | byte(r)&0x3f // short header, fixed bit set
	for i := 1; i < attackRewrite; i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], g.rng.Uint64())
	}
	copy(buf[1:], id)
	return buf[:sizeIn(r>>32, attackShortMin, MaxDatagram)]
}

// long writes a version 1 long header of type typ (Initial or Handshake)
// from a random source connection ID to dcid, for a datagram of n bytes:
// quicclass's builder writes the header, whose Length field then covers
// the rest of the datagram; the payload keeps newBuffer's random bytes.
func (g *packetGen) long(buf []byte, typ uint8, dcid []byte, n int) []byte {
	var scid [attackSCIDLen]byte
	binary.LittleEndian.PutUint64(scid[:], g.rng.Uint64())
	h := quicclasstest.AppendLongPacket(buf[:0], quicclass.Version1, typ, dcid, scid[:], nil, 0)
	binary.BigEndian.PutUint16(h[len(h)-2:], 0x4000|uint16(n-len(h)))
	return buf[:n]
}
