//go:build linux

package kernel

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// vlanTagged inserts an 802.1Q tag (VLAN 7) after the frame's addresses.
func vlanTagged(frame []byte) []byte {
	out := append([]byte{}, frame[:12]...)
	out = binary.BigEndian.AppendUint16(out, 0x8100)
	out = binary.BigEndian.AppendUint16(out, 7)
	return append(out, frame[12:]...)
}

// arp is an Ethernet frame of an ARP request.
func arp() []byte {
	b := make([]byte, testutil.EthHdrLen+28)
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(b[12:], unix.ETH_P_ARP)
	return b
}

// TestXDPListeners: the XDP program decides the UDP datagrams to a
// listener (an address of the host on its port; a wildcard listener is
// listed by the host's addresses) and passes every other frame untouched
// and uncounted: other ports and addresses (forwarded traffic, the
// review's Handshake to 10.88.0.5 among them), the other family, another
// protocol to the port, ARP, VLAN-tagged frames, non-first fragments. A
// first fragment, which carries the port, is decided as its datagram
// (here: invalid, too short for an Initial).
func TestXDPListeners(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(1000, 1000), loadOptions{testMode: true, xdp: true})
	// A wildcard on a host of two IPv4 addresses and one IPv6 address,
	// and two listeners of one address each.
	if err := f.SetListeners([]netip.AddrPort{
		netip.MustParseAddrPort("0.0.0.0:443"),
		netip.MustParseAddrPort("[2001:db8::fe]:8443"),
		netip.MustParseAddrPort("[::ffff:192.0.2.254]:9443"),
		netip.MustParseAddrPort("[::]:7443"),
	}, []netip.Addr{netip.MustParseAddr("192.0.2.254"), netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::fe")}); err != nil {
		t.Fatal(err)
	}
	sport := uint16(50000)
	to := func(src string, dst string, port uint16) testutil.Frame {
		// A source port of its own: a stream of its own for the
		// limiter. (The same datagram again would find the record of
		// the one passed and pass undecided only on stacked interfaces,
		// off here: TestDecidedOnce.)
		sport++
		p := udp(src, sport)
		p.Dst, p.DstPort = netip.MustParseAddr(dst), port
		p.Data = quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
		return p
	}
	tcp := to("198.51.100.7", "192.0.2.254", 443)
	tcp.Proto = unix.IPPROTO_TCP
	later := to("198.51.100.7", "192.0.2.254", 443)
	later.IPv4FragOffset = 100
	later6 := to("2001:db8:1::7", "2001:db8::fe", 8443)
	later6.IPv6Ext = []testutil.IPv6Ext{{Kind: unix.IPPROTO_FRAGMENT, FragOffset: 100}}
	first := to("198.51.100.7", "192.0.2.254", 443)
	first.IPv4FragOffset = 0x2000 // more fragments, offset 0
	first.Data = first.Data[:600]
	tests := []struct {
		name    string
		frame   []byte
		decides bool
	}{
		{"ipv4 wildcard, a host address", to("198.51.100.7", "192.0.2.1", 443).Bytes(), true},
		{"ipv4 wildcard's port, not a host address", to("198.51.100.7", "10.88.0.5", 443).Bytes(), false},
		{"forwarded Handshake", func() []byte {
			p := to("198.51.100.7", "10.88.0.5", 443)
			p.Data = quicclasstest.LongPacket(quicclass.Version1, 2, []byte{1, 2, 3, 4}, nil, nil, 100)
			return p.Bytes()
		}(), false},
		{"ipv4 listener address", to("198.51.100.7", "192.0.2.254", 9443).Bytes(), true},
		{"ipv4 other address", to("198.51.100.7", "192.0.2.1", 9443).Bytes(), false},
		{"ipv6 listener address", to("2001:db8:1::7", "2001:db8::fe", 8443).Bytes(), true},
		{"ipv6 wildcard, the host address", to("2001:db8:1::7", "2001:db8::fe", 7443).Bytes(), true},
		{"ipv6 wildcard's port, not a host address", to("2001:db8:1::7", "2001:db8::fe:1", 7443).Bytes(), false},
		{"ipv6 wildcard's port, a prefix of a host address", to("2001:db8:1::7", "2001:db8::", 7443).Bytes(), false},
		{"ipv6 other address", to("2001:db8:1::7", "2001:db8::1", 8443).Bytes(), false},
		{"ipv6 to an ipv4 wildcard's port", to("2001:db8:1::7", "2001:db8::fe", 443).Bytes(), false},
		{"ipv4 to an ipv6 listener's port", to("198.51.100.7", "192.0.2.254", 8443).Bytes(), false},
		{"other port", to("198.51.100.7", "192.0.2.254", 444).Bytes(), false},
		{"tcp to the port", tcp.Bytes(), false},
		{"arp", arp(), false},
		{"vlan", vlanTagged(to("198.51.100.7", "192.0.2.1", 443).Bytes()), false},
		{"ipv4 non-first fragment", later.Bytes(), false},
		{"ipv6 non-first fragment", later6.Bytes(), false},
		{"ipv4 first fragment", first.Bytes(), true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			f.resetVerdict(t)
			ret, err := f.xdpRun(tt.frame, start+int64(i)*1000, 0)
			if err != nil {
				t.Fatal(err)
			}
			v, decided := f.verdict(t)
			after, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if decided != tt.decides {
				t.Fatalf("decided %v (%+v), want %v", decided, v, tt.decides)
			}
			if !tt.decides && (ret != xdpPass || after != before) {
				t.Fatalf("returned %d and counted %v, want XDP_PASS and nothing counted", ret, after != before)
			}
			if tt.decides && after == before {
				t.Fatal("decided and counted nothing")
			}
		})
	}
}

