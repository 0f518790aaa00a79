//go:build linux

package engine

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
)

// procWord is how /proc/net/udp prints the 4 bytes of an address at b: as
// the number they make in the host's byte order.
func procWord(b []byte) string {
	return fmt.Sprintf("%08X", binary.NativeEndian.Uint32(b))
}

// procAddr is a local address as /proc/net/udp or udp6 prints it.
func procAddr(ap netip.AddrPort) string {
	var b []byte
	if ap.Addr().Is4() {
		a := ap.Addr().As4()
		b = a[:]
	} else {
		a := ap.Addr().As16()
		b = a[:]
	}
	var s strings.Builder
	for i := 0; i < len(b); i += 4 {
		s.WriteString(procWord(b[i:]))
	}
	return fmt.Sprintf("%s:%04X", s.String(), ap.Port())
}

// TestBoundSockets: the sockets of /proc/net/udp and udp6 bound to a
// specific address on a listener's port are read back, IPv4-mapped ones
// as IPv4; wildcards and other ports are not.
func TestBoundSockets(t *testing.T) {
	header := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n"
	row := func(ap netip.AddrPort) string {
		return fmt.Sprintf("  1: %s 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1234 2 0000000000000000 0\n",
			procAddr(ap))
	}
	mapped := netip.AddrPortFrom(netip.MustParseAddr("::ffff:192.0.2.7"), 443)
	table := header + row(netip.MustParseAddrPort("127.0.0.1:443")) + row(netip.MustParseAddrPort("0.0.0.0:443")) +
		row(netip.MustParseAddrPort("192.0.2.1:8443")) + row(netip.MustParseAddrPort("[fd00:38:1::3]:443")) +
		row(netip.MustParseAddrPort("[::]:443")) + row(mapped)
	got := map[netip.AddrPort]bool{}
	if err := parseBound(strings.NewReader(table), []uint16{443}, got); err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:443"), netip.MustParseAddrPort("192.0.2.7:443"),
		netip.MustParseAddrPort("[fd00:38:1::3]:443")}
	keys := slices.SortedFunc(maps.Keys(got), netip.AddrPort.Compare)
	if !slices.Equal(keys, want) {
		t.Fatalf("bound %v, want %v", keys, want)
	}
	if err := parseBound(strings.NewReader(header+"  1: XYZ:01BB 0\n"), []uint16{443}, got); err == nil {
		t.Fatal("a row that is not an address read without an error")
	}
	// This host's own table reads.
	if _, err := boundSockets([]uint16{443}); err != nil {
		t.Fatal(err)
	}
}

// TestXDPTargets: a listener's address stands for itself; a wildcard stays
// one, for the host's addresses of its family, unless another socket is
// bound to one of them on its port or the host has more than the program
// scans: then it is listed by the host's addresses, less the taken ones.
func TestXDPTargets(t *testing.T) {
	ap := netip.MustParseAddrPort
	addr := netip.MustParseAddr
	host := []netip.Addr{addr("127.0.0.1"), addr("192.0.2.1"), addr("192.0.2.2"), addr("::1"), addr("fd00:38:1::1"),
		addr("fd00:38:1::3")}
	var many []netip.Addr // more IPv6 addresses than the program scans
	for i := range kernel.MaxHostAddrs + 1 {
		many = append(many, netip.AddrFrom16([16]byte{0xfd, 0, 0x38, 15: byte(i + 1)}))
	}
	many = append(many, addr("192.0.2.1"))
	tests := []struct {
		name      string
		listeners []netip.AddrPort
		host      []netip.Addr
		bound     []netip.AddrPort
		addrs     []netip.AddrPort
		scanned   []netip.Addr
	}{
		{"an address", []netip.AddrPort{ap("192.0.2.1:443")}, host, nil, []netip.AddrPort{ap("192.0.2.1:443")}, host},
		{"IPv4 wildcard", []netip.AddrPort{ap("0.0.0.0:443")}, host, nil, []netip.AddrPort{ap("0.0.0.0:443")}, host},
		{"dual-stack wildcard, another socket on one IPv6 address", []netip.AddrPort{ap("[::]:443"), ap("0.0.0.0:443")}, host,
			[]netip.AddrPort{ap("[fd00:38:1::3]:443"), ap("192.0.2.1:8443")},
			[]netip.AddrPort{ap("0.0.0.0:443"), ap("[::1]:443"), ap("[fd00:38:1::1]:443")}, host},
		{"the limiter's own address and its wildcard", []netip.AddrPort{ap("192.0.2.2:443"), ap("0.0.0.0:443")}, host,
			[]netip.AddrPort{ap("192.0.2.2:443")},
			[]netip.AddrPort{ap("127.0.0.1:443"), ap("192.0.2.1:443"), ap("192.0.2.2:443")}, host},
		{"more host addresses than the program scans", []netip.AddrPort{ap("[::]:443"), ap("0.0.0.0:443")}, many, nil,
			append([]netip.AddrPort{ap("0.0.0.0:443")}, func() []netip.AddrPort {
				var out []netip.AddrPort
				for _, h := range many[:len(many)-1] {
					out = append(out, netip.AddrPortFrom(h, 443))
				}
				return out
			}()...), []netip.Addr{addr("192.0.2.1")}},
		{"IPv4-mapped", []netip.AddrPort{ap("[::ffff:192.0.2.9]:443")}, host, nil, []netip.AddrPort{ap("192.0.2.9:443")}, host},
		{"none", nil, nil, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bound := map[netip.AddrPort]bool{}
			for _, b := range tt.bound {
				bound[b] = true
			}
			got := xdpTargets(tt.listeners, tt.host, bound)
			if !slices.Equal(got.addrs, tt.addrs) || !slices.Equal(got.host, tt.scanned) {
				t.Fatalf("table %v, host %v; want %v, %v", got.addrs, got.host, tt.addrs, tt.scanned)
			}
		})
	}
}

