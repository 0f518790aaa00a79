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
