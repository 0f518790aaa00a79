// Package quicclasstest builds datagrams of each QUIC class, for tests and
// benchmarks (the lab's too): long and short headers, coalesced long-header
// packets, varints. Nothing outside tests, benchmarks and the lab imports
// it.
package quicclasstest

import (
	"encoding/binary"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// The wire format the builders write (RFC 8999, RFC 9000 section 17).
const (
	headerForm  = 0x80
	fixedBit    = 0x40
	longTypeBit = 4
	// shortIDOffset is where a short header's destination ID starts.
	shortIDOffset = 1
	// retryTagLen is the Retry Integrity Tag that ends a Retry packet (RFC
	// 9001 section 5.8).
	retryTagLen = 16
)

// Long header packet types as numbered by QUIC v1; v2 (RFC 9369) rotates
// them.
const (
	typeInitial = 0
	typeRetry   = 3
)

// LongHeader returns a long-header datagram of version v with the packet type
// field typ (as on the wire: v1 numbers Initial 0, 0-RTT 1, Handshake 2,
// Retry 3) and connection IDs of the given lengths, zero-padded or cut to
// size bytes. Its fixed bit is set.
func LongHeader(v uint32, typ uint8, dcil, scil, size int) []byte {
	b := []byte{headerForm | fixedBit | typ<<longTypeBit}
	b = binary.BigEndian.AppendUint32(b, v)
	b = append(b, byte(dcil))
	b = append(b, make([]byte, dcil)...)
	b = append(b, byte(scil))
	b = append(b, make([]byte, scil)...)
	for len(b) < size {
		b = append(b, 0)
	}
	return b[:size]
}

// Initial returns the datagram tests take for a client's first: a v1
// Initial of MinInitialDatagram bytes with 8-byte connection IDs, the rest
// zero. Its Length field is 0, which only verification refuses.
func Initial() []byte {
	return LongHeader(quicclass.Version1, typeInitial, 8, 8, quicclass.MinInitialDatagram)
}

// UnknownVersion returns Initial with the version 0x0a0a0a0a, one of those
// reserved for exercising version negotiation: no server speaks it, and
// quic-go answers it with a Version Negotiation packet.
func UnknownVersion() []byte {
	return LongHeader(0x0a0a0a0a, typeInitial, 8, 8, quicclass.MinInitialDatagram)
}

// ShortHeader returns a short-header datagram of size bytes with its fixed
// bit set.
func ShortHeader(size int) []byte {
	b := make([]byte, size)
	if size > 0 {
		b[0] = fixedBit | 0x01
	}
	return b
}

// LongPacket returns a long-header datagram of size bytes of version v with
// the packet type field typ (as on the wire), the given connection IDs and,
// for an Initial, the given token: a single packet whose Length field covers
// the rest of the datagram, which is what lengths verification accepts.
// size must leave room for the header and a Length of at least
// MinLongPacketLength.
func LongPacket(v uint32, typ uint8, dcid, scid, token []byte, size int) []byte {
	b := []byte{headerForm | fixedBit | typ<<longTypeBit}
	b = binary.BigEndian.AppendUint32(b, v)
	b = append(b, byte(len(dcid)))
	b = append(b, dcid...)
	b = append(b, byte(len(scid)))
	b = append(b, scid...)
	if typ == wireType(typeInitial, v) {
		b = AppendVarint(b, uint64(len(token)))
		b = append(b, token...)
	}
	rest := size - len(b) - 2
	if rest >= 1<<14 {
		rest -= 2
	}
	b = AppendVarint(b, uint64(max(rest, 0)))
	for len(b) < size {
		b = append(b, 0)
	}
	return b[:size]
}

// AppendLongPacket appends to b a long-header packet of version v and type
// typ, numbered as v1 numbers them (Initial 0, 0-RTT 1, Handshake 2, Retry
// 3; for v2 the field on the wire is rotated), from scid to dcid: an
// Initial carries token; a Retry carries token and a Retry Integrity Tag of
// zeros, and ends there; every other type carries a Length field of payload
// and payload zero bytes, so that packets appended one after another make a
// coalesced datagram. The token length and the Length are 2-byte varints
// when they fit (8 bytes otherwise).
func AppendLongPacket(b []byte, v uint32, typ uint8, dcid, scid, token []byte, payload int) []byte {
	b = append(b, headerForm|fixedBit|wireType(typ, v)<<longTypeBit)
	b = binary.BigEndian.AppendUint32(b, v)
	b = append(b, byte(len(dcid)))
	b = append(b, dcid...)
	b = append(b, byte(len(scid)))
	b = append(b, scid...)
	switch typ {
	case typeRetry:
		b = append(b, token...)
		return append(b, make([]byte, retryTagLen)...)
	case typeInitial:
		b = appendVarint2(b, uint64(len(token)))
		b = append(b, token...)
	}
	b = appendVarint2(b, uint64(payload))
	return append(b, make([]byte, payload)...)
}

// appendVarint2 appends v as a 2-byte varint when it fits, else as an
// 8-byte one; v must be under 2^62.
func appendVarint2(b []byte, v uint64) []byte {
	if v < 1<<14 {
		return binary.BigEndian.AppendUint16(b, uint16(v)|0x4000)
	}
	return binary.BigEndian.AppendUint64(b, v|0xc000_0000_0000_0000)
}

// ShortPacket returns a short-header datagram of size bytes whose
// destination connection ID starts with id.
func ShortPacket(id [quicclass.ServerIDLen]byte, size int) []byte {
	b := ShortHeader(size)
	copy(b[shortIDOffset:], id[:])
	return b
}

// wireType returns the long-header packet type field of version v for the
// type typ as v1 numbers it: v2 numbers Initial 1, 0-RTT 2, Handshake 3,
// Retry 0.
func wireType(typ uint8, v uint32) uint8 {
	if v == quicclass.Version2 {
		return (typ + 1) & 3
	}
	return typ
}

// AppendVarint appends v as a variable-length integer (RFC 9000 section
// 16) of the smallest size that holds it; v must be under 2^62.
func AppendVarint(b []byte, v uint64) []byte {
	switch {
	case v < 1<<6:
		return append(b, byte(v))
	case v < 1<<14:
		return binary.BigEndian.AppendUint16(b, uint16(v)|0x4000)
	case v < 1<<30:
		return binary.BigEndian.AppendUint32(b, uint32(v)|0x8000_0000)
	}
	return binary.BigEndian.AppendUint64(b, v|0xc000_0000_0000_0000)
}
