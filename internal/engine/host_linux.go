//go:build linux

package engine

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
)

// The host as mode xdp needs to know it: its addresses (a wildcard
// listener's XDP program decides only for them), the sockets other than
// the limiter's bound to one of them (whose traffic it must leave alone),
// and the kinds of its interfaces (which carry a listener's traffic in
// Ethernet frames the program can read).

// hostAddrs lists the addresses of the host's interfaces (of the network
// namespace the process runs in), each once, without zone.
func hostAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing the host's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range as {
		p, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(p.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// boundSockets lists the UDP sockets of the namespace bound to a specific
// address, on the ports asked, from /proc/net/udp and udp6.
func boundSockets(ports []uint16) (map[netip.AddrPort]bool, error) {
	out := map[netip.AddrPort]bool{}
	for _, name := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		f, err := os.Open(name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // no IPv6
			}
			return nil, fmt.Errorf("reading the UDP sockets: %w", err)
		}
		err = parseBound(f, ports, out)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
	}
	return out, nil
}

// parseBound adds to out the local addresses of the sockets of a
// /proc/net/udp or udp6 table r that are bound to a specific address on
// one of ports.
func parseBound(r io.Reader, ports []uint16, out map[netip.AddrPort]bool) error {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), 1<<20)
	first := true
	for s.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(s.Text())
		if len(f) < 2 {
			continue
		}
		ap, err := procAddrPort(f[1])
		if err != nil {
			return err
		}
		if !ap.Addr().IsUnspecified() && slices.Contains(ports, ap.Port()) {
			out[ap] = true
		}
	}
	return s.Err()
}

// procAddrPort parses a local address of /proc/net/udp ("0100007F:01BB":
// the address as 32-bit words in the host's byte order, in hex, and the
// port) or udp6 (four words).
func procAddrPort(s string) (netip.AddrPort, error) {
	hexAddr, hexPort, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if !ok || err != nil {
		return netip.AddrPort{}, fmt.Errorf("a local address %q", s)
	}
	raw, err := hex.DecodeString(hexAddr)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("a local address %q", s)
	}
	// Each word was printed as a number ("%08X"): the address's bytes
	// are that number in the host's byte order.
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
}

// xdpTable is what the XDP program is told of the listeners
// (kernel.Program.SetListeners): addresses and ports, wildcards among them,
// and the host's addresses a wildcard stands for.
type xdpTable struct {
	addrs []netip.AddrPort
	host  []netip.Addr
}

func (t xdpTable) equal(u xdpTable) bool {
	return slices.Equal(t.addrs, u.addrs) && slices.Equal(t.host, u.host)
}

// xdpTargets is the table for listeners on a host of addresses host, of
// which bound are taken by other sockets on their port (their traffic is
// not the limiter's). A listener's own address stands for itself. A
// wildcard (0.0.0.0, ::) stays one, for the host's addresses of its family,
// which the program scans, while none of them is another socket's on its
// port and the host has at most kernel.MaxHostAddrs of that family; else
// it is listed by the host's addresses, less those.
func xdpTargets(listeners []netip.AddrPort, host []netip.Addr, bound map[netip.AddrPort]bool) xdpTable {
	var t xdpTable
	count := map[bool]int{}
	for _, h := range host {
		count[h.Is4()]++
	}
	for _, h := range host {
		if count[h.Is4()] <= kernel.MaxHostAddrs {
			t.host = append(t.host, h)
		}
	}
	add := func(ap netip.AddrPort) {
		if !slices.Contains(t.addrs, ap) {
			t.addrs = append(t.addrs, ap)
		}
	}
	for _, l := range listeners {
		a := l.Addr().Unmap()
		if !a.IsUnspecified() {
			add(netip.AddrPortFrom(a, l.Port()))
			continue
		}
		taken := false
		for _, h := range host {
			taken = taken || (h.Is4() == a.Is4() && bound[netip.AddrPortFrom(h, l.Port())])
		}
		if !taken && count[a.Is4()] <= kernel.MaxHostAddrs {
			add(netip.AddrPortFrom(a, l.Port()))
			continue
		}
		for _, h := range host {
			if ap := netip.AddrPortFrom(h, l.Port()); h.Is4() == a.Is4() && !bound[ap] {
				add(ap)
			}
		}
	}
	slices.SortFunc(t.addrs, netip.AddrPort.Compare)
	return t
}

// An interface's kind, as rtnetlink names it (IFLA_INFO_KIND: "veth",
// "bridge", "vlan", ...; "" for a device with a driver of its own, a NIC),
// its link type (ARPHRD_*), and the index of the device it is a port of
// (IFLA_MASTER: a bridge, a bond), 0 for none.
type linkKind struct {
	kind   string
	arphd  uint16
	master int
}