// TestSetListeners: the listener tables follow the listeners, those of a
// reload that removes one among them; a wildcard stands for the host's
// addresses of its family, at most MaxHostAddrs of them.
func TestSetListeners(t *testing.T) {
	f := loadTest(t, testutil.Limits(1000), loadOptions{})
	a, b := netip.MustParseAddrPort("192.0.2.1:443"), netip.MustParseAddrPort("[2001:db8::1]:443")
	count := func() int {
		n := 0
		it := f.objs.ListenAddrs.Iterate()
		var k rakelimitListenKey
		var v uint8
		for it.Next(&k, &v) {
			n++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	table := func() rakelimitListenTable {
		var table rakelimitListenTable
		if err := f.objs.ListenPorts.Lookup(uint32(0), &table); err != nil {
			t.Fatal(err)
		}
		return table
	}
	host := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")}
	for _, step := range []struct {
		addrs        []netip.AddrPort
		n            int
		kinds        uint8
		host4, host6 uint32
	}{
		{[]netip.AddrPort{a, b}, 2, listenSome4 | listenSome6, 1, 2},
		{[]netip.AddrPort{b}, 1, listenSome6, 1, 2},
		{[]netip.AddrPort{b, netip.MustParseAddrPort("[::]:443")}, 1, listenSome6 | listenHost6, 1, 2},
		{[]netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:443")}, 0, listenHost4, 1, 2},
		{nil, 0, 0, 1, 2},
	} {
		if err := f.SetListeners(step.addrs, host); err != nil {
			t.Fatal(err)
		}
		if got := count(); got != step.n {
			t.Fatalf("%v: %d listener addresses, want %d", step.addrs, got, step.n)
		}
		tb := table()
		if tb.Kinds[443] != step.kinds || tb.Host4N != step.host4 || tb.Host6N != step.host6 {
			t.Fatalf("%v: port 443 kinds %#x, %d and %d host addresses; want %#x, %d, %d", step.addrs, tb.Kinds[443],
				tb.Host4N, tb.Host6N, step.kinds, step.host4, step.host6)
		}
	}
	var many []netip.AddrPort
	for i := range MaxListenAddrs + 1 {
		many = append(many, netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, byte(2 + i/256), byte(i)}), 443))
	}
	if err := f.SetListeners(many, nil); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("%d listener addresses: got %v, want an error", len(many), err)
	}
	var manyHost []netip.Addr
	for i := range MaxHostAddrs + 1 {
		manyHost = append(manyHost, netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}))
	}
	for _, bad := range [][]netip.Addr{manyHost, {netip.IPv4Unspecified()}, {{}}} {
		if err := f.SetListeners([]netip.AddrPort{a}, bad); err == nil {
			t.Fatalf("host addresses %v: want an error", bad)
		}
	}
	if got := count(); got != 0 {
		t.Fatalf("a refused table left %d addresses", got)
	}
}