// TestLeftOut: by default the XDP program goes on NICs and veths, and not
// on the devices stacked above them, their ports, or devices whose frames
// it cannot read; each left out with a reason that names it. The stacked
// ones and the ports are those where a datagram may meet it twice.
func TestLeftOut(t *testing.T) {
	names := map[int]string{3: "br0"}
	tests := []struct {
		k      linkKind
		want   string
		stacks bool
	}{
		{linkKind{arphd: unix.ARPHRD_ETHER}, "", false},
		{linkKind{kind: "veth", arphd: unix.ARPHRD_ETHER}, "", false},
		{linkKind{kind: "veth", arphd: unix.ARPHRD_ETHER, master: 3}, "a port of br0", true},
		{linkKind{arphd: unix.ARPHRD_ETHER, master: 9}, "a port of interface 9", true},
		{linkKind{kind: "bridge", arphd: unix.ARPHRD_ETHER}, "a bridge", true},
		{linkKind{kind: "bond", arphd: unix.ARPHRD_ETHER}, "a bond", true},
		{linkKind{kind: "vlan", arphd: unix.ARPHRD_ETHER}, "a VLAN", true},
		{linkKind{kind: "macvlan", arphd: unix.ARPHRD_ETHER}, "a macvlan child", true},
		{linkKind{kind: "tun", arphd: unix.ARPHRD_ETHER}, "a tap device", false},
		{linkKind{kind: "vxlan", arphd: unix.ARPHRD_ETHER}, "a vxlan device", false},
		{linkKind{kind: "wireguard", arphd: unix.ARPHRD_NONE}, "no Ethernet header", false},
		{linkKind{kind: "tun", arphd: unix.ARPHRD_NONE}, "no Ethernet header", false},
		{linkKind{kind: "gre", arphd: unix.ARPHRD_IPGRE}, "no Ethernet header", false},
	}
	for _, tt := range tests {
		got := tt.k.leftOut(names)
		if (got == "") != (tt.want == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%+v: left out %q, want %q", tt.k, got, tt.want)
		}
		if got := tt.k.stacks(); got != tt.stacks {
			t.Errorf("%+v: stacks %v, want %v", tt.k, got, tt.stacks)
		}
	}
}

// TestLinkKinds: the kinds rtnetlink gives this namespace's interfaces:
// loopback is not Ethernet, and every interface net.Interfaces lists has
// one.
func TestLinkKinds(t *testing.T) {
	kinds, err := linkKinds()
	if err != nil {
		t.Fatal(err)
	}
	if lo, ok := kinds[1]; !ok || lo.arphd != unix.ARPHRD_LOOPBACK {
		t.Fatalf("interface 1 (loopback): %+v", lo)
	}
}
