//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// refSum is a plain one's-complement sum of 16-bit words, independent of
// sum16: the reference the checksums are checked against.
func refSum(parts ...[]byte) uint16 {
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var s uint32
	for i := 0; i < len(all); i += 2 {
		s += uint32(all[i])<<8 | uint32(all[i+1])
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// spoofedDatagram is what a receiver reads in a spoofed datagram.
type spoofedDatagram struct {
	src, dst       netip.Addr
	sport, dport   uint16
	payload        []byte
	ipOK, udpOK    bool
	ttl, proto     byte
	flags, version uint16
}

func parseSpoofed(t *testing.T, p []byte) spoofedDatagram {
	t.Helper()
	if len(p) < spoofHeaders {
		t.Fatalf("datagram of %d bytes", len(p))
	}
	if n := int(binary.BigEndian.Uint16(p[2:])); n != len(p) {
		t.Fatalf("IP total length %d, datagram %d bytes", n, len(p))
	}
	udpLen := int(binary.BigEndian.Uint16(p[24:]))
	if udpLen != len(p)-20 {
		t.Fatalf("UDP length %d, want %d", udpLen, len(p)-20)
	}
	pseudo := append(append([]byte{}, p[12:20]...), 0, 17, byte(udpLen>>8), byte(udpLen))
	return spoofedDatagram{
		src: netip.AddrFrom4([4]byte(p[12:16])), dst: netip.AddrFrom4([4]byte(p[16:20])),
		sport: binary.BigEndian.Uint16(p[20:]), dport: binary.BigEndian.Uint16(p[22:]),
		payload: p[28:], ipOK: refSum(p[:20]) == 0xffff,
		udpOK: binary.BigEndian.Uint16(p[26:]) != 0 && refSum(pseudo, p[20:]) == 0xffff,
		ttl:   p[8], proto: p[9], flags: binary.BigEndian.Uint16(p[6:]), version: uint16(p[0]),
	}
}

// checkPayload fails unless p is a datagram of kind.
func checkPayload(t *testing.T, kind PacketKind, p []byte) {
	t.Helper()
	switch kind {
	case PacketInitial:
		h := parseLong(p)
		if len(p) != MaxDatagram || !h.form || !h.fixed || h.typ != 0 || h.version != 1 || h.dcidLen != 8 {
			t.Fatalf("Initial of %d bytes, header %+v", len(p), h)
		}
	case PacketLongMin:
		if !bytes.Equal(p, []byte{0xe0, 0, 0, 0, 1, 0, 0}) {
			t.Fatalf("minimal long header % x", p)
		}
	case PacketShortSmall:
		if len(p) < 60 || len(p) > 100 || p[0]&0xc0 != 0x40 {
			t.Fatalf("short-header junk of %d bytes, first byte %#x", len(p), p[0])
		}
	default:
		t.Fatalf("kind %s not checked", kind)
	}
}

func TestSum16(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want uint16
	}{
		{[]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0xddf2}, // RFC 1071's example
		{[]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6}, 0xdcfb},       // odd: the last byte padded
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0xffff},
		{[]byte{0x12}, 0x1200},
		{nil, 0},
	} {
		if got := fold(sum16(0, tc.b)); got != tc.want || got != refSum(tc.b) {
			t.Errorf("sum of % x = %#04x, want %#04x (reference %#04x)", tc.b, got, tc.want, refSum(tc.b))
		}
	}
}

func TestSpoofedDatagrams(t *testing.T) {
	dst := netip.MustParseAddrPort("127.0.0.1:4433")
	for _, kind := range []PacketKind{PacketInitial, PacketLongMin, PacketShortSmall} {
		t.Run(string(kind), func(t *testing.T) {
			g, err := newSpoofGen(kind, spoofedNet, dst, 7)
			if err != nil {
				t.Fatal(err)
			}
			const n = 4000 // every buffer reused many times
			sources := map[netip.Addr]bool{}
			nets := map[netip.Prefix]bool{}
			ports := map[uint16]bool{}
			var prev netip.Addr
			for i := range n {
				d := parseSpoofed(t, g.next(i%floodBatch))
				if d.version != 0x45 || d.proto != 17 || d.ttl != 64 || d.flags != 0x4000 || !d.ipOK {
					t.Fatalf("datagram %d: IP header %+v", i, d)
				}
				if !d.udpOK {
					t.Fatalf("datagram %d: bad UDP checksum", i)
				}
				if !spoofedNet.Contains(d.src) || d.dst != dst.Addr() || d.dport != dst.Port() || d.sport < 1024 {
					t.Fatalf("datagram %d: %v:%d -> %v:%d", i, d.src, d.sport, d.dst, d.dport)
				}
				if d.src == prev {
					t.Fatalf("datagram %d repeats the source %v", i, d.src)
				}
				checkPayload(t, kind, d.payload)
				prev = d.src
				sources[d.src] = true
				nets[netip.PrefixFrom(d.src, 24).Masked()] = true
				ports[d.sport] = true
			}
			// 4000 draws from 2^23 addresses, 32,768 /24s, 64,512 ports:
			// a few repeats at most, some hundred ports.
			if len(sources) < n-10 || len(nets) < n-400 || len(ports) < n-300 {
				t.Errorf("%d sources in %d /24s on %d ports, from %d datagrams", len(sources), len(nets), len(ports), n)
			}
			if g.distinct != len(sources) {
				t.Errorf("generator counted %d sources, %d seen", g.distinct, len(sources))
			}
		})
	}
}