// TestDecidedOnce: the socket filter leaves alone exactly the datagrams the
// XDP program passed, one for each, whatever happened to their headers in
// between, and decides every other: the review's finding 4 (a port
// redirect: the XDP program saw port 443, which no listener has, and the
// socket filter 8443 on an interface the program runs on) is decided at
// the socket; a datagram the XDP program passed is not decided again at
// the socket, nor, on stacked interfaces, by a second run of the program
// above (a bridge over its port), which decides it again otherwise; copies
// of a passed datagram (a sender forging its mark) cost one decision each
// all the same.
func TestDecidedOnce(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(1000, 1000), loadOptions{testMode: true, xdp: true})
	if err := f.SetListeners([]netip.AddrPort{netip.MustParseAddrPort("192.0.2.254:8443")}, nil); err != nil {
		t.Fatal(err)
	}
	frame := func(port uint16, b byte) testutil.Frame {
		p := udp("198.51.100.7", 50000)
		p.DstPort = port
		p.Data = quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
		p.Data[10] = b // in the destination ID: the probe, the mark
		return p
	}
	now := start
	// xdp runs the XDP program and reports whether it decided.
	xdp := func(p testutil.Frame) bool {
		t.Helper()
		now += 1000
		f.resetVerdict(t)
		ret, err := f.xdpRun(p.Bytes(), now, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, decided := f.verdict(t)
		if ret != xdpPass {
			t.Fatalf("the XDP program dropped an allowed Initial (%d)", ret)
		}
		return decided
	}
	// socket runs the socket filter and reports whether it decided.
	socket := func(p testutil.Frame) bool {
		t.Helper()
		now += 1000
		f.resetVerdict(t)
		ret, err := runOnTestCPU(f.objs.Rakelimit, &ebpf.RunOptions{Data: p.Bytes(),
			Context: skbContext{CB: [5]uint32{uint32(now), uint32(uint64(now) >> 32), 0}}})
		if err != nil {
			t.Fatal(err)
		}
		if ret == 0 {
			t.Fatal("the socket filter dropped an allowed Initial")
		}
		_, decided := f.verdict(t)
		return decided
	}
	type hop struct {
		at      string // "xdp" or "socket"
		port    uint16
		b       byte
		decided bool
	}
	tests := []struct {
		name    string
		hops    []hop
		mark    bool // the program runs on an interface
		stacked bool // on two of one path
	}{
		{"no XDP program anywhere: the socket decides", []hop{{"socket", 8443, 1, true}}, false, false},
		{"passed at XDP, left alone at the socket", []hop{{"xdp", 8443, 2, true}, {"socket", 8443, 2, false}}, true, false},
		{"a port redirected to the listener's", []hop{{"xdp", 443, 3, false}, {"socket", 8443, 3, true}}, true, false},
		{"a destination rewritten to the listener's", []hop{{"xdp", 9443, 4, false}, {"socket", 8443, 4, true}}, true, false},
		{"a datagram the program never saw", []hop{{"socket", 8443, 5, true}}, true, false},
		{"a second run above (a bridge over its port)", []hop{{"xdp", 8443, 6, true}, {"xdp", 8443, 6, false},
			{"socket", 8443, 6, false}}, true, true},
		{"a second run, not stacked: decided again", []hop{{"xdp", 8443, 10, true}, {"xdp", 8443, 10, true},
			{"socket", 8443, 10, false}, {"socket", 8443, 10, false}}, true, false},
		{"a copy sent to the socket's port directly", []hop{{"xdp", 8443, 7, true}, {"socket", 8443, 7, false},
			{"socket", 8443, 7, true}}, true, false},
		{"copies of a passed datagram, stacked", []hop{{"xdp", 8443, 8, true}, {"xdp", 8443, 8, false}, {"xdp", 8443, 8, true},
			{"xdp", 8443, 8, false}, {"socket", 8443, 8, false}, {"socket", 8443, 8, false}, {"socket", 8443, 8, true},
			{"socket", 8443, 8, true}}, true, true},
		{"copies of a passed datagram", []hop{{"xdp", 8443, 11, true}, {"xdp", 8443, 11, true},
			{"socket", 8443, 11, false}, {"socket", 8443, 11, false}, {"socket", 8443, 11, true}}, true, false},
		{"a copy redirected before its original reached the socket", []hop{{"xdp", 8443, 9, true}, {"xdp", 443, 9, false},
			{"socket", 8443, 9, false}, {"socket", 8443, 9, true}}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.mark {
				if err := f.markXDP(loopbackIndex, true); err != nil {
					t.Fatal(err)
				}
				defer f.markXDP(loopbackIndex, false)
			}
			if err := f.SetXDPStacked(tt.stacked); err != nil {
				t.Fatal(err)
			}
			decisions := 0
			for i, h := range tt.hops {
				var got bool
				if h.at == "xdp" {
					got = xdp(frame(h.port, h.b))
				} else {
					got = socket(frame(h.port, h.b))
				}
				if got != h.decided {
					t.Fatalf("hop %d (%s, port %d): decided %v, want %v", i, h.at, h.port, got, h.decided)
				}
				if got {
					decisions++
				}
			}
			datagrams := 0
			for _, h := range tt.hops {
				if h.at == "socket" {
					datagrams++
				}
			}
			if decisions != datagrams {
				t.Fatalf("%d decisions of the %d datagrams that reached the socket", decisions, datagrams)
			}
		})
	}
}

