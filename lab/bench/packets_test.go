//go:build linux

package bench

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// longHeaderOf reads what a QUIC server looks at first in a long header.
type longHeaderOf struct {
	form, fixed bool
	typ         byte
	version     uint32
	dcidLen     int
}

func parseLong(p []byte) longHeaderOf {
	return longHeaderOf{form: p[0]&0x80 != 0, fixed: p[0]&0x40 != 0, typ: p[0] >> 4 & 3,
		version: binary.BigEndian.Uint32(p[1:5]), dcidLen: int(p[5])}
}

func TestInitialPackets(t *testing.T) {
	g := newPacketGen(PacketInitial, 1)
	buf := g.newBuffer()
	var prevDCID []byte
	for i := range 100 {
		p := g.next(buf)
		h := parseLong(p)
		if len(p) != MaxDatagram || !h.form || !h.fixed || h.typ != 0 || h.version != 1 || h.dcidLen != 8 || p[offSCIDLen] != 8 || p[offToken] != 0 {
			t.Fatalf("packet %d: %d bytes, header %+v", i, len(p), h)
		}
		if n := int(binary.BigEndian.Uint16(p[offLength:]) & 0x3fff); n != len(p)-longHeader {
			t.Fatalf("packet %d: length field %d, want %d", i, n, len(p)-longHeader)
		}
		dcid := p[offDCID : offDCID+8]
		if bytes.Equal(dcid, prevDCID) {
			t.Fatalf("packet %d repeats the connection ID", i)
		}
		prevDCID = bytes.Clone(dcid)
	}
}

func TestInvalidPackets(t *testing.T) {
	g := newPacketGen(PacketInvalid, 2)
	buf := g.newBuffer()
	seen := map[string]int{}
	for i := range 400 {
		p := g.next(buf)
		h := parseLong(p)
		switch {
		case h.version == unknownVersion && len(p) == MaxDatagram && h.fixed && h.dcidLen == 8:
			seen["unknown version"]++
		case h.version == 1 && len(p) < 1200 && len(p) >= 200 && h.fixed && h.typ == 0 && h.dcidLen == 8:
			seen["short Initial"]++
		case h.version == 1 && !h.fixed && h.form && len(p) == MaxDatagram && h.dcidLen == 8:
			seen["fixed bit 0"]++
		case h.version == 1 && h.fixed && h.dcidLen > 20 && len(p) == MaxDatagram:
			seen["long CID"]++
		default:
			t.Fatalf("packet %d (%d bytes) is none of the invalid kinds: %+v", i, len(p), h)
		}
	}
	for _, k := range []string{"unknown version", "short Initial", "fixed bit 0", "long CID"} {
		if seen[k] != 100 {
			t.Errorf("%s: %d of 400, want 100", k, seen[k])
		}
	}
}

func TestShortHeaderPackets(t *testing.T) {
	g := newPacketGen(PacketShort, 3)
	buf := g.newBuffer()
	first := bytes.Clone(g.next(buf)[1:9])
	for i := range 50 {
		p := g.next(buf)
		if len(p) != MaxDatagram || p[0]&0x80 != 0 || p[0]&0x40 == 0 {
			t.Fatalf("packet %d: %d bytes, first byte %#x", i, len(p), p[0])
		}
		if bytes.Equal(p[1:9], first) {
			t.Fatalf("packet %d repeats the connection ID", i)
		}
	}
}

func TestSmallPackets(t *testing.T) {
	long := newPacketGen(PacketLongMin, 4)
	buf := long.newBuffer()
	for i := range 10 {
		if p := long.next(buf); !bytes.Equal(p, []byte{0xe0, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00}) {
			t.Fatalf("minimal long header %d: % x", i, p)
		}
	}
	short := newPacketGen(PacketShortSmall, 5)
	buf = short.newBuffer()
	sizes, firsts := map[int]bool{}, map[byte]bool{}
	var prevCID []byte
	for i := range 2000 {
		p := short.next(buf)
		if len(p) < 60 || len(p) > 100 || p[0] < 0x40 || p[0] > 0x7f {
			t.Fatalf("short junk %d: %d bytes, first byte %#x", i, len(p), p[0])
		}
		if bytes.Equal(p[1:17], prevCID) {
			t.Fatalf("short junk %d repeats its first 16 bytes", i)
		}
		prevCID = bytes.Clone(p[1:17])
		sizes[len(p)], firsts[p[0]] = true, true
	}
	if len(sizes) != 41 || len(firsts) != 64 {
		t.Errorf("%d sizes (want 60 to 100: 41), %d first bytes (want 64)", len(sizes), len(firsts))
	}
}

// TestRewrittenPrefix: no kind writes past rewrittenPrefix, which the
// spoofed flood's checksum relies on.
func TestRewrittenPrefix(t *testing.T) {
	for _, kind := range []PacketKind{PacketInitial, PacketInvalid, PacketShort, PacketLongMin, PacketShortSmall,
		PacketIDShort, PacketIDLong, PacketReuse} {
		g := newPacketGen(kind, 6)
		buf := g.newBuffer()
		tail := bytes.Clone(buf[rewrittenPrefix:])
		for range 400 {
			g.next(buf)
		}
		if !bytes.Equal(buf[rewrittenPrefix:], tail) {
			t.Errorf("%s rewrites bytes past %d", kind, rewrittenPrefix)
		}
	}
}

