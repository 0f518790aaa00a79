package quicclass

import "encoding/binary"

// Datagram builders, for tests and benchmarks that need datagrams of each
// class.

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
	if longType(typ, v) == typeInitial {
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

// ShortPacket returns a short-header datagram of size bytes whose
// destination connection ID starts with id.
func ShortPacket(id [ServerIDLen]byte, size int) []byte {
	b := ShortHeader(size)
	copy(b[shortIDOffset:], id[:])
	return b
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