// unkeyedMark is the mark the XDP program gave a datagram before it was
// keyed (c/listen.h, passed_mark): five 64-bit words of an IPv4 source and
// the payload's first 24 bytes, each times an odd constant, summed and
// mixed. Linear: a sender could build any datagram with another's mark.
func unkeyedMark(src netip.Addr, payload []byte) uint64 {
	a := src.As4()
	h := uint64(binary.BigEndian.Uint32(a[:])) * 0x9e3779b97f4a7c15
	for i, c := range []uint64{0x165667b19e3779f9, 0xd6e8feb86659fd93, 0xff51afd7ed558ccd} {
		h += binary.LittleEndian.Uint64(payload[8*i:]) * c
	}
	return h
}

// inverse is the multiplicative inverse of an odd c modulo 2^64.
func inverse(c uint64) uint64 {
	x := c
	for range 5 {
		x *= 2 - c*x
	}
	return x
}

// TestForgedMark: a sender has the XDP program pass a datagram A of its
// own, then sends a datagram B from another source, of another kind (here
// junk in place of A's Initial), whose payload it built so that B's mark
// under the unkeyed function is A's, to a path where the XDP program does
// not see it (a port redirected to the listener's). The mark is keyed with
// a secret of each load: B is decided at the socket, and A's record waits
// for A.
func TestForgedMark(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(1000, 1000), loadOptions{testMode: true, xdp: true})
	if err := f.SetListeners([]netip.AddrPort{netip.MustParseAddrPort("192.0.2.254:8443")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.markXDP(loopbackIndex, true); err != nil {
		t.Fatal(err)
	}
	a := udp("198.51.100.7", 50000)
	a.DstPort = 8443
	a.Data = quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	b := udp("203.0.113.9", 50001)
	b.DstPort = 8443
	b.Data = bytes.Clone(a.Data)
	b.Data[0] = 0x40 // a short header: junk where A was an Initial
	// B's last word makes up for its other source and first byte.
	diff := unkeyedMark(a.Src, a.Data) - unkeyedMark(b.Src, b.Data)
	binary.LittleEndian.PutUint64(b.Data[16:], binary.LittleEndian.Uint64(b.Data[16:])+diff*inverse(0xff51afd7ed558ccd))
	if unkeyedMark(a.Src, a.Data) != unkeyedMark(b.Src, b.Data) {
		t.Fatal("the forgery does not hold under the unkeyed mark")
	}
	now := start
	run := func(prog *ebpf.Program, p testutil.Frame, xdp bool) bool {
		t.Helper()
		now += 1000
		f.resetVerdict(t)
		var err error
		if xdp {
			_, err = f.xdpRun(p.Bytes(), now, 0)
		} else {
			_, err = runOnTestCPU(prog, &ebpf.RunOptions{Data: p.Bytes(),
				Context: skbContext{CB: [5]uint32{uint32(now), uint32(uint64(now) >> 32), 0}}})
		}
		if err != nil {
			t.Fatal(err)
		}
		_, decided := f.verdict(t)
		return decided
	}
	if !run(nil, a, true) {
		t.Fatal("the XDP program did not decide A")
	}
	if !run(f.objs.Rakelimit, b, false) {
		t.Fatal("the socket filter left alone B, a datagram built to carry A's mark")
	}
	if run(f.objs.Rakelimit, a, false) {
		t.Fatal("A, which the XDP program passed, was decided again at the socket")
	}
}

// xdpAttached reports whether ip link shows an XDP program on the
// interface name of namespace ns.
func xdpAttached(t testing.TB, ns *testutil.NetNS, name string) bool {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns.Name(), "link", "show", "dev", name).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show %s: %v: %s", name, err, out)
	}
	return strings.Contains(string(out), "xdp")
}

