//go:build linux

package kernel

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestClassifyFrames runs one datagram of every kind, from IPv4 and IPv6,
// with and without IPv6 extension headers, through the program and the Go
// classifier, and checks the class both give against the expected one.
func TestClassifyFrames(t *testing.T) {
	tests := []struct {
		name   string
		sport  uint16
		data   []byte
		class  quicclass.Class
		reason quicclass.Reason
	}{
		{"initial", 50000, quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200), quicclass.Opening, 0},
		{"v2 initial", 50000, quicclasstest.LongHeader(quicclass.Version2, 1, 8, 8, 1252), quicclass.Opening, 0},
		{"handshake", 50000, quicclasstest.LongHeader(quicclass.Version1, 2, 4, 8, 90), quicclass.Opening, 0},
		{"short header", 50000, quicclasstest.ShortHeader(1200), quicclass.Established, 0},
		{"ack", 50000, quicclasstest.ShortHeader(25), quicclass.Established, 0},
		{"unknown version", 50000, quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200), quicclass.Negotiation, 0},
		{"empty", 50000, []byte{}, quicclass.Invalid, quicclass.Empty},
		{"from port 53", 53, quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200), quicclass.Invalid, quicclass.SourcePort},
		{"not quic", 50000, make([]byte, 64), quicclass.Invalid, quicclass.FixedBit},
		{"small initial", 50000, quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1199), quicclass.Invalid, quicclass.SmallInitial},
		{"long connection id", 50000, quicclasstest.LongHeader(quicclass.Version1, 0, 21, 8, 1200), quicclass.Invalid, quicclass.ConnectionIDLength},
		{"retry", 50000, quicclasstest.LongHeader(quicclass.Version1, 3, 8, 8, 100), quicclass.Invalid, quicclass.ServerOnly},
		{"version negotiation", 50000, quicclasstest.LongHeader(0, 0, 8, 8, 100), quicclass.Invalid, quicclass.ServerOnly},
		{"short header of 20 bytes", 50000, quicclasstest.ShortHeader(20), quicclass.Invalid, quicclass.Truncated},
		{"small unknown version", 50000, quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 400), quicclass.Invalid, quicclass.SmallUnknownVersion},
	}
	w := newTwin(t, testutil.QUICLimits(1000, 1000))
	now := start
	for _, src := range []string{"198.51.100.7", "2001:db8:1:2::7"} {
		for _, ext := range [][]testutil.IPv6Ext{nil, {{Kind: unix.IPPROTO_HOPOPTS}, {Kind: unix.IPPROTO_DSTOPTS, Units: 2}}} {
			if ext != nil && netip.MustParseAddr(src).Is4() {
				continue
			}
			for _, tt := range tests {
				t.Run(fmt.Sprintf("%s %d extensions %s", src, len(ext), tt.name), func(t *testing.T) {
					w.t = t
					p := udp(src, tt.sport)
					p.Data, p.IPv6Ext = tt.data, ext
					now += int64(time.Millisecond)
					out := w.step(p, p.Datagram(true), now, 0)
					if out.Class != tt.class || out.Reason != tt.reason {
						t.Fatalf("class %v/%v, want %v/%v", out.Class, out.Reason, tt.class, tt.reason)
					}
				})
			}
		}
	}
	// Behind more extension headers than the filter walks, the UDP header
	// is out of reach: invalid, as its own reason.
	p := udp("2001:db8:1:2::7", 50000)
	p.Data = quicclasstest.ShortHeader(100)
	for range decide.IPv6MaxExt + 1 {
		p.IPv6Ext = append(p.IPv6Ext, testutil.IPv6Ext{Kind: unix.IPPROTO_DSTOPTS})
	}
	w.t = t
	if out := w.step(p, p.Datagram(false), now+int64(time.Millisecond), 0); out.Reason != quicclass.Unparsed {
		t.Fatalf("behind %d extension headers: %+v, want invalid (unparsed)", len(p.IPv6Ext), out)
	}
	w.compareState()
}