// linkKinds reads the kind of every interface of the namespace, by index.
func linkKinds() (map[int]linkKind, error) {
	rib, err := syscall.NetlinkRIB(unix.RTM_GETLINK, unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("listing the network interfaces: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return nil, fmt.Errorf("listing the network interfaces: %w", err)
	}
	out := map[int]linkKind{}
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg {
			continue
		}
		// struct ifinfomsg: family, pad, type (u16), index (s32), ...
		typ, index := binary.NativeEndian.Uint16(m.Data[2:4]), int32(binary.NativeEndian.Uint32(m.Data[4:8]))
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return nil, fmt.Errorf("reading interface %d: %w", index, err)
		}
		k := linkKind{arphd: typ}
		for _, a := range attrs {
			switch {
			case a.Attr.Type == unix.IFLA_LINKINFO:
				k.kind = infoKind(a.Value)
			case a.Attr.Type == unix.IFLA_MASTER && len(a.Value) >= 4:
				k.master = int(binary.NativeEndian.Uint32(a.Value))
			}
		}
		out[int(index)] = k
	}
	return out, nil
}

// infoKind reads IFLA_INFO_KIND out of the nested attributes of
// IFLA_LINKINFO.
func infoKind(b []byte) string {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4])
		if l < unix.SizeofRtAttr || l > len(b) {
			return ""
		}
		if typ == unix.IFLA_INFO_KIND {
			return strings.TrimRight(string(b[unix.SizeofRtAttr:l]), "\x00")
		}
		l = (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if l > len(b) {
			return ""
		}
		b = b[l:]
	}
	return ""
}

// hostWatch tells of changes to the host's addresses and interfaces: a
// value on C (never blocking the watch; one pending is enough) after each
// read of rtnetlink's notifications.
type hostWatch struct {
	f *os.File
	C chan struct{}
}

// watchHost subscribes to the rtnetlink notifications of the namespace's
// links and IPv4 and IPv6 addresses.
func watchHost() (*hostWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK,
		Groups: unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("subscribing to rtnetlink's address notifications: %w", err)
	}
	w := &hostWatch{f: os.NewFile(uintptr(fd), "rtnetlink"), C: make(chan struct{}, 1)}
	go w.read()
	return w, nil
}

// read passes the notifications on until the watch is closed. A reader too
// slow for the kernel (ENOBUFS: notifications were lost) is told all the
// same: whoever receives reads the host afresh.
func (w *hostWatch) read() {
	buf := make([]byte, 1<<16)
	for {
		_, err := w.f.Read(buf)
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			return // closed
		}
		select {
		case w.C <- struct{}{}:
		default:
		}
	}
}

// Close ends the watch.
func (w *hostWatch) Close() error { return w.f.Close() }

// notEthernet says why the XDP program cannot read an interface of kind
// k, or "": its frames have no Ethernet header (a tunnel, WireGuard, a tun
// device: the program would read the IP header as one).
func (k linkKind) notEthernet() string {
	if k.arphd != unix.ARPHRD_ETHER {
		return "its frames have no Ethernet header (a tunnel or a layer 3 device), which the XDP program reads"
	}
	return ""
}

// stacks reports whether an interface of kind k is stacked on another (a
// bridge, a bond, a VLAN, a macvlan child) or is a port of one: where the
// program runs on it and on another, one datagram may meet it twice.
func (k linkKind) stacks() bool {
	if k.master != 0 {
		return true
	}
	switch k.kind {
	case "bridge", "bond", "team", "vlan", "macvlan", "macvtap", "ipvlan", "ipvtap":
		return true
	}
	return false
}

// leftOut says why the XDP program does not go, by default, on an
// interface of kind k ("" when it does): the program runs on the devices
// that receive frames from the wire (a NIC, a container's veth), not on the
// devices stacked above them (a bridge, a VLAN, a bond, a macvlan child),
// whose frames passed the device below first, nor on a bridge's or a bond's
// ports, whose traffic is mostly not the host's (a Docker host's
// containers, a VM host's guests), nor where it cannot read the frames.
func (k linkKind) leftOut(names map[int]string) string {
	if why := k.notEthernet(); why != "" {
		return why
	}
	if k.master != 0 {
		return "a port of " + cmp.Or(names[k.master], fmt.Sprintf("interface %d", k.master))
	}
	switch k.kind {
	case "", "veth":
		return ""
	case "bridge", "bond", "team":
		return "a " + k.kind
	case "vlan":
		return "a VLAN"
	case "macvlan", "macvtap", "ipvlan", "ipvtap":
		return "a " + k.kind + " child"
	case "tun":
		return "a tap device"
	}
	return "a " + k.kind + " device"
}