// TestXDPVeth runs the XDP program natively on a veth between two
// namespaces the test makes, in front of a socket with the socket filter:
// a client across the veth and one on the server's loopback each send
// datagrams to the socket, valid Initials and junk. Every datagram is
// decided once (the counters add up to what was sent), the junk from
// across the veth is dropped by the XDP program (the counts show it with
// the socket's drop counter unmoved by it), and the loopback's by the
// socket filter. Closing the link leaves the interface without a program.
func TestXDPVeth(t *testing.T) {
	server := testutil.NewNetNS(t, "fd00:38::1/128")
	client := testutil.NewNetNS(t)
	client.Link(t, server, "rl38", []string{"fd00:38:1::2/64"}, []string{"fd00:38:1::1/64"})
	f := loadTest(t, testutil.QUICLimits(100_000, 100_000), loadOptions{xdp: true})
	var conn, local, remote *net.UDPConn
	var x *XDPLink
	server.Do(t, func() {
		conn = testutil.Listen(t, "udp6", "[::]:0")
		local = testutil.Sender(t, netip.MustParseAddrPort("[fd00:38::1]:0"))
		iface, err := net.InterfaceByName("rl38")
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Attach(conn); err != nil {
			t.Fatal(err)
		}
		// The wildcard socket, on the namespace's addresses (the
		// engine reads them in mode xdp).
		if err := f.SetListeners([]netip.AddrPort{netip.AddrPortFrom(netip.IPv6Unspecified(), testutil.PortOf(conn))},
			[]netip.Addr{netip.MustParseAddr("fd00:38::1"), netip.MustParseAddr("fd00:38:1::1")}); err != nil {
			t.Fatal(err)
		}
		if x, err = f.AttachXDP(iface.Index, iface.Name, false); err != nil {
			testutil.SkipOrFail(t, "native XDP on a veth: %v", err)
		}
	})
	client.Do(t, func() {
		remote = testutil.Sender(t, netip.MustParseAddrPort("[fd00:38:1::2]:0"))
	})
	if !xdpAttached(t, server, "rl38") {
		t.Fatal("ip link shows no XDP program on the veth")
	}
	port := testutil.PortOf(conn)
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	junk := []byte{0, 1, 2, 3, 4, 5, 6, 7}
	const each = 50
	r := testutil.Receive(conn)
	for _, s := range []struct {
		from *net.UDPConn
		to   netip.AddrPort
	}{{remote, netip.AddrPortFrom(netip.MustParseAddr("fd00:38:1::1"), port)},
		{local, netip.AddrPortFrom(netip.MustParseAddr("fd00:38::1"), port)}} {
		for _, data := range [][]byte{initial, junk} {
			if err := testutil.Pace(s.from, s.to, 2000, each, func() []byte { return data }); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	var st decide.Stats
	for {
		var err error
		if st, err = f.Stats(); err != nil {
			t.Fatal(err)
		}
		passed, invalid := st.Passed[0][2], uint64(0)
		for _, n := range st.Invalid[0][2] {
			invalid += n
		}
		if passed+invalid >= 4*each || time.Now().After(deadline) {
			if passed != 2*each || invalid != 2*each {
				t.Fatalf("counted %d passed and %d invalid IPv6 datagrams, want %d each: each sent datagram once", passed, invalid, 2*each)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Stop(t)
	if got := r.ReceivedFrom(netip.MustParseAddr("fd00:38:1::2")); got != each {
		t.Errorf("the socket received %d datagrams from across the veth, want the %d Initials", got, each)
	}
	if got := r.ReceivedFrom(netip.MustParseAddr("fd00:38::1")); got != each {
		t.Errorf("the socket received %d datagrams from its loopback, want the %d Initials", got, each)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if xdpAttached(t, server, "rl38") {
		t.Fatal("ip link shows an XDP program on the veth after its link closed")
	}
}