func TestSpoofedRefusals(t *testing.T) {
	lo := netip.MustParseAddrPort("127.0.0.1:443")
	for _, tc := range []struct {
		src  netip.Prefix
		dst  netip.AddrPort
		want string
	}{
		{netip.MustParsePrefix("10.0.0.0/8"), lo, "spoofed source range 10.0.0.0/8 is outside 127.0.0.0/8"},
		{netip.MustParsePrefix("192.0.2.0/24"), lo, "spoofed source range 192.0.2.0/24 is outside 127.0.0.0/8"},
		{netip.MustParsePrefix("127.0.0.0/7"), lo, "spoofed source range 127.0.0.0/7 is outside 127.0.0.0/8"},
		{netip.MustParsePrefix("::1/128"), lo, "spoofed source range ::1/128 is outside 127.0.0.0/8"},
		{netip.Prefix{}, lo, "spoofed source range invalid Prefix is outside 127.0.0.0/8"},
		{spoofedNet, netip.MustParseAddrPort("192.0.2.1:443"), "spoofed flood destination 192.0.2.1 is outside 127.0.0.0/8"},
		{spoofedNet, netip.MustParseAddrPort("[::1]:443"), "spoofed flood destination ::1 is outside 127.0.0.0/8"},
		{spoofedNet, netip.MustParseAddrPort("128.0.0.1:443"), "spoofed flood destination 128.0.0.1 is outside 127.0.0.0/8"},
	} {
		if _, err := newSpoofGen(PacketInitial, tc.src, tc.dst, 1); err == nil || err.Error() != tc.want {
			t.Errorf("%v -> %v: err = %v, want %s", tc.src, tc.dst, err, tc.want)
		}
	}
	if _, _, err := openRawSender(netip.MustParseAddrPort("192.0.2.1:443")); err == nil || !strings.Contains(err.Error(), "is outside 127.0.0.0/8") {
		t.Errorf("raw sender to 192.0.2.1: err = %v", err)
	}
	if _, err := openFlood(&FloodSpec{Spoofed: netip.MustParsePrefix("10.0.0.0/8"), Kind: PacketInitial}, 443); err == nil ||
		err.Error() != "spoofed source range 10.0.0.0/8 is outside 127.0.0.0/8" {
		t.Errorf("flood spoofed from 10.0.0.0/8: err = %v", err)
	}
}

// TestSpoofedFloodOnLoopback sends 1,000 spoofed datagrams of each kind to a
// UDP socket on 127.0.0.1: the kernel delivers every one (it would drop a
// bad UDP checksum), from sources that vary and stay in 127.128.0.0/9.
func TestSpoofedFloodOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		kind     PacketKind
		min, max int
	}{
		{PacketInitial, MaxDatagram, MaxDatagram},
		{PacketLongMin, 7, 7},
		{PacketShortSmall, 60, 100},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			s := newSink(t, 0)
			f, err := openFlood(&FloodSpec{Spoofed: spoofedNet, Kind: tc.kind}, s.port())
			if err != nil {
				t.Fatal(err)
			}
			const n = 1000
			res := f.run(context.Background(), 5*time.Second, n, 3)
			f.finish(&res, 0)
			if res.Sent != n || !res.CountBound || res.SendErrors != 0 || res.Sockets != 1 || res.Spoofed != "127.128.0.0/9" || res.Addresses < n-5 {
				t.Fatalf("flood %+v; want %d datagrams from as many sources", res, n)
			}
			s.waitFor(n)
			from, sizes := s.received()
			if len(from) != n {
				t.Fatalf("received %d of %d", len(from), n)
			}
			sources, ports := map[netip.Addr]bool{}, map[uint16]bool{}
			var payload uint64
			for i, a := range from {
				if !spoofedNet.Contains(a.Addr()) || a.Port() < 1024 || sizes[i] < tc.min || sizes[i] > tc.max {
					t.Fatalf("datagram %d: %d bytes from %v", i, sizes[i], a)
				}
				sources[a.Addr()] = true
				ports[a.Port()] = true
				payload += uint64(sizes[i])
			}
			if len(sources) < n-5 || len(ports) < n-50 {
				t.Errorf("%d sources on %d ports from %d datagrams", len(sources), len(ports), n)
			}
			if res.Bytes != payload {
				t.Errorf("flood counted %d payload bytes, %d arrived", res.Bytes, payload)
			}
		})
	}
}