// TestClassifyFramesVerify runs datagrams of every kind verification tells
// apart, to a learned server ID and another, from a learned peer and a
// stranger, from IPv4 and IPv6 with and without extension headers, through
// the program and the Go twin with VerifyIDs, and checks the class, reason
// and verification both give against the expected ones.
func TestClassifyFramesVerify(t *testing.T) {
	sid := decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	other := decide.ServerID{0x0a, 0x0b, 0x0c, 0x0d}
	cid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	v1, v2 := uint32(quicclass.Version1), uint32(quicclass.Version2)
	const (
		initial1, zeroRTT1, handshake1 = 0, 1, 2
		initial2, zeroRTT2, handshake2 = 1, 2, 3
	)
	tests := []struct {
		name     string
		peer     bool
		data     []byte
		class    quicclass.Class
		reason   quicclass.Reason
		verified quicclass.Verification
	}{
		// The server sent sid to the peers (true), which it answered
		// and which prove their addresses with this first datagram, a
		// long header to it; from a stranger (false) it verifies
		// nothing.
		{"v1 handshake to a server id, the proof", true, quicclasstest.LongPacket(v1, handshake1, sid[:], cid, nil, 90),
			quicclass.Established, 0, quicclass.OpeningByID},
		{"short to a server id", true, quicclasstest.ShortPacket(sid, 1200), quicclass.Established, 0, quicclass.ShortByID},
		{"short to a server id, from a stranger", false, quicclasstest.ShortPacket(sid, 1200), quicclass.Unverified, 0, 0},
		{"short from a peer", true, quicclasstest.ShortPacket(other, 40), quicclass.Established, 0, quicclass.ShortByPeer},
		{"short from a stranger", false, quicclasstest.ShortPacket(other, 40), quicclass.Unverified, 0, 0},
		{"short of 20 bytes", true, quicclasstest.ShortPacket(sid, 20), quicclass.Invalid, quicclass.Truncated, 0},
		{"v1 initial", false, quicclasstest.LongPacket(v1, initial1, cid, cid, nil, 1200), quicclass.Opening, 0, 0},
		{"v2 initial from a peer", true, quicclasstest.LongPacket(v2, initial2, cid, cid, nil, 1250), quicclass.Opening, 0, quicclass.OpeningFromPeer},
		{"v1 initial to a server id, with a token", true, quicclasstest.LongPacket(v1, initial1, sid[:], cid, make([]byte, 90), 1200),
			quicclass.Established, 0, quicclass.OpeningByID},
		{"v1 initial to a server id, from a stranger", false, quicclasstest.LongPacket(v1, initial1, sid[:], cid, make([]byte, 90), 1200),
			quicclass.Opening, 0, 0},
		{"v2 initial, a token past the probe", true, quicclasstest.LongPacket(v2, initial2, cid, cid, make([]byte, 700), 1300),
			quicclass.Opening, 0, quicclass.OpeningFromPeer},
		{"v1 initial, token past the end", false, func() []byte {
			b := quicclasstest.LongPacket(v1, initial1, cid, cid, nil, 1200)
			copy(b[7+16:], quicclasstest.AppendVarint(nil, 1190))
			return b
		}(), quicclass.Invalid, quicclass.Length, 0},
		{"v2 initial to a server id, length past the end", false, quicclasstest.LongPacket(v2, initial2, sid[:], cid, nil, 1300)[:1250],
			quicclass.Invalid, quicclass.Length, 0},
		{"v1 initial of 1250, length 1 past", false, func() []byte {
			b := quicclasstest.LongPacket(v1, initial1, cid, cid, nil, 1250)
			copy(b[7+16+1:], quicclasstest.AppendVarint(nil, 1250-(7+16+1+2)+1))
			return b
		}(), quicclass.Invalid, quicclass.Length, 0},
		{"v1 initial, zero length", true, quicclasstest.LongHeader(v1, initial1, 8, 8, 1200), quicclass.Invalid, quicclass.Length, 0},
		{"v1 0-rtt to a server id", true, quicclasstest.LongPacket(v1, zeroRTT1, sid[:], cid, nil, 300), quicclass.Established, 0, quicclass.OpeningByID},
		{"v2 0-rtt from a peer", true, quicclasstest.LongPacket(v2, zeroRTT2, cid, cid, nil, 300), quicclass.Opening, 0, quicclass.OpeningFromPeer},
		{"v1 handshake to a server id", true, quicclasstest.LongPacket(v1, handshake1, sid[:], cid, nil, 90), quicclass.Established, 0, quicclass.OpeningByID},
		{"v2 handshake to a server id", true, quicclasstest.LongPacket(v2, handshake2, sid[:], nil, nil, 1200), quicclass.Established, 0, quicclass.OpeningByID},
		{"v1 handshake to a server id, from a stranger", false, quicclasstest.LongPacket(v1, handshake1, sid[:], cid, nil, 90),
			quicclass.Invalid, quicclass.UnknownConnectionID, 0},
		{"v1 handshake to another id, from a peer", true, quicclasstest.LongPacket(v1, handshake1, other[:], cid, nil, 90),
			quicclass.Established, 0, quicclass.HandshakeFromPeer},
		{"v2 handshake to an 8-byte id", false, quicclasstest.LongPacket(v2, handshake2, cid, cid, nil, 90),
			quicclass.Invalid, quicclass.UnknownConnectionID, 0},
		{"7-byte handshake", false, []byte{0xe0, 0, 0, 0, 1, 0, 0}, quicclass.Invalid, quicclass.Length, 0},
		{"v1 handshake, length 19", false, func() []byte {
			b := quicclasstest.LongPacket(v1, handshake1, sid[:], nil, nil, 90)
			copy(b[7+4:], []byte{0x40, 19})
			return b
		}(), quicclass.Invalid, quicclass.Length, 0},
		{"v1 handshake, 8-byte length", true, func() []byte {
			b := quicclasstest.LongPacket(v1, handshake1, sid[:], nil, nil, 90)
			return append(append(b[:7+4], 0xc0, 0, 0, 0, 0, 0, 0, 30), make([]byte, 60)...)
		}(), quicclass.Established, 0, quicclass.OpeningByID},
		{"retry", true, quicclasstest.LongPacket(v1, 3, sid[:], cid, nil, 100), quicclass.Invalid, quicclass.ServerOnly, 0},
		{"unknown version", true, quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200), quicclass.Negotiation, 0, 0},
	}
	c := testutil.QUICLimits(1000, 1000)
	c.VerifyIDs = true
	w := newTwin(t, c)
	now := start
	sources := map[bool][]string{false: {"198.51.100.7", "2001:db8:1:2::7"}, true: {"203.0.113.7", "2001:db8:77::7"}}
	for _, src := range sources[true] {
		w.learnID(sid, netip.MustParseAddr(src), now)
		w.learnPeer(netip.MustParseAddr(src), now)
	}
	for fi := range 2 {
		for _, ext := range [][]testutil.IPv6Ext{nil, {{Kind: unix.IPPROTO_HOPOPTS}, {Kind: unix.IPPROTO_DSTOPTS, Units: 2}}} {
			if ext != nil && fi == 0 {
				continue
			}
			for _, tt := range tests {
				src := sources[tt.peer][fi]
				t.Run(fmt.Sprintf("%s %d extensions %s", src, len(ext), tt.name), func(t *testing.T) {
					w.t = t
					p := udp(src, 50000)
					p.Data, p.IPv6Ext = tt.data, ext
					now += int64(time.Millisecond)
					out := w.step(p, p.Datagram(true), now, 0)
					if out.Class != tt.class || out.Reason != tt.reason || out.Verified != tt.verified {
						t.Fatalf("class %v/%v/%v, want %v/%v/%v", out.Class, out.Reason, out.Verified, tt.class, tt.reason, tt.verified)
					}
				})
			}
		}
	}
	w.t = t
	w.compareState()
}

