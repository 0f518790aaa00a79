package decide

import (
	"encoding/binary"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Header sizes and fields, as parse_ipv4 and parse_ipv6 in
// internal/kernel/c/parse.h read them.
const (
	ipv4MinHeader      = 20     // C: IPV4_MIN_HDR_LEN
	ipv4FragOffsetMask = 0x1fff // C: IPV4_FRAG_OFFSET_MASK
	ipv6Header         = 40     // C: IPV6_HDR_LEN
	ipv6FragOffsetMask = 0xfff8 // C: IPV6_FRAG_OFFSET_MASK
	ipv6ExtUnit        = 8      // C: IPV6_EXT_UNIT
	ipv6AHUnit         = 4      // C: IPV6_AH_UNIT
	ipv6FragHeader     = 8      // C: IPV6_FRAG_HDR_LEN
	udpHeader          = 8      // C: UDP_HDR_LEN
	// IPv6MaxExt is how many IPv6 extension headers the parser walks
	// looking for UDP: a datagram behind more has no ports. No QUIC client
	// sends any; such a datagram is invalid (unparsed) when the filter
	// classifies, and counted at the port-wildcard nodes when not.
	IPv6MaxExt = 6 // C: IPV6_MAX_EXT

	protoHopOpts  = 0
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoAH       = 51
	protoDstOpts  = 60
	protoUDPLite  = 136
)

// UDPPayloadLength is the length of the payload of a UDP header at offset
// off of an IP datagram of ipLen bytes, whose length field is ulen
// (udp_length in internal/kernel/c/parse.h): what a UDP socket receives, since the
// kernel trims a packet to its UDP length before any socket filter runs.
// It is the length field less the header, bounded by the IP datagram; a
// field of 0 (an IPv6 jumbogram's) means the rest of the IP datagram, and so
// does UDP-Lite (lite), whose field is the checksum's coverage.
func UDPPayloadLength(ulen, off, ipLen int, lite bool) int {
	avail := max(ipLen-off, 0)
	if lite || ulen == 0 || ulen > avail {
		ulen = avail
	}
	return max(ulen-udpHeader, 0)
}

// Parse reads what the filter reads of a network-layer packet b (IPv4, or
// IPv6 when ipv6), as parse() in internal/kernel/c/parse.h does when the packet is
// whole in memory (BPF_PROG_TEST_RUN): the source address, the ports and
// the UDP payload, whose length is UDPPayloadLength bounded by the bytes b
// holds. A field it cannot read is left zero: the family unknown when the
// IP header is cut short, no ports when the UDP header cannot be found (not
// UDP, a later fragment, behind more than IPv6MaxExt extension headers, cut
// short). Tests and fuzzing compare it with the program.
func Parse(b []byte, ipv6 bool) Datagram {
	if ipv6 {
		return parseIPv6(b)
	}
	return parseIPv4(b)
}

func parseIPv4(b []byte) Datagram {
	var d Datagram
	if len(b) < ipv4MinHeader {
		return d
	}
	d.Key.Family = sketch.IPv4
	d.Key.Words[0] = binary.BigEndian.Uint32(b[12:])
	proto := b[9]
	if !isUDP(proto) || binary.BigEndian.Uint16(b[6:])&ipv4FragOffsetMask != 0 {
		return d
	}
	off := int(b[0]&0x0f) * 4
	if off < ipv4MinHeader {
		return d
	}
	parseUDP(&d, b, off, int(binary.BigEndian.Uint16(b[2:])), proto == protoUDPLite)
	return d
}

func parseIPv6(b []byte) Datagram {
	var d Datagram
	if len(b) < ipv6Header {
		return d
	}
	d.Key.Family = sketch.IPv6
	for i := range d.Key.Words {
		d.Key.Words[i] = binary.BigEndian.Uint32(b[8+4*i:])
	}
	ipLen := ipv6Header + int(binary.BigEndian.Uint16(b[4:]))
	next, off := b[6], ipv6Header
	for range IPv6MaxExt {
		if next != protoHopOpts && next != protoRouting && next != protoDstOpts && next != protoFragment && next != protoAH {
			break
		}
		// The first bytes of every extension header: the next header,
		// the length and, for a fragment header, the fragment offset.
		if off+4 > len(b) {
			return d
		}
		ext := off
		switch next {
		case protoFragment:
			if binary.BigEndian.Uint16(b[off+2:])&ipv6FragOffsetMask != 0 {
				return d
			}
			off += ipv6FragHeader
		case protoAH:
			off += (int(b[off+1]) + 2) * ipv6AHUnit
		default:
			off += (int(b[off+1]) + 1) * ipv6ExtUnit
		}
		next = b[ext]
	}
	if isUDP(next) {
		parseUDP(&d, b, off, ipLen, next == protoUDPLite)
	}
	return d
}

func isUDP(proto uint8) bool { return proto == protoUDP || proto == protoUDPLite }

// parseUDP fills d from the UDP header at off of packet b, whose IP datagram
// is ipLen bytes long (set_udp): the ports, the payload's length and the
// payload, all of it that b holds within that length.
func parseUDP(d *Datagram, b []byte, off, ipLen int, lite bool) {
	if off+udpHeader > len(b) {
		return
	}
	d.Key.HasPorts = true
	d.Key.SrcPort = binary.BigEndian.Uint16(b[off:])
	d.Key.DstPort = binary.BigEndian.Uint16(b[off+2:])
	at := off + udpHeader
	n := UDPPayloadLength(int(binary.BigEndian.Uint16(b[off+4:])), off, ipLen, lite)
	d.Length = min(n, len(b)-at)
	d.Probe = b[at : at+d.Length]
}
