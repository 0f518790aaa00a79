//go:build linux

package bench

import (
	"bytes"
	"encoding/binary"
	"testing"
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
	for _, kind := range []PacketKind{PacketInitial, PacketInvalid, PacketShort, PacketLongMin, PacketShortSmall} {
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