// TestAllowlistFamilies: an IPv6 prefix never allowlists an IPv4 source,
// however wide (::/0), on the program as in the Go twin.
func TestAllowlistFamilies(t *testing.T) {
	tests := []struct {
		allow, src string
		want       bool
	}{
		{"::/0", "198.51.100.7", false},
		{"::/0", "2001:db8::7", true},
		{"::ffff:0:0/96", "198.51.100.7", false},
		{"0.0.0.0/0", "198.51.100.7", true},
		{"0.0.0.0/0", "2001:db8::7", false},
		{"198.51.100.0/24", "198.51.100.7", true},
	}
	for _, tt := range tests {
		t.Run(tt.allow+" "+tt.src, func(t *testing.T) {
			c := testutil.QUICLimits(1000, 1000)
			c.Allow = []netip.Prefix{netip.MustParsePrefix(tt.allow)}
			w := newTwin(t, c)
			p := udp(tt.src, 50000)
			p.Data = quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
			if out := w.step(p, p.Datagram(true), start, 0); out.Allowlisted != tt.want {
				t.Fatalf("allowlisted %v, want %v", out.Allowlisted, tt.want)
			}
			w.compareState()
		})
	}
}

// TestSkewedClock: packets stamped a little earlier than the epoch another
// CPU already moved a cell to (one per epoch, 200 ns early) must not wipe
// the cell: a flood at 95 times the limit is held.
func TestSkewedClock(t *testing.T) {
	const limit, rate = 100, 9500
	w := newTwin(t, testutil.Limits(limit))
	p := udp("198.51.100.7", 5000)
	d := p.Datagram(true)
	passed, sent := 0, 0
	for now := start; now < start+int64(time.Second); {
		next := now + int64(time.Second)/rate
		stamps := []int64{next}
		if next>>sketch.EpochShift != now>>sketch.EpochShift {
			stamps = append(stamps, next>>sketch.EpochShift<<sketch.EpochShift-200)
		}
		for _, at := range stamps {
			sent++
			if !w.step(p, d, at, uint32(sent)*2654435761).Drop {
				passed++
			}
		}
		now = next
	}
	w.compareState()
	// The burst (limit), the noise margin and a second at the limit.
	if passed > 2*limit+40 {
		t.Fatalf("%d of %d passed in a second at limit %d", passed, sent, limit)
	}
	t.Logf("%d of %d passed", passed, sent)
}

