//go:build linux

package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// What the XDP program decides on a port (struct listen_table in
// c/maps.h), by family: the datagrams to the host's addresses (a wildcard
// listener), or to some addresses, listed in listen_addrs.
const (
	listenHost4 = 1 // C: LISTEN_HOST4
	listenHost6 = 2 // C: LISTEN_HOST6
	listenSome4 = 4 // C: LISTEN_SOME4
	listenSome6 = 8 // C: LISTEN_SOME6
)

// The capacities of the XDP program's tables: the host's addresses of each
// family it scans for a wildcard listener, the listener addresses it looks
// up, the interfaces it runs on, and the slots of each CPU's record of the
// datagrams it passed (a power of 2; c/listen.h).
const (
	MaxHostAddrs     = 8    // C: MAX_HOST_ADDRS
	MaxListenAddrs   = 4096 // C: MAX_LISTEN_ADDRS
	MaxXDPInterfaces = 256  // C: MAX_XDP_INTERFACES
	xdpPassedSlots   = 1024 // C: XDP_PASSED_SLOTS
)

// passedMarkWords is how many 64-bit words a passed datagram's mark takes
// (its source address's two, its payload's first three), each with two
// 32-bit words of the load's mark key (c/listen.h).
const passedMarkWords = 5 // C: PASSED_MARK_WORDS

// XDPProgram returns the filter's XDP program (nil unless LoadXDP or
// LoadBench with XDP loaded it; the benchmark entry with RandomSource),
// for BPF_PROG_TEST_RUN. It stays owned by the filter: Close closes it.
func (f *Program) XDPProgram() *ebpf.Program {
	return f.objs.RakelimitXdp
}

// SetListeners makes the XDP program decide the datagrams to addrs, and
// pass every other frame untouched (c/listen.h). An address of the host
// and a port stands for itself; an unspecified one (0.0.0.0, ::) for the
// host's addresses of its family, host (at most MaxHostAddrs of each, the
// rest refused); an IPv4-mapped address for the IPv4 address. New
// addresses are listed before the ports that send the program to them,
// and old ones removed after.
func (f *Program) SetListeners(addrs []netip.AddrPort, host []netip.Addr) error {
	var table rakelimitListenTable
	for _, h := range host {
		h = h.Unmap()
		k := listenKey(h, 0)
		switch {
		case !h.IsValid() || h.IsUnspecified():
			return fmt.Errorf("the XDP program decides for the host's addresses, and %v is none", h)
		case h.Is4() && table.Host4N == MaxHostAddrs, h.Is6() && table.Host6N == MaxHostAddrs:
			return fmt.Errorf("the XDP program scans at most %d host addresses of a family; list the addresses instead", MaxHostAddrs)
		case h.Is4():
			table.Host4[table.Host4N] = k.Addr[0]
			table.Host4N++
		default:
			table.Host6[table.Host6N] = k.Addr
			table.Host6N++
		}
	}
	want := map[rakelimitListenKey]bool{}
	for _, ap := range addrs {
		a, port := ap.Addr().Unmap(), ap.Port()
		switch {
		case !a.IsValid():
			return fmt.Errorf("the XDP program decides for addresses, and listener %v names none", ap)
		case a.IsUnspecified() && a.Is4():
			table.Kinds[port] |= listenHost4
		case a.IsUnspecified():
			table.Kinds[port] |= listenHost6
		case a.Is4():
			table.Kinds[port] |= listenSome4
			want[listenKey(a, port)] = true
		default:
			table.Kinds[port] |= listenSome6
			want[listenKey(a, port)] = true
		}
	}
	if room := int(f.objs.ListenAddrs.MaxEntries()); len(want) > room {
		return fmt.Errorf("the XDP program decides for at most %d listener addresses, and %d are asked", room, len(want))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range want {
		if err := f.objs.ListenAddrs.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("listing a listener for the XDP program: %w", err)
		}
	}
	if err := f.objs.ListenPorts.Put(uint32(0), &table); err != nil {
		return fmt.Errorf("writing the XDP program's listener ports: %w", err)
	}
	for k := range f.listening {
		if !want[k] {
			if err := f.objs.ListenAddrs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("removing a listener of the XDP program: %w", err)
			}
		}
	}
	f.listening = want
	return nil
}