// TestAttackPackets: the attack kinds are what the filter's classifier
// (quicclass.Inspect, with verification) takes for valid short headers,
// Initials and Handshakes, carrying the server ID or a random one, in the
// sizes and proportions documented.
func TestAttackPackets(t *testing.T) {
	id := [quicclass.ServerIDLen]byte{0xa1, 0xb2, 0xc3, 0xd4}
	type sub struct {
		check    quicclass.Check
		min, max int
		ownID    bool // the ID is id, not a random one
	}
	short, shortID := sub{quicclass.CheckShort, 50, 1200, false}, sub{quicclass.CheckShort, 50, 1200, true}
	initial, initialID := sub{quicclass.CheckOpening, 1200, 1200, false}, sub{quicclass.CheckOpening, 1200, 1200, true}
	handshake, handshakeID := sub{quicclass.CheckHandshake, 60, 1200, false}, sub{quicclass.CheckHandshake, 60, 1200, true}
	for _, tt := range []struct {
		kind PacketKind
		want map[sub]int // of 2000
	}{
		{PacketIDShort, map[sub]int{shortID: 2000}},
		{PacketIDLong, map[sub]int{initialID: 1000, handshakeID: 1000}},
		{PacketReuse, map[sub]int{short: 1000, handshake: 1000}},
		{PacketGuess, map[sub]int{short: 667, handshake: 667, initial: 666}},
	} {
		t.Run(string(tt.kind), func(t *testing.T) {
			g := newPacketGen(tt.kind, 8)
			g.serverID = id
			buf := g.newBuffer()
			got := map[sub]int{}
			sizes := map[sub][2]int{}
			ids := map[[quicclass.ServerIDLen]byte]bool{}
			for i := range 2000 {
				p := g.next(buf)
				h := quicclass.Inspect(nil, 4433, p, len(p), true)
				if h.Reason != quicclass.NotInvalid || !h.HasID {
					t.Fatalf("datagram %d (%d bytes, % x...): %+v", i, len(p), p[:8], h)
				}
				var s sub
				for w := range tt.want {
					if w.check == h.Check && w.ownID == (h.ID == id) {
						s = w
					}
				}
				if s.check == quicclass.CheckNone || len(p) < s.min || len(p) > s.max {
					t.Fatalf("datagram %d: %d bytes, %+v: none of %v", i, len(p), h, tt.want)
				}
				if h.Check != quicclass.CheckShort && int(p[5]) != quicclass.ServerIDLen {
					t.Fatalf("datagram %d: destination ID of %d bytes", i, p[5])
				}
				got[s]++
				r, ok := sizes[s]
				if !ok {
					r = [2]int{len(p), len(p)}
				}
				sizes[s] = [2]int{min(r[0], len(p)), max(r[1], len(p))}
				ids[h.ID] = true
			}
			for s, n := range tt.want {
				if got[s] != n {
					t.Errorf("%+v: %d of 2000, want %d", s, got[s], n)
				}
				// 1000 draws from sizes of 50 to 1200: near both ends.
				if r := sizes[s]; s.min < s.max && (r[0] > s.min+20 || r[1] < s.max-20) {
					t.Errorf("%+v: sizes %d to %d", s, r[0], r[1])
				}
			}
			if random := got[short] + got[handshake] + got[initial]; random > 0 && len(ids) < random-5 {
				t.Errorf("%d random IDs in %d datagrams", len(ids), random)
			}
		})
	}
}

// TestShortInitialPackets: PacketShortInitial is, in turn, a short header
// with a random ID and PacketInitial's Initial-like datagram, both valid
// to the classifier.
func TestShortInitialPackets(t *testing.T) {
	g := newPacketGen(PacketShortInitial, 4)
	buf := g.newBuffer()
	ids := map[[quicclass.ServerIDLen]byte]bool{}
	for i := range 1000 {
		p := g.next(buf)
		h := quicclass.Inspect(nil, 4433, p, len(p), true)
		if h.Reason != quicclass.NotInvalid {
			t.Fatalf("datagram %d (%d bytes): %+v", i, len(p), h)
		}
		if i%2 == 0 {
			if h.Check != quicclass.CheckShort || len(p) < attackShortMin || len(p) > MaxDatagram {
				t.Fatalf("datagram %d: %d bytes, %+v, want a short header", i, len(p), h)
			}
			ids[h.ID] = true
			continue
		}
		if l := parseLong(p); h.Check != quicclass.CheckOpening || len(p) != MaxDatagram || l.typ != 0 || l.dcidLen != 8 {
			t.Fatalf("datagram %d: %d bytes, %+v, want an Initial", i, len(p), l)
		}
	}
	if len(ids) < 495 {
		t.Errorf("%d random IDs in 500 short headers", len(ids))
	}
}