// TestSweep: the sweep resets cells idle for the decay horizon, in the
// kernel's sketches as in the Go twin's, and leaves live ones alone.
func TestSweep(t *testing.T) {
	w := newTwin(t, testutil.Limits(100))
	old, fresh := udp("198.51.100.7", 5000), udp("198.51.100.99", 6000)
	w.step(old, old.Datagram(true), start, 0)
	later := start + int64(40*time.Hour)
	w.step(fresh, fresh.Datagram(true), later, 0)
	want := w.d.Limiter().Sweep(later)
	for _, f := range w.filters() {
		swept, err := f.f.sweep(uint32(uint64(later) >> sketch.EpochShift))
		if err != nil {
			t.Fatal(err)
		}
		if swept != want || swept == 0 {
			t.Fatalf("%s: the filter swept %d cells, the Go twin %d", f.name, swept, want)
		}
	}
	w.compareState()
	w.step(fresh, fresh.Datagram(true), later+1, 0)
	w.compareState()
}

// TestSocketClasses sends datagrams of every kind to a real socket, from
// IPv4 and IPv6 sources and a blocked port, and checks that the filter
// counts each class and reason as the Go twin does for the same datagrams,
// and delivers exactly the valid ones: on a real socket the filter finds the
// UDP payload at another offset than under test runs. With VerifyIDs, from
// a learned peer and strangers, to a learned server ID and others, the
// verifications too: the length fields the filter then reads lie past the
// probe, for an Initial with a long token past the skb's linear part.
func TestSocketClasses(t *testing.T) {
	sid := decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	other := decide.ServerID{0x0a, 0x0b, 0x0c, 0x0d}
	cid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	payloads := map[string][]byte{
		"initial":         quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200),
		"handshake":       quicclasstest.LongHeader(quicclass.Version1, 2, 4, 8, 90),
		"short header":    quicclasstest.ShortHeader(100),
		"unknown version": quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200),
		"empty":           {},
		"not quic":        make([]byte, 64),
		"small initial":   quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 900),
		"retry":           quicclasstest.LongHeader(quicclass.Version1, 3, 8, 8, 100),
		"truncated":       quicclasstest.LongHeader(quicclass.Version1, 2, 8, 8, 12),
		// What verification tells apart.
		"consistent initial":           quicclasstest.LongPacket(quicclass.Version1, 0, cid, cid, nil, 1200),
		"initial with a long token":    quicclasstest.LongPacket(quicclass.Version2, 1, cid, cid, make([]byte, 900), 1350),
		"initial to a server id":       quicclasstest.LongPacket(quicclass.Version1, 0, sid[:], cid, make([]byte, 60), 1250),
		"initial, length past the end": quicclasstest.LongPacket(quicclass.Version1, 0, cid, cid, make([]byte, 600), 1400)[:1300],
		"0-rtt":                        quicclasstest.LongPacket(quicclass.Version2, 2, cid, cid, nil, 500),
		"handshake to a server id":     quicclasstest.LongPacket(quicclass.Version1, 2, sid[:], cid, nil, 90),
		"handshake to another id":      quicclasstest.LongPacket(quicclass.Version2, 3, other[:], cid, nil, 90),
		"7-byte handshake":             {0xe0, 0, 0, 0, 1, 0, 0},
		"short to a server id":         quicclasstest.ShortPacket(sid, 300),
		"short to another id":          quicclasstest.ShortPacket(other, 30),
	}
	for _, verify := range []bool{false, true} {
		t.Run(fmt.Sprintf("verify=%v", verify), func(t *testing.T) {
			c := testutil.QUICLimits(100_000, 100_000)
			c.Negotiation = 1000
			c.VerifyIDs = verify
			f, conn, port := attached(t, c, "udp")
			twin, err := decide.New(c, f.hk)
			if err != nil {
				t.Fatal(err)
			}
			// The server sent its ID to 127.0.0.9, which proves its
			// address with the first long header that carries it;
			// 127.0.0.10 carries it too, from an address it was not sent
			// to.
			peer := netip.MustParseAddr("127.0.0.9")
			if err := f.LearnServerID(sid, peer); err != nil {
				t.Fatal(err)
			}
			if err := f.LearnPeer(peer); err != nil {
				t.Fatal(err)
			}
			if err := twin.LearnServerID(sid, peer, start); err != nil {
				t.Fatal(err)
			}
			if err := twin.LearnPeer(peer, start); err != nil {
				t.Fatal(err)
			}
			r := testutil.Receive(conn)
			wantDelivered := 0
			for _, src := range []string{"127.0.0.9:40000", "127.0.0.9:53", "127.0.0.10:40002", "[::1]:40001"} {
				s := testutil.Sender(t, netip.MustParseAddrPort(src))
				dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
				if netip.MustParseAddrPort(src).Addr().Is6() {
					dst = netip.AddrPortFrom(netip.IPv6Loopback(), port)
				}
				// The proof first, so that the rest from 127.0.0.9 meets a
				// proven peer whatever the order of payloads.
				for _, b := range append([][]byte{payloads["handshake to a server id"]}, slices.Collect(maps.Values(payloads))...) {
					if _, err := s.WriteToUDPAddrPort(b, dst); err != nil {
						t.Fatal(err)
					}
					d := decide.Datagram{Key: sketch.KeyFrom(netip.MustParseAddrPort(src), port), Length: len(b), Probe: b}
					if !twin.Decide(&d, start, 0).Drop {
						wantDelivered++
					}
				}
			}
			r.Stop(t)
			got, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			want := twin.Stats()
			// The limiter's counters depend on time, which differs; classes,
			// reasons and verifications do not.
			if got.Invalid != want.Invalid || got.Negotiation != want.Negotiation || got.Passed != want.Passed ||
				got.Verified != want.Verified {
				t.Fatalf("on a real socket: invalid %v negotiation %v passed %v verified %v; the Go twin: %v %v %v %v",
					got.Invalid, got.Negotiation, got.Passed, got.Verified, want.Invalid, want.Negotiation, want.Passed, want.Verified)
			}
			if r.Total() != wantDelivered {
				t.Fatalf("delivered %d datagrams, want %d", r.Total(), wantDelivered)
			}
			v4 := decide.FamilyIndex(sketch.IPv4)
			if verify && (got.Invalid[0][v4][quicclass.Length] == 0 || got.Verified[v4][quicclass.OpeningFromPeer] == 0 ||
				got.Passed[quicclass.Unverified][v4] == 0) {
				t.Fatalf("verification missed a path: invalid %v verified %v", got.Invalid[0][v4], got.Verified[v4])
			}
			t.Logf("%d datagrams delivered of %d sent; invalid by reason (IPv4): %v; verified (IPv4): %v", r.Total(),
				4*len(payloads), got.Invalid[0][v4], got.Verified[v4])
		})
	}
}

