//go:build linux

package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// A spoofed flood is built like the common flood in the wild: every datagram
// carries a new random source address and port. A raw IPv4 socket
// (IPPROTO_RAW, which implies IP_HDRINCL) sends whole IP datagrams whose
// IPv4 and UDP headers spoofGen writes. On loopback the kernel delivers them
// as they are: a packet sent on lo keeps the route it was sent with, so
// neither rp_filter nor the martian-source check sees a 127.128.0.0/9 source
// (checked on Linux 6.18; route_localnet stays 0). The UDP checksum must be
// right: with a socket filter attached, the kernel verifies it before the
// filter runs and drops a datagram that fails.

// IPv4 and UDP header layout.
const (
	ipv4HeaderLen = 20
	udpHeaderLen  = 8
	spoofHeaders  = ipv4HeaderLen + udpHeaderLen

	ipOffVersionIHL = 0
	ipOffTotalLen   = 2
	ipOffID         = 4
	ipOffFlags      = 6
	ipOffTTL        = 8
	ipOffProtocol   = 9
	ipOffChecksum   = 10
	ipOffSrc        = 12
	ipOffDst        = 16

	udpOffSrcPort  = ipv4HeaderLen + 0
	udpOffDstPort  = ipv4HeaderLen + 2
	udpOffLength   = ipv4HeaderLen + 4
	udpOffChecksum = ipv4HeaderLen + 6

	ipVersion4NoOptions = 0x45 // version 4, header of 5 words
	ipFlagDontFragment  = 0x4000
	ipTTL               = 64
	ipProtoUDP          = 17

	// Random source ports are spoofPortMin to 65535.
	spoofPortMin   = 1024
	spoofPortCount = 65536 - spoofPortMin
)

// loopbackV4 is 127.0.0.0/8: every spoofed source and destination is in it.
func loopbackV4() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 0, 0, 0}), 8)
}

// checkSpoofed refuses a source range or a destination outside 127.0.0.0/8.
func checkSpoofed(src netip.Prefix, dst netip.AddrPort) error {
	lo := loopbackV4()
	if !src.IsValid() || !src.Addr().Is4() || src.Bits() < lo.Bits() || !lo.Contains(src.Addr()) {
		return fmt.Errorf("spoofed source range %v is outside %v", src, lo)
	}
	if !dst.Addr().Is4() || !lo.Contains(dst.Addr()) {
		return fmt.Errorf("spoofed flood destination %v is outside %v", dst.Addr(), lo)
	}
	return nil
}

// spoofGen writes whole IPv4 datagrams into floodBatch buffers of its own:
// the payload from a packetGen, a UDP header from a new random source port,
// an IPv4 header from a new random source address in src, to dst.
type spoofGen struct {
	payload  *packetGen
	rng      *rand.PCG
	srcBase  uint32 // src's first address
	hostMask uint32 // src's host bits
	dst      [4]byte
	dstPort  uint16
	bufs     [][]byte
	// tails holds, per buffer, the checksum sum of its payload after
	// rewrittenPrefix up to MaxDatagram: bytes the packetGen never
	// rewrites, summed once.
	tails []uint64
	// hosts, when not empty, are the only sources (narrow), each in src;
	// with cycle, they send in turn (next is the next one's index),
	// else each datagram picks one at random.
	hosts []uint32
	cycle bool
	turn  int
	// except, when hasExcept, is an address of src never sent from
	// (exclude): a random pick of it takes the next address instead.
	except    uint32
	hasExcept bool
	// seen has a bit per host part of src: the sources sent.
	seen     []uint64
	distinct int
}

// newSpoofGen returns a generator of kind datagrams from src to dst, or an
// error when either is outside 127.0.0.0/8.
func newSpoofGen(kind PacketKind, src netip.Prefix, dst netip.AddrPort, seed uint64) (*spoofGen, error) {
	if err := checkSpoofed(src, dst); err != nil {
		return nil, err
	}
	src = src.Masked()
	hostBits := 32 - src.Bits()
	g := &spoofGen{
		payload:  newPacketGen(kind, seed),
		rng:      rand.NewPCG(seed^0x5bd1e9955bd1e995, seed),
		srcBase:  binary.BigEndian.Uint32(src.Addr().AsSlice()),
		hostMask: uint32(uint64(1)<<hostBits - 1),
		dst:      dst.Addr().As4(),
		dstPort:  dst.Port(),
		seen:     make([]uint64, max(1, (uint64(1)<<hostBits)/64)),
	}
	for range floodBatch {
		buf := make([]byte, spoofHeaders+MaxDatagram)
		copy(buf[spoofHeaders:], g.payload.newBuffer())
		g.bufs = append(g.bufs, buf)
		g.tails = append(g.tails, sum16(0, buf[spoofHeaders+rewrittenPrefix:]))
	}
	return g, nil
}

// next writes the next datagram into buffer i and returns it.
func (g *spoofGen) next(i int) []byte {
	buf := g.bufs[i]
	p := g.payload.next(buf[spoofHeaders:])
	r := g.rng.Uint64()
	// Bits 0-23 pick the host (at most 24 bits: src is in a /8), 24-39
	// the IP ID, 40-63 the port.
	src := g.srcBase | uint32(r)&g.hostMask
	switch {
	case len(g.hosts) > 0 && g.cycle:
		src = g.hosts[g.turn]
		g.turn = (g.turn + 1) % len(g.hosts)
	case len(g.hosts) > 0:
		src = g.hosts[uint32(r)%uint32(len(g.hosts))]
	case g.hasExcept && src == g.except:
		src = g.srcBase | (src+1)&g.hostMask
	}
	id := uint16(r >> 24)
	sport := uint16(spoofPortMin + (r>>40)%spoofPortCount)
	g.mark(src)

	var payloadSum uint64
	if len(p) == MaxDatagram {
		payloadSum = sum16(g.tails[i], p[:rewrittenPrefix])
	} else {
		payloadSum = sum16(0, p)
	}
	return writeHeaders(buf, src, g.dst, sport, g.dstPort, id, len(p), payloadSum)
}