// listenKey is the key of listen_addrs for an address (unmapped) and port:
// the address's bytes as the program loads them from the IP header.
func listenKey(a netip.Addr, port uint16) rakelimitListenKey {
	k := rakelimitListenKey{Port: port}
	if a.Is4() {
		b := a.As4()
		k.Family = 4
		k.Addr[0] = binary.NativeEndian.Uint32(b[:])
		return k
	}
	b := a.As16()
	k.Family = 6
	for i := range k.Addr {
		k.Addr[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return k
}

// XDPLink is the filter's XDP program on one interface, attached by a BPF
// link: the kernel detaches it when the link's last file descriptor
// closes, at Close or when the process exits, however it exits.
type XDPLink struct {
	f       *Program
	link    link.Link
	ifindex int
}

// AttachXDP attaches the filter's XDP program to the interface of index
// ifindex and name (for errors), in the driver (native XDP) or, with
// generic, after the kernel has allocated the skb (generic XDP, for
// drivers without native XDP). The socket filter then leaves alone the
// datagrams the XDP program passed there (c/listen.h). The link is
// created with CAP_NET_ADMIN raised (withCapabilities); closing it, and
// the listener tables the program reads, need no capability.
func (f *Program) AttachXDP(ifindex int, name string, generic bool) (*XDPLink, error) {
	if f.objs.RakelimitXdp == nil {
		return nil, errors.New("the filter was loaded without its XDP program (LoadXDP loads it)")
	}
	flags := link.XDPDriverMode
	if generic {
		flags = link.XDPGenericMode
	}
	if err := f.markXDP(uint32(ifindex), true); err != nil {
		return nil, err
	}
	var l link.Link
	err := withCapabilities(attachXDPCaps, func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: f.objs.RakelimitXdp, Interface: ifindex, Flags: flags})
		return err
	})
	if err != nil && l != nil { // attached, when lowering the capabilities failed
		l.Close()
	}
	if err != nil {
		if merr := f.markXDP(uint32(ifindex), false); merr != nil {
			err = fmt.Errorf("%w; and %w", err, merr)
		}
		return nil, explainXDP(err, name, generic, missingXDPCapabilities())
	}
	return &XDPLink{f: f, link: l, ifindex: ifindex}, nil
}

// Close detaches the program from the interface; the socket filter
// decides what arrives there from then on.
func (x *XDPLink) Close() error {
	if err := x.link.Close(); err != nil {
		return fmt.Errorf("detaching the XDP program: %w", err)
	}
	return x.f.markXDP(uint32(x.ifindex), false)
}

// markXDP counts an interface the XDP program runs on, or one fewer, for
// the socket filter (xdp_interfaces: without any, it does not look for the
// program's records). An interface is counted before the program runs
// there and after it stopped, so that no record goes unread.
func (f *Program) markXDP(ifindex uint32, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.xdpOn == nil {
		f.xdpOn = map[uint32]bool{}
	}
	if on {
		f.xdpOn[ifindex] = true
	} else {
		delete(f.xdpOn, ifindex)
	}
	if err := f.objs.XdpInterfaces.Set(uint32(len(f.xdpOn))); err != nil {
		return fmt.Errorf("counting the XDP program's interfaces: %w", err)
	}
	return nil
}

// SetXDPStacked tells the XDP program whether it runs on two interfaces of
// one path (a bridge and its port, a VLAN and its parent), where a datagram
// may meet it twice: it then passes undecided a datagram it finds a record
// of (c/listen.h). Off, a run looks for no record.
func (f *Program) SetXDPStacked(on bool) error {
	v := uint32(0)
	if on {
		v = 1
	}
	if err := f.objs.XdpStacked.Set(v); err != nil {
		return fmt.Errorf("telling the XDP program it runs on stacked interfaces: %w", err)
	}
	return nil
}

// CheckXDP reports what keeps the process from running the XDP program:
// the capabilities it lacks (CAP_NET_ADMIN besides CAP_BPF and
// CAP_PERFMON), or nil.
func CheckXDP() error {
	if missing := missingXDPCapabilities(); len(missing) > 0 {
		return fmt.Errorf("the XDP program needs CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON, and the process lacks %s; "+
			"grant them with `setcap cap_bpf,cap_perfmon,cap_net_admin,cap_net_bind_service+p %s` or, under systemd, "+
			"AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_ADMIN CAP_NET_BIND_SERVICE (see Privileges in the README)",
			strings.Join(missing, " and "), executable())
	}
	return nil
}

// missingXDPCapabilities names the capabilities the process lacks to run
// the XDP program: those of the socket filter, and CAP_NET_ADMIN.
func missingXDPCapabilities() []string {
	missing := missingCapabilities()
	if !hasCapability(unix.CAP_NET_ADMIN) {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	return missing
}

// explainXDP turns the kernel's refusal to attach the XDP program to the
// interface name into a one-line error that says what to do.
func explainXDP(err error, name string, generic bool, missing []string) error {
	what := fmt.Sprintf("attaching the rakelimit XDP program to %s", name)
	if generic {
		what += " (generic XDP)"
	}
	switch {
	case len(missing) > 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)):
		return fmt.Errorf("%s: %w: the process lacks %s (mode xdp needs CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON; "+
			"see Privileges in the README)", what, err, strings.Join(missing, " and "))
	case !generic && errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("%s: %w: its driver has no native XDP; set xdp_generic to run the program after the kernel "+
			"allocates the packet (slower), or use mode bpf", what, err)
	case errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%s: %w: the interface has an XDP program already, another limiter's or another tool's "+
			"(ip link show %s); an interface runs one, so limiters in mode xdp on one interface must share a name",
			what, err, name)
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ERANGE):
		return fmt.Errorf("%s: %w: the driver refuses it in this configuration (an MTU too large for XDP, or "+
			"another XDP mode in use on the interface); see the kernel log (dmesg)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