// TestSocketGSOBatches: quic-go sends with GSO (UDP_SEGMENT); on loopback the
// batch is segmented on receive, and each segment keeps its headers in the
// skb's linear part and its payload in pages, out of reach of
// bpf_skb_load_bytes_relative. Every segment must still be read and
// classified: short-header packets sent in GSO batches all arrive, counted
// as established, and with VerifyIDs verified by the server ID each carries.
func TestSocketGSOBatches(t *testing.T) {
	const segment, perBatch, batches = 1200, 8, 20
	sid := decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	for _, verify := range []bool{false, true} {
		t.Run(fmt.Sprintf("verify=%v", verify), func(t *testing.T) {
			c := testutil.QUICLimits(100_000, 100_000)
			c.VerifyIDs = verify
			f, conn, port := attached(t, c, "udp")
			if err := f.LearnServerID(sid, netip.MustParseAddr("127.0.0.9")); err != nil {
				t.Fatal(err)
			}
			r := testutil.Receive(conn)
			s := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.9:40000"))
			buf := make([]byte, 0, segment*perBatch)
			for range perBatch {
				buf = append(buf, quicclasstest.ShortPacket(sid, segment)...)
			}
			oob := gsoControl(segment)
			dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
			for range batches {
				if _, _, err := s.WriteMsgUDP(buf, oob, dst); err != nil {
					testutil.SkipOrFail(t, "sending a GSO batch: %v", err)
				}
			}
			r.Stop(t)
			st, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			v4 := decide.FamilyIndex(sketch.IPv4)
			var invalid uint64
			for _, n := range st.Invalid[0][v4] {
				invalid += n
			}
			if r.Total() != perBatch*batches || st.Passed[quicclass.Established][v4] != perBatch*batches || invalid != 0 {
				t.Fatalf("%d segments sent in GSO batches: %d delivered, %d counted established, %d invalid (%v)",
					perBatch*batches, r.Total(), st.Passed[quicclass.Established][v4], invalid, st.Invalid[0][v4])
			}
			if verify && st.Verified[v4][quicclass.ShortByID] != perBatch*batches {
				t.Fatalf("%d segments to a server ID: verified %v", perBatch*batches, st.Verified[v4])
			}
		})
	}
}

