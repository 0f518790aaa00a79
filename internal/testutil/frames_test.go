package testutil

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestFrameBytes: the headers of a Frame are where and what they say: the
// ethertype, the IP lengths (with options and extension headers chained by
// their next-header fields), a verifying IPv4 checksum, the UDP header, and
// the payload; a cut and a UDP length that disagrees with the IP length.
func TestFrameBytes(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8::7")
	d4, d6 := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")
	tests := []struct {
		name      string
		f         Frame
		wantLen   int
		etherType uint16
		udpAt     int // offset of the UDP header
	}{
		{"ipv4", Frame{Src: v4, Dst: d4, SrcPort: 50000, DstPort: 443, Payload: 32}, EthHdrLen + IPv4HdrLen + UDPHdrLen + 32,
			EtherTypeIPv4, UDPOffset(false)},
		{"ipv4 options", Frame{Src: v4, Dst: d4, SrcPort: 50000, DstPort: 443, Data: []byte("hello"), IPv4Options: 3},
			EthHdrLen + IPv4HdrLen + 12 + UDPHdrLen + 5, EtherTypeIPv4, UDPOffset(false) + 12},
		{"ipv6", Frame{Src: v6, Dst: d6, SrcPort: 50000, DstPort: 443, Payload: 1200}, EthHdrLen + IPv6HdrLen + UDPHdrLen + 1200,
			EtherTypeIPv6, UDPOffset(true)},
		{"ipv6 extensions", Frame{Src: v6, Dst: d6, SrcPort: 50000, DstPort: 443, Payload: 10,
			IPv6Ext: []IPv6Ext{{Kind: 0, Units: 1}, {Kind: protoFrag, FragOffset: 3}, {Kind: protoAH, Units: 2}}},
			EthHdrLen + IPv6HdrLen + 16 + 8 + 16 + UDPHdrLen + 10, EtherTypeIPv6, UDPOffset(true) + 40},
		{"udp length under the ip length", Frame{Src: v4, Dst: d4, SrcPort: 1, DstPort: 2, Payload: 100, UDPLen: 48, Trailer: 4},
			EthHdrLen + IPv4HdrLen + UDPHdrLen + 104, EtherTypeIPv4, UDPOffset(false)},
		{"cut", Frame{Src: v4, Dst: d4, SrcPort: 1, DstPort: 2, Payload: 100, Truncate: IPv4HdrLen + 3}, EthHdrLen + IPv4HdrLen + 3,
			EtherTypeIPv4, -1},
		{"not ip", Frame{Src: v4, Dst: d4, SrcPort: 1, DstPort: 2, EtherType: 0x88b5}, EthHdrLen + IPv4HdrLen + UDPHdrLen,
			0x88b5, UDPOffset(false)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.f.Bytes()
			if len(b) != tt.wantLen {
				t.Fatalf("%d bytes, want %d", len(b), tt.wantLen)
			}
			if et := binary.BigEndian.Uint16(b[12:]); et != tt.etherType {
				t.Errorf("ethertype %#x, want %#x", et, tt.etherType)
			}
			if tt.udpAt < 0 {
				return
			}
			ip := b[EthHdrLen:]
			if tt.f.Src.Is4() {
				hl := int(ip[0]&0x0f) * 4
				if ip[0]>>4 != 4 || EthHdrLen+hl != tt.udpAt || int(binary.BigEndian.Uint16(ip[2:])) != len(ip) || ip[9] != ProtoUDP {
					t.Errorf("IPv4 header %x: want a header of %d bytes, total length %d, UDP", ip[:hl], tt.udpAt-EthHdrLen, len(ip))
				}
				if IPv4Checksum(ip[:hl]) != 0 {
					t.Errorf("IPv4 header checksum does not verify")
				}
			} else {
				next, at := ip[6], IPv6HdrLen
				for _, e := range tt.f.IPv6Ext {
					if next != e.Kind {
						t.Fatalf("next header %d at %d, want %d", next, at, e.Kind)
					}
					next = ip[at]
					switch e.Kind {
					case protoFrag:
						if off := binary.BigEndian.Uint16(ip[at+2:]) >> 3; off != e.FragOffset {
							t.Errorf("fragment offset %d, want %d", off, e.FragOffset)
						}
						at += 8
					case protoAH:
						at += (int(ip[at+1]) + 2) * 4
					default:
						at += (int(ip[at+1]) + 1) * 8
					}
				}
				if next != ProtoUDP || EthHdrLen+at != tt.udpAt || int(binary.BigEndian.Uint16(ip[4:])) != len(ip)-IPv6HdrLen {
					t.Errorf("IPv6: next header %d, UDP at %d (want %d), payload length %d of %d", next, EthHdrLen+at, tt.udpAt,
						binary.BigEndian.Uint16(ip[4:]), len(ip)-IPv6HdrLen)
				}
			}
			udp := b[tt.udpAt:]
			wantUDPLen := len(udp) - tt.f.Trailer
			if tt.f.UDPLen != 0 {
				wantUDPLen = tt.f.UDPLen
			}
			if sp, dp, l := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:]), binary.BigEndian.Uint16(udp[4:]); sp != tt.f.SrcPort ||
				dp != tt.f.DstPort || int(l) != wantUDPLen {
				t.Errorf("UDP %d -> %d, length %d; want %d -> %d, %d", sp, dp, l, tt.f.SrcPort, tt.f.DstPort, wantUDPLen)
			}
			if payload := udp[UDPHdrLen : len(udp)-tt.f.Trailer]; !bytes.Equal(payload, tt.f.PayloadBytes()) {
				t.Errorf("payload %x, want %x", payload, tt.f.PayloadBytes())
			}
		})
	}
}

// TestFrameDatagram: what a filter should read of a frame is its payload cut
// to the UDP length, with its key, or no ports when the header is unread.
func TestFrameDatagram(t *testing.T) {
	f := Frame{Src: netip.MustParseAddr("2001:db8::7"), Dst: netip.MustParseAddr("2001:db8::1"), SrcPort: 50000, DstPort: 443,
		Payload: 100, UDPLen: UDPHdrLen + 40, Trailer: 8}
	d := f.Datagram(true)
	if d.Length != 40 || !bytes.Equal(d.Probe, f.PayloadBytes()[:40]) || !d.Key.HasPorts || d.Key.SrcPort != 50000 || d.Key.DstPort != 443 {
		t.Errorf("Datagram(true) = length %d, key %+v", d.Length, d.Key)
	}
	if d := f.Datagram(false); d.Length != 0 || d.Probe != nil || d.Key.HasPorts || d.Key.SrcPort != 0 {
		t.Errorf("Datagram(false) = length %d, key %+v", d.Length, d.Key)
	}
}