// narrow makes every datagram come from one of hosts, picked at random; it
// refuses a host outside the generator's source range.
func (g *spoofGen) narrow(hosts []netip.Addr) error {
	g.hosts = g.hosts[:0]
	for _, h := range hosts {
		if !h.Is4() {
			return fmt.Errorf("spoofed source %v is not IPv4", h)
		}
		a := binary.BigEndian.Uint32(h.AsSlice())
		if a&^g.hostMask != g.srcBase {
			return fmt.Errorf("spoofed source %v is outside the flood's range", h)
		}
		g.hosts = append(g.hosts, a)
	}
	return nil
}

// exclude makes the generator never send from a, an address of its source
// range, when it picks sources at random; it refuses an address outside the
// range, or a range of one address.
func (g *spoofGen) exclude(a netip.Addr) error {
	if !a.Is4() {
		return fmt.Errorf("excluded source %v is not IPv4", a)
	}
	x := binary.BigEndian.Uint32(a.AsSlice())
	if x&^g.hostMask != g.srcBase || g.hostMask == 0 {
		return fmt.Errorf("excluded source %v is outside the flood's range, or its only address", a)
	}
	g.except, g.hasExcept = x, true
	return nil
}

// mark records src as sent.
func (g *spoofGen) mark(src uint32) {
	h := src & g.hostMask
	w, bit := h/64, uint64(1)<<(h%64)
	if g.seen[w]&bit == 0 {
		g.seen[w] |= bit
		g.distinct++
	}
}

// writeHeaders writes the IPv4 and UDP headers of a datagram whose payload
// of n bytes is at buf[spoofHeaders:] and sums (unfolded) to payloadSum, and
// returns the datagram.
func writeHeaders(buf []byte, src uint32, dst [4]byte, sport, dport, id uint16, n int, payloadSum uint64) []byte {
	total := spoofHeaders + n
	udpLen := uint16(udpHeaderLen + n)
	ip := buf[:ipv4HeaderLen]
	ip[ipOffVersionIHL] = ipVersion4NoOptions
	ip[ipOffVersionIHL+1] = 0 // DSCP and ECN
	binary.BigEndian.PutUint16(ip[ipOffTotalLen:], uint16(total))
	binary.BigEndian.PutUint16(ip[ipOffID:], id)
	binary.BigEndian.PutUint16(ip[ipOffFlags:], ipFlagDontFragment)
	ip[ipOffTTL] = ipTTL
	ip[ipOffProtocol] = ipProtoUDP
	binary.BigEndian.PutUint16(ip[ipOffChecksum:], 0)
	binary.BigEndian.PutUint32(ip[ipOffSrc:], src)
	copy(ip[ipOffDst:], dst[:])
	binary.BigEndian.PutUint16(ip[ipOffChecksum:], ^fold(sum16(0, ip)))

	binary.BigEndian.PutUint16(buf[udpOffSrcPort:], sport)
	binary.BigEndian.PutUint16(buf[udpOffDstPort:], dport)
	binary.BigEndian.PutUint16(buf[udpOffLength:], udpLen)
	binary.BigEndian.PutUint16(buf[udpOffChecksum:], 0)
	// The pseudo-header (addresses, protocol, UDP length), the UDP
	// header and the payload.
	s := sum16(payloadSum, ip[ipOffSrc:ipOffDst+4])
	s += ipProtoUDP + uint64(udpLen)
	s = sum16(s, buf[ipv4HeaderLen:spoofHeaders])
	c := ^fold(s)
	if c == 0 {
		c = 0xffff // 0 means "no checksum" in UDP over IPv4
	}
	binary.BigEndian.PutUint16(buf[udpOffChecksum:], c)
	return buf[:total]
}

// sum16 adds the big-endian 16-bit words of b (an odd last byte padded with
// a zero) to s, unfolded: b starts on a word boundary. It adds 32-bit words,
// which fold to the same one's-complement sum, since 2^16 = 1 modulo 0xffff.
func sum16(s uint64, b []byte) uint64 {
	for len(b) >= 4 {
		s += uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	return s
}

// fold folds an unfolded sum into its 16-bit one's-complement sum.
func fold(s uint64) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// openRawSender returns a raw IPv4 socket connected to dst that sends
// datagrams with the IP header they carry, and its batch writer.
func openRawSender(dst netip.AddrPort) (net.Conn, batchWriter, error) {
	if !dst.Addr().Is4() || !loopbackV4().Contains(dst.Addr()) {
		return nil, nil, fmt.Errorf("spoofed flood destination %v is outside %v", dst.Addr(), loopbackV4())
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, nil, fmt.Errorf("opening a raw socket (spoofed floods need root): %w", err)
	}
	f := os.NewFile(uintptr(fd), "raw")
	defer f.Close()
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
		return nil, nil, fmt.Errorf("connecting the raw socket to %v: %w", dst.Addr(), err)
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, nil, fmt.Errorf("raw socket to %v: %w", dst.Addr(), err)
	}
	ipc, ok := c.(*net.IPConn)
	if !ok {
		c.Close()
		return nil, nil, fmt.Errorf("raw socket to %v: a %T, not an IP connection", dst.Addr(), c)
	}
	return ipc, ipv4.NewPacketConn(ipc), nil
}
