package testutil

import (
	"encoding/binary"
	"net/netip"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Header lengths of the frames Frame builds. BPF_PROG_TEST_RUN takes a
// frame with an Ethernet header, which it strips, so that a socket filter
// sees skb->data at the IP header.
const (
	EthHdrLen  = 14
	IPv4HdrLen = 20
	IPv6HdrLen = 40
	UDPHdrLen  = 8
)

// Field values of the frames, numbered as in the kernel's headers (which
// golang.org/x/sys/unix has on Linux only): the ethertypes of IPv4 and
// IPv6, and UDP's protocol number.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86dd
	ProtoUDP      = 17
)

// The IPv6 extension headers Bytes lays out differently, and the hop limit
// of every frame.
const (
	protoFrag = 44
	protoAH   = 51
	frameTTL  = 64
)

// Frame describes an Ethernet frame carrying a UDP datagram over IPv4 or
// IPv6 (the family of Src; Dst must be of the same), and the ways a test
// bends one: IP options and extension headers, fragments, another
// transport, lengths that disagree, a cut. Its addresses are never sent
// anywhere: Bytes is for BPF_PROG_TEST_RUN.
type Frame struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	// Data is the UDP payload; when nil, Payload bytes of a fixed
	// pattern.
	Data    []byte
	Payload int
	// IPv4Options adds this many 4-byte words of IPv4 options (NOPs).
	IPv4Options int
	// IPv4FragOffset sets the IPv4 fragment offset (in 8-byte units).
	IPv4FragOffset uint16
	// IPv6Ext lists IPv6 extension headers to insert before UDP.
	IPv6Ext []IPv6Ext
	// Proto overrides the transport protocol (default UDP).
	Proto uint8
	// EtherType overrides the frame's ethertype.
	EtherType uint16
	// Truncate cuts the frame to this many bytes after the Ethernet
	// header.
	Truncate int
	// UDPLen, when set, replaces the UDP header's length field, and
	// Trailer adds this many bytes after the UDP datagram within the IP
	// datagram: a socket receives the UDP length's worth of payload.
	UDPLen  int
	Trailer int
}

// IPv6Ext is an IPv6 extension header of a Frame.
type IPv6Ext struct {
	// Kind is the header's protocol number: hop-by-hop options (0),
	// routing (43), fragment (44), AH (51) or destination options (60),
	// unix.IPPROTO_HOPOPTS and so on.
	Kind uint8
	// Units is the header's length field (0 for a fragment header).
	Units int
	// FragOffset is a fragment header's offset, in 8-byte units.
	FragOffset uint16
}

// Bytes builds the Ethernet frame of f. The IPv4 header checksum is filled
// in (over the options too); the UDP checksum is 0 (none), which a socket
// filter never reads.
func (f Frame) Bytes() []byte {
	proto := f.Proto
	if proto == 0 {
		proto = ProtoUDP
	}
	l4 := make([]byte, UDPHdrLen, UDPHdrLen+f.Payload)
	l4 = append(l4, f.PayloadBytes()...)
	binary.BigEndian.PutUint16(l4[0:], f.SrcPort)
	binary.BigEndian.PutUint16(l4[2:], f.DstPort)
	binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	if f.UDPLen > 0 {
		binary.BigEndian.PutUint16(l4[4:], uint16(f.UDPLen))
	}
	l4 = append(l4, make([]byte, f.Trailer)...)
	var ip []byte
	etherType := uint16(EtherTypeIPv4)
	if f.Src.Is4() {
		hl := IPv4HdrLen + 4*f.IPv4Options
		ip = make([]byte, hl)
		ip[0] = 0x40 | byte(hl/4)
		binary.BigEndian.PutUint16(ip[2:], uint16(hl+len(l4)))
		binary.BigEndian.PutUint16(ip[6:], f.IPv4FragOffset)
		ip[8] = frameTTL
		ip[9] = proto
		s, d := f.Src.As4(), f.Dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		for i := IPv4HdrLen; i < hl; i++ {
			ip[i] = 1 // NOP options
		}
		binary.BigEndian.PutUint16(ip[10:], IPv4Checksum(ip))
	} else {
		etherType = EtherTypeIPv6
		ip = make([]byte, IPv6HdrLen)
		ip[0] = 0x60
		s, d := f.Src.As16(), f.Dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		ip[7] = frameTTL
		next := &ip[6]
		for _, e := range f.IPv6Ext {
			*next = e.Kind
			var h []byte
			switch e.Kind {
			case protoFrag:
				h = make([]byte, 8)
				binary.BigEndian.PutUint16(h[2:], e.FragOffset<<3)
			case protoAH:
				h = make([]byte, (e.Units+2)*4)
			default:
				h = make([]byte, (e.Units+1)*8)
			}
			h[1] = byte(e.Units)
			if e.Kind == protoFrag {
				h[1] = 0
			}
			ip = append(ip, h...)
			next = &ip[len(ip)-len(h)]
		}
		*next = proto
		binary.BigEndian.PutUint16(ip[4:], uint16(len(ip)-IPv6HdrLen+len(l4)))
	}
	if f.EtherType != 0 {
		etherType = f.EtherType
	}
	b := make([]byte, EthHdrLen, EthHdrLen+len(ip)+len(l4))
	copy(b[0:], []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(b[12:], etherType)
	b = append(b, ip...)
	b = append(b, l4...)
	if f.Truncate > 0 {
		b = b[:EthHdrLen+f.Truncate]
	}
	return b
}

// PayloadBytes is f's UDP payload: Data, or Payload bytes of a fixed
// pattern.
func (f Frame) PayloadBytes() []byte {
	if f.Data != nil {
		return f.Data
	}
	b := make([]byte, f.Payload)
	for i := range b {
		b[i] = byte((i + UDPHdrLen) * 31)
	}
	return b
}

// Datagram is what a filter should read of f: the key (hasPorts says
// whether the UDP header is readable), the payload's length and the
// payload, cut to the UDP length a socket receives (a filter reads its
// probe, and with connection ID verification the length fields wherever
// they are).
func (f Frame) Datagram(hasPorts bool) decide.Datagram {
	d := decide.Datagram{Key: f.Key(hasPorts)}
	if hasPorts {
		b := f.PayloadBytes()
		if f.UDPLen > 0 {
			b = b[:min(len(b), max(f.UDPLen-UDPHdrLen, 0))]
		}
		d.Length, d.Probe = len(b), b
	}
	return d
}

// Key is the limiter's key of f; without hasPorts, that of a datagram whose
// UDP header a filter could not read.
func (f Frame) Key(hasPorts bool) sketch.Key {
	k := sketch.KeyFrom(netip.AddrPortFrom(f.Src, f.SrcPort), f.DstPort)
	if !hasPorts {
		k.HasPorts, k.SrcPort, k.DstPort = false, 0, 0
	}
	return k
}

// UDPOffset is where the UDP header of a Frame from Src without IPv4
// options or IPv6 extension headers starts: IPv6 with ipv6, else IPv4.
func UDPOffset(ipv6 bool) int {
	if ipv6 {
		return EthHdrLen + IPv6HdrLen
	}
	return EthHdrLen + IPv4HdrLen
}

// IPv4Checksum is the Internet checksum of an IPv4 header h: with h's
// checksum field zero, the value to put there; over a header with its
// checksum filled in, 0 when it verifies.
func IPv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