// gsoControl is the control message that makes a send a GSO batch of
// segments of size bytes.
func gsoControl(size uint16) []byte {
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[unix.CmsgLen(0):], size)
	return b
}

// TestSweepConcurrent: packets counted between the sweep's reading of the
// cells and its resetting them keep their counts, both in live cells that
// share a 64-byte line with a stale one and in the stale cells themselves.
// The kernel's sketches must equal the Go twin's, which counts the same
// packets and then sweeps.
func TestSweepConcurrent(t *testing.T) {
	w := newTwin(t, testutil.Limits(100))
	for i := range 300 {
		p := udp(fmt.Sprintf("198.51.%d.%d", i/200, i%200), uint16(5000+i))
		w.step(p, p.Datagram(true), start, 0)
	}
	later := start + int64(40*time.Hour)
	epoch := uint32(uint64(later) >> sketch.EpochShift)
	before := w.f.lines(t)
	var after []sketch.Line
	w.f.sweepHook = func() {
		for i := range 300 {
			p := udp(fmt.Sprintf("203.0.%d.%d", i/200, i%200), uint16(6000+i))
			w.step(p, p.Datagram(true), later, 0)
		}
		after = w.f.lines(t)
	}
	swept, err := w.f.sweep(epoch)
	if err != nil {
		t.Fatal(err)
	}
	// The twin counts the packets, then sweeps; so does the filter of
	// mode xdp's path, which has no hook.
	xswept, err := w.x.sweep(epoch)
	if err != nil {
		t.Fatal(err)
	}
	if want := w.d.Limiter().Sweep(later); swept != want || xswept != want || swept == 0 {
		t.Fatalf("the filter swept %d cells, mode xdp's %d, the Go twin %d", swept, xswept, want)
	}
	// The case must be one that a sweep writing whole lines gets wrong.
	sharing, restaled := 0, 0
	for i := range before {
		stale := false
		for _, c := range before[i].Cells {
			stale = stale || (c.Epoch != 0 && sketch.Stale(c.Epoch, epoch))
		}
		for j := range before[i].Cells {
			if after[i].Cells[j] == before[i].Cells[j] {
				continue
			}
			if sketch.Stale(before[i].Cells[j].Epoch, epoch) && before[i].Cells[j].Epoch != 0 {
				restaled++
			} else if stale {
				sharing++
			}
		}
	}
	if sharing == 0 || restaled == 0 {
		t.Fatalf("the packets during the sweep touched %d live cells beside stale ones and %d stale cells, want both", sharing, restaled)
	}
	w.compareState()
	t.Logf("swept %d cells; during the sweep packets touched %d live cells beside stale ones and %d stale cells", swept, sharing, restaled)
}

