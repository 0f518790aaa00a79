//go:build linux

package bpf

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
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
		{"initial", 50000, quicclass.LongHeader(quicclass.Version1, 0, 8, 8, 1200), quicclass.Opening, 0},
		{"v2 initial", 50000, quicclass.LongHeader(quicclass.Version2, 1, 8, 8, 1252), quicclass.Opening, 0},
		{"handshake", 50000, quicclass.LongHeader(quicclass.Version1, 2, 4, 8, 90), quicclass.Opening, 0},
		{"short header", 50000, quicclass.ShortHeader(1200), quicclass.Established, 0},
		{"ack", 50000, quicclass.ShortHeader(25), quicclass.Established, 0},
		{"unknown version", 50000, quicclass.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200), quicclass.Negotiation, 0},
		{"empty", 50000, []byte{}, quicclass.Invalid, quicclass.Empty},
		{"from port 53", 53, quicclass.LongHeader(quicclass.Version1, 0, 8, 8, 1200), quicclass.Invalid, quicclass.SourcePort},
		{"not quic", 50000, make([]byte, 64), quicclass.Invalid, quicclass.FixedBit},
		{"small initial", 50000, quicclass.LongHeader(quicclass.Version1, 0, 8, 8, 1199), quicclass.Invalid, quicclass.SmallInitial},
		{"long connection id", 50000, quicclass.LongHeader(quicclass.Version1, 0, 21, 8, 1200), quicclass.Invalid, quicclass.ConnectionIDLength},
		{"retry", 50000, quicclass.LongHeader(quicclass.Version1, 3, 8, 8, 100), quicclass.Invalid, quicclass.ServerOnly},
		{"version negotiation", 50000, quicclass.LongHeader(0, 0, 8, 8, 100), quicclass.Invalid, quicclass.ServerOnly},
		{"short header of 20 bytes", 50000, quicclass.ShortHeader(20), quicclass.Invalid, quicclass.Truncated},
		{"small unknown version", 50000, quicclass.LongHeader(0x0a0a0a0a, 0, 8, 8, 400), quicclass.Invalid, quicclass.SmallUnknownVersion},
	}
	w := newTwin(t, testutil.QUICLimits(1000, 1000))
	now := start
	for _, src := range []string{"198.51.100.7", "2001:db8:1:2::7"} {
		for _, ext := range [][]ipv6Ext{nil, {{kind: unix.IPPROTO_HOPOPTS}, {kind: unix.IPPROTO_DSTOPTS, units: 2}}} {
			if ext != nil && netip.MustParseAddr(src).Is4() {
				continue
			}
			for _, tt := range tests {
				t.Run(fmt.Sprintf("%s %d extensions %s", src, len(ext), tt.name), func(t *testing.T) {
					w.t = t
					p := udp(src, tt.sport)
					p.data, p.ipv6Ext = tt.data, ext
					now += int64(time.Millisecond)
					out := w.step(p, p.datagram(true), now, 0)
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
	p.data = quicclass.ShortHeader(100)
	for range IPV6MaxExt + 1 {
		p.ipv6Ext = append(p.ipv6Ext, ipv6Ext{kind: unix.IPPROTO_DSTOPTS})
	}
	w.t = t
	if out := w.step(p, p.datagram(false), now+int64(time.Millisecond), 0); out.Reason != quicclass.Unparsed {
		t.Fatalf("behind %d extension headers: %+v, want invalid (unparsed)", len(p.ipv6Ext), out)
	}
	w.compareState()
}

// IPV6MaxExt is IPV6_MAX_EXT in rakelimit.c, the extension headers walked.
const IPV6MaxExt = 6

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
			if out := w.step(p, p.datagram(true), start, 0); out.Allowlisted != tt.want {
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
	d := p.datagram(true)
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
	w.step(old, old.datagram(true), start, 0)
	later := start + int64(40*time.Hour)
	w.step(fresh, fresh.datagram(true), later, 0)
	swept, err := w.f.sweep(uint32(uint64(later) >> sketch.EpochShift))
	if err != nil {
		t.Fatal(err)
	}
	if want := w.d.Limiter().Sweep(later); swept != want || swept == 0 {
		t.Fatalf("the filter swept %d cells, the Go twin %d", swept, want)
	}
	w.compareState()
	w.step(fresh, fresh.datagram(true), later+1, 0)
	w.compareState()
}

// TestSocketClasses sends datagrams of every kind to a real socket, from
// IPv4 and IPv6 sources and a blocked port, and checks that the filter
// counts each class and reason as the Go twin does for the same datagrams,
// and delivers exactly the valid ones: on a real socket the filter finds the
// UDP payload at another offset than under test runs.
func TestSocketClasses(t *testing.T) {
	payloads := map[string][]byte{
		"initial":         quicclass.LongHeader(quicclass.Version1, 0, 8, 8, 1200),
		"handshake":       quicclass.LongHeader(quicclass.Version1, 2, 4, 8, 90),
		"short header":    quicclass.ShortHeader(100),
		"unknown version": quicclass.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200),
		"empty":           {},
		"not quic":        make([]byte, 64),
		"small initial":   quicclass.LongHeader(quicclass.Version1, 0, 8, 8, 900),
		"retry":           quicclass.LongHeader(quicclass.Version1, 3, 8, 8, 100),
		"truncated":       quicclass.LongHeader(quicclass.Version1, 2, 8, 8, 12),
	}
	c := testutil.QUICLimits(100_000, 100_000)
	c.Negotiation = 1000
	f, conn, port := attached(t, c, "udp")
	twin, err := datagram.New(c, sketch.HashKey{})
	if err != nil {
		t.Fatal(err)
	}
	r := testutil.Receive(conn)
	wantDelivered := 0
	for _, src := range []string{"127.0.0.9:40000", "127.0.0.9:53", "[::1]:40001"} {
		s := testutil.Sender(t, netip.MustParseAddrPort(src))
		dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
		if netip.MustParseAddrPort(src).Addr().Is6() {
			dst = netip.AddrPortFrom(netip.IPv6Loopback(), port)
		}
		for _, b := range payloads {
			if _, err := s.WriteToUDPAddrPort(b, dst); err != nil {
				t.Fatal(err)
			}
			d := datagram.Datagram{Key: sketch.KeyFrom(netip.MustParseAddrPort(src), port), Length: len(b),
				Probe: b[:min(len(b), quicclass.ProbeBytes)]}
			if !twin.Decide(&d, start, 0).Drop {
				wantDelivered++
			}
		}
	}
	r.Stop()
	got, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := twin.Stats()
	// The limiter's counters depend on time, which differs; classes and
	// reasons do not.
	if got.Invalid != want.Invalid || got.Negotiation != want.Negotiation || got.Passed != want.Passed {
		t.Fatalf("on a real socket: invalid %v negotiation %v passed %v; the Go twin: %v %v %v",
			got.Invalid, got.Negotiation, got.Passed, want.Invalid, want.Negotiation, want.Passed)
	}
	if r.Total() != wantDelivered {
		t.Fatalf("delivered %d datagrams, want %d", r.Total(), wantDelivered)
	}
	t.Logf("%d datagrams delivered of %d sent; invalid by reason (IPv4): %v", r.Total(), 3*len(payloads), got.Invalid[0][1])
}

// TestSocketGSOBatches: quic-go sends with GSO (UDP_SEGMENT); on loopback the
// batch is segmented on receive, and each segment keeps its headers in the
// skb's linear part and its payload in pages, out of reach of
// bpf_skb_load_bytes_relative. Every segment must still be read and
// classified: short-header packets sent in GSO batches all arrive, counted
// as established.
func TestSocketGSOBatches(t *testing.T) {
	const segment, perBatch, batches = 1200, 8, 20
	f, conn, port := attached(t, testutil.QUICLimits(100_000, 100_000), "udp")
	r := testutil.Receive(conn)
	s := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.9:40000"))
	buf := make([]byte, 0, segment*perBatch)
	for range perBatch {
		buf = append(buf, quicclass.ShortHeader(segment)...)
	}
	oob := gsoControl(segment)
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
	for range batches {
		if _, _, err := s.WriteMsgUDP(buf, oob, dst); err != nil {
			testutil.SkipOrFail(t, "sending a GSO batch: %v", err)
		}
	}
	r.Stop()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	v4 := datagram.FamilyIndex(sketch.IPv4)
	var invalid uint64
	for _, n := range st.Invalid[0][v4] {
		invalid += n
	}
	if r.Total() != perBatch*batches || st.Passed[quicclass.Established][v4] != perBatch*batches || invalid != 0 {
		t.Fatalf("%d segments sent in GSO batches: %d delivered, %d counted established, %d invalid (%v)",
			perBatch*batches, r.Total(), st.Passed[quicclass.Established][v4], invalid, st.Invalid[0][v4])
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
