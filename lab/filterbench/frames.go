package filterbench

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
)

// Header sizes and fields of the frames BPF_PROG_TEST_RUN takes: it expects
// an Ethernet header, which it strips, so that a socket filter sees
// skb->data at the IP header.
const (
	ethHdrLen   = 14
	ipv4HdrLen  = 20
	ipv6HdrLen  = 40
	udpHdrLen   = 8
	etherIPv4   = 0x0800
	etherIPv6   = 0x86dd
	protoUDP    = 17
	defaultTTL  = 64
	ipv4Version = 4 << 4
	ipv6Version = 6 << 4
)

// Addresses of the frames: documentation prefixes, never sent anywhere.
var (
	srcIPv4 = netip.MustParseAddr("198.51.100.7")
	dstIPv4 = netip.MustParseAddr("203.0.113.1")
	srcIPv6 = netip.MustParseAddr("2001:db8:1:2::7")
	dstIPv6 = netip.MustParseAddr("2001:db8:ffff::1")
)

// Ports of the frames: a client's ephemeral port to the HTTP/3 port.
const (
	srcPort = 50000
	dstPort = 443
)

// frame returns an Ethernet frame carrying a UDP datagram with payload from
// src:sport to dst:dport; src and dst must be of one family. The IPv4
// header checksum is filled in; the UDP checksum is left 0 (none), which
// neither program reads.
func frame(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	udpLen := udpHdrLen + len(payload)
	ipLen := ipv6HdrLen
	ether := uint16(etherIPv6)
	if src.Is4() {
		ipLen, ether = ipv4HdrLen, etherIPv4
	}
	b := make([]byte, ethHdrLen+ipLen+udpLen)
	binary.BigEndian.PutUint16(b[12:], ether)
	ip := b[ethHdrLen : ethHdrLen+ipLen]
	if src.Is4() {
		ip[0] = ipv4Version | ipv4HdrLen/4
		binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+udpLen))
		ip[8] = defaultTTL
		ip[9] = protoUDP
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip))
	} else {
		ip[0] = ipv6Version
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		ip[6] = protoUDP
		ip[7] = defaultTTL
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
	}
	udp := b[ethHdrLen+ipLen:]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	copy(udp[udpHdrLen:], payload)
	return b
}

// ipv4Checksum is the Internet checksum of an IPv4 header whose checksum
// field is zero.
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// withSource returns a copy of an IPv4 or IPv6 frame (as frame builds) from
// src, which must be of the frame's family. The IPv4 checksum is updated.
func withSource(f []byte, src netip.Addr) []byte {
	g := append([]byte(nil), f...)
	ip := g[ethHdrLen:]
	if src.Is4() {
		s := src.As4()
		copy(ip[12:], s[:])
		binary.BigEndian.PutUint16(ip[10:], 0)
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:ipv4HdrLen]))
	} else {
		s := src.As16()
		copy(ip[8:], s[:])
	}
	return g
}

// randomFrames returns n copies of f (an IPv4 frame, or IPv6 with ipv6),
// each from a random source: for IPv4, a unicast address outside 0/8,
// 127/8 and 224/3; for IPv6, one in 2000::/3. Every bit of the prefixes
// the limiters group by varies, as in a spoofed flood. With ports, the
// source port is random too (1024 to 65535), as most spoofed floods send;
// without, every copy keeps f's.
func randomFrames(f []byte, ipv6, ports bool, n int, rng *rand.Rand) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = withSource(f, randomSource(ipv6, rng))
		if ports {
			binary.BigEndian.PutUint16(out[i][udpOffset(ipv6):], uint16(1024+rng.IntN(65536-1024)))
		}
	}
	return out
}

// udpOffset is where the UDP header of an IPv4 frame (IPv6 with ipv6) starts.
func udpOffset(ipv6 bool) int {
	if ipv6 {
		return ethHdrLen + ipv6HdrLen
	}
	return ethHdrLen + ipv4HdrLen
}

// randomSource returns a random source address (see randomFrames).
func randomSource(ipv6 bool, rng *rand.Rand) netip.Addr {
	if ipv6 {
		var a [16]byte
		binary.BigEndian.PutUint64(a[:], rng.Uint64())
		binary.BigEndian.PutUint64(a[8:], rng.Uint64())
		a[0] = 0x20 | a[0]&0x1f
		return netip.AddrFrom16(a)
	}
	for {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], rng.Uint32())
		if a[0] != 0 && a[0] != 127 && a[0] < 224 {
			return netip.AddrFrom4(a)
		}
	}
}