// TestTotalPerCPU runs one stream's packets on two CPUs and checks that each
// CPU counts the socket's total in a pending cell of its own, and that the
// shared cells gain both CPUs' counts once each has seen the epoch change:
// what the Go twin, one CPU fed the same packets, holds in its single cell,
// within the rounding of decaying the two CPUs' counts apart.
func TestTotalPerCPU(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(os.Getpid(), &set); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for cpu := 0; cpu < 1024 && len(cpus) < 2; cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	if len(cpus) < 2 {
		t.Skip("needs two CPUs; this process may use one")
	}
	w := newTwin(t, testutil.Limits(100_000))
	total := w.d.Limiter().Params().TotalNode
	if total < 0 {
		t.Fatal("no total node in the default lattice")
	}
	p := udp("198.51.100.7", 5000)
	d := p.Datagram(true)
	send := func(cpu int, now int64) {
		t.Helper()
		ctx := skbContext{CB: [5]uint32{uint32(now), uint32(uint64(now) >> 32), 0}}
		if _, err := runOnCPU(w.f.objs.Rakelimit, &ebpf.RunOptions{Data: p.Bytes(), Context: ctx}, cpu); err != nil {
			t.Fatal(err)
		}
		w.d.Decide(&d, now, 0)
	}
	// In one epoch, 10 packets on the first CPU and 20 on the second.
	for i := range 30 {
		send(cpus[min(i/10, 1)], start+int64(i)*1000)
	}
	a, b, want := w.f.pendingOf(t, cpus[0])[0], w.f.pendingOf(t, cpus[1])[0], w.d.Limiter().Pending()[0]
	if a.Budget[0].Offered == 0 || b.Budget[0].Offered != 2*a.Budget[0].Offered {
		t.Fatalf("pending offered counts: first CPU %d, second %d; want the second twice the first, not 0", a.Budget[0].Offered, b.Budget[0].Offered)
	}
	if got := a.Budget[0].Offered + b.Budget[0].Offered; got != want.Budget[0].Offered {
		t.Fatalf("pending offered counts sum to %d, the one-CPU twin's is %d", got, want.Budget[0].Offered)
	}
	// Two epochs later, one packet on each: both flush.
	later := start + int64(2)<<sketch.EpochShift
	send(cpus[0], later)
	send(cpus[1], later+1000)
	params := w.d.Limiter().Params()
	base := int(params.Base[quicclass.Opening][total])
	got, twin := w.f.lines(t), w.d.Limiter().Lines()
	for r := range sketch.Depth {
		for c := range sketch.CellsPerLine {
			g, x := got[base+r].Cells[c], twin[base+r].Cells[c]
			if g.Epoch != x.Epoch || diff(g.Budget[0].Offered, x.Budget[0].Offered) > 2 || diff(g.Budget[0].Forwarded, x.Budget[0].Forwarded) > 2 {
				t.Fatalf("row %d cell %d of the total: BPF %+v, one-CPU twin %+v", r, c, g, x)
			}
		}
	}
	if a, b := w.f.pendingOf(t, cpus[0])[0], w.f.pendingOf(t, cpus[1])[0]; a.Budget[0].Offered+b.Budget[0].Offered != w.d.Limiter().Pending()[0].Budget[0].Offered {
		t.Fatalf("after the epoch: pending %d + %d, the one-CPU twin's %d", a.Budget[0].Offered, b.Budget[0].Offered,
			w.d.Limiter().Pending()[0].Budget[0].Offered)
	}
}

// diff is |a - b|.
func diff(a, b uint32) uint32 {
	if a > b {
		return a - b
	}
	return b - a
}
