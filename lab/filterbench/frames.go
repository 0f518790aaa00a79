package filterbench

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
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

// withSource returns a copy of an IPv4 or IPv6 frame (as testutil.Frame
// builds it, without options or extension headers) from src, which must be
// of the frame's family. The IPv4 checksum is updated.
func withSource(f []byte, src netip.Addr) []byte {
	g := append([]byte(nil), f...)
	ip := g[testutil.EthHdrLen:]
	if src.Is4() {
		s := src.As4()
		copy(ip[12:], s[:])
		binary.BigEndian.PutUint16(ip[10:], 0)
		binary.BigEndian.PutUint16(ip[10:], testutil.IPv4Checksum(ip[:testutil.IPv4HdrLen]))
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
			binary.BigEndian.PutUint16(out[i][testutil.UDPOffset(ipv6):], uint16(1024+rng.IntN(65536-1024)))
		}
	}
	return out
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
