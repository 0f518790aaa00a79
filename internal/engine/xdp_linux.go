//go:build linux

package engine

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
)

// xdpEngine is mode xdp: the BPF filter's XDP program on the interfaces
// that carry the listeners' traffic, and its socket filter on the sockets,
// which decides every datagram the XDP program did not pass (what arrives
// elsewhere, loopback among them, and what it did not see as a listener's;
// c/listen.h). One program serves every listener of the limiter: an
// interface carries it once, however many listeners it serves. It fails
// closed: an interface that refuses the program leaves its traffic to the
// socket filter, which a socket always has.
type xdpEngine struct {
	kernelEngine
	opts Options

	mu sync.Mutex
	// listeners are the protected sockets, with the addresses each listens
	// on (a dual-stack wildcard: both families'), the interfaces its
	// traffic arrives on where the program runs, and those where it does
	// not.
	listeners map[*net.UDPConn]xdpListener
	// links are the program's links, by interface index.
	links map[int]*xdpLink
	// table is what the program was last told of the listeners
	// (xdpTargets), written says it was; tableErr the last failure to
	// write it; watchErr why rtnetlink does not tell of the host's
	// changes.
	table              xdpTable
	written            bool
	tableErr, watchErr error
	// stacked is what the program was last told of its interfaces
	// (setStacked).
	stacked bool

	watch    *hostWatch
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// xdpListener is a protected socket as the XDP program sees it.
type xdpListener struct {
	addrs  []netip.AddrPort
	ifaces []int
	// without are the interfaces of its traffic where the program does
	// not run: the socket filter alone decides what arrives there.
	without []socketOnly
}

// socketOnly is an interface where the XDP program does not run for a
// listener, and why: the kernel refused it, or it was left out by default.
type socketOnly struct {
	name, reason string
	leftOut      bool
}

// xdpLink is the program on one interface and the sockets it serves there;
// stacks: the interface is stacked on another or a port of one
// (linkKind.stacks).
type xdpLink struct {
	link   *kernel.XDPLink
	name   string
	users  int
	stacks bool
}

// hostRefresh is how often the engine reads the host's UDP sockets again
// (another process's socket bound to one of the host's addresses on a
// listener's port takes that address out of the XDP program's table);
// rtnetlink tells of addresses as they come and go.
const hostRefresh = 5 * time.Second

// OpenXDP loads the BPF filter with its XDP program for c, after checking
// what the program needs that loading does not: CAP_NET_ADMIN, and the
// interfaces o names. Nothing is attached until a socket is protected.
func OpenXDP(c decide.Config, o Options) (Engine, error) {
	if err := kernel.CheckXDP(); err != nil {
		return nil, err
	}
	for _, name := range o.XDPInterfaces {
		if _, err := net.InterfaceByName(name); err != nil {
			return nil, fmt.Errorf("xdp_interfaces: no interface %q on this host (`ip link` lists them)", name)
		}
	}
	f, err := kernel.LoadXDP(c, o.HashKey)
	if err != nil {
		return nil, err
	}
	e := &xdpEngine{kernelEngine: kernelEngine{f}, opts: o, listeners: map[*net.UDPConn]xdpListener{},
		links: map[int]*xdpLink{}, stop: make(chan struct{}), done: make(chan struct{})}
	// Without rtnetlink's notifications (a seccomp profile may refuse
	// them), the host is read every hostRefresh alone.
	if e.watch, err = watchHost(); err != nil {
		e.watchErr = err
	}
	go e.follow()
	return e, nil
}

func (*xdpEngine) Mode() string { return ModeXDP }

// follow keeps the XDP program's table of destinations current: at each
// change rtnetlink tells of, and every hostRefresh.
func (e *xdpEngine) follow() {
	defer close(e.done)
	var changed <-chan struct{}
	if e.watch != nil {
		changed = e.watch.C
	}
	tick := time.NewTicker(hostRefresh)
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-changed:
		case <-tick.C:
		}
		e.mu.Lock()
		e.setListeners()
		e.mu.Unlock()
	}
}

// Protect attaches the socket filter to the socket and the XDP program to
// the interfaces its traffic arrives on (once each), and makes the program
// decide the datagrams to its addresses. Only a socket filter that cannot
// attach fails it, leaving the socket without either: an interface that
// refuses the program (the kernel, or xdp_interfaces naming a device
// without an Ethernet header) is reported (XDPInterfaces), its traffic
// decided by the socket filter, and when one refuses it and none takes it
// Protect returns a *SocketFilterOnlyError with the socket protected.
func (e *xdpEngine) Protect(conn *net.UDPConn, read ReadConn) error {
	addrs, err := listenAddrs(conn)
	if err != nil {
		return err
	}
	ifaces, without, kinds, err := e.interfaces(addrs[0].Addr())
	if err != nil {
		return err
	}
	if err := e.kernelEngine.Protect(conn, read); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgetClosed()
	if old, ok := e.listeners[conn]; ok { // protected again: start afresh
		e.release(old.ifaces)
	}
	l := xdpListener{addrs: addrs, without: without}
	var refused []string
	for _, w := range without {
		if !w.leftOut { // named, and refused: no Ethernet header
			refused = append(refused, w.reason)
		}
	}
	for _, iface := range ifaces {
		if err := e.hold(iface, kinds[iface.Index].stacks()); err != nil {
			l.without = append(l.without, socketOnly{name: iface.Name, reason: err.Error()})
			refused = append(refused, err.Error())
			continue
		}
		l.ifaces = append(l.ifaces, iface.Index)
	}
	e.listeners[conn] = l
	e.setListeners()
	e.setStacked()
	if len(refused) > 0 && len(l.ifaces) == 0 {
		return &SocketFilterOnlyError{Listener: conn.LocalAddr().String(), Refused: refused}
	}
	return nil
}

// Unprotect takes the socket filter away from the socket, and the XDP
// program from the interfaces no other socket needs it on.
func (e *xdpEngine) Unprotect(conn *net.UDPConn) (bool, error) {
	open, err := e.kernelEngine.Unprotect(conn)
	e.mu.Lock()
	defer e.mu.Unlock()
	if l, ok := e.listeners[conn]; ok {
		delete(e.listeners, conn)
		e.release(l.ifaces)
		e.setListeners()
	}
	return open, err
}

// ForgetClosed lets go of the sockets closed since they were protected (a
// reload that removed a listener): their addresses and interfaces.
func (e *xdpEngine) ForgetClosed() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgetClosed()
}

// forgetClosed is ForgetClosed with e.mu held.
func (e *xdpEngine) forgetClosed() {
	gone := false
	for c, l := range e.listeners {
		if IsClosed(c) {
			delete(e.listeners, c)
			e.release(l.ifaces)
			gone = true
		}
	}
	if gone {
		e.setListeners()
	}
}

// Close detaches the XDP program from every interface and closes the
// filter; the sockets keep the socket filter until they close or detach it
// (Unprotect), as in mode bpf.
func (e *xdpEngine) Close() error {
	e.stopOnce.Do(func() {
		close(e.stop)
		if e.watch != nil {
			e.watch.Close()
		}
	})
	<-e.done
	e.mu.Lock()
	var errs []error
	for i, l := range e.links {
		if err := l.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", l.name, err))
		}
		delete(e.links, i)
	}
	e.mu.Unlock()
	errs = append(errs, e.kernelEngine.Close())
	return errors.Join(errs...)
}

// XDPInterfaces lists, by name, the interfaces the program runs on, with
// the listeners it serves on each, and those of the listeners' traffic
// where it does not (the socket filter alone decides there), with why.
func (e *xdpEngine) XDPInterfaces() []report.XDPInterface {
	e.mu.Lock()
	defer e.mu.Unlock()
	attach := report.XDPNative
	if e.opts.XDPGeneric {
		attach = report.XDPGeneric
	}
	var out []report.XDPInterface
	for i, l := range e.links {
		x := report.XDPInterface{Name: l.name, Attach: attach, Listeners: []string{}}
		for c, ln := range e.listeners {
			if slices.Contains(ln.ifaces, i) {
				x.Listeners = append(x.Listeners, c.LocalAddr().String())
			}
		}
		sort.Strings(x.Listeners)
		out = append(out, x)
	}
	only := map[string]*report.XDPInterface{}
	for c, ln := range e.listeners {
		for _, w := range ln.without {
			x := only[w.name]
			if x == nil {
				x = &report.XDPInterface{Name: w.name, Attach: report.XDPSocketFilterOnly, Reason: w.reason,
					LeftOut: w.leftOut, Listeners: []string{}}
				only[w.name] = x
			}
			x.Listeners = append(x.Listeners, c.LocalAddr().String())
		}
	}
	for _, x := range only {
		sort.Strings(x.Listeners)
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// XDPTableError is the last failure to write the XDP program's table of
// destinations, or to read the host for it, or nil: the program then
// decides for the destinations it had (the socket filter for the rest).
// Without rtnetlink's notifications it says so too: the host is then read
// every hostRefresh.
func (e *xdpEngine) XDPTableError() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return errors.Join(e.tableErr, e.watchErr)
}

// setListeners writes to the XDP program the destinations of every
// protected socket (xdpTargets: a wildcard's, the host's addresses now)
// when they changed, and records a failure (XDPTableError); e.mu must be
// held.
func (e *xdpEngine) setListeners() {
	var all []netip.AddrPort
	var ports []uint16
	wild := false
	for _, l := range e.listeners {
		for _, a := range l.addrs {
			all = append(all, a)
			if a.Addr().IsUnspecified() {
				wild = true
				ports = append(ports, a.Port())
			}
		}
	}
	var host []netip.Addr
	bound := map[netip.AddrPort]bool{}
	var err error
	if wild {
		if host, err = hostAddrs(); err == nil {
			bound, err = boundSockets(ports)
		}
		if err != nil {
			e.tableErr = err
			return
		}
	}
	t := xdpTargets(all, host, bound)
	if e.written && t.equal(e.table) {
		return
	}
	if err := e.SetListeners(t.addrs, t.host); err != nil {
		e.tableErr = err
		return
	}
	e.table, e.written, e.tableErr = t, true, nil
}

// setStacked tells the program whether it runs on two interfaces of which
// one is stacked on another or a port of one (kernel.Program.SetXDPStacked):
// never with the interfaces chosen by default, which leave those out; e.mu
// must be held. A failure leaves it as it was: off, a datagram that meets
// the program twice is decided twice, never not at all.
func (e *xdpEngine) setStacked() {
	stacked := false
	if len(e.links) >= 2 {
		for _, l := range e.links {
			stacked = stacked || l.stacks
		}
	}
	if stacked != e.stacked && e.SetXDPStacked(stacked) == nil {
		e.stacked = stacked
	}
}

// hold attaches the program to the interface, or counts one more user of
// it there; stacks says the interface is stacked on another or a port of
// one; e.mu must be held.
func (e *xdpEngine) hold(iface net.Interface, stacks bool) error {
	if l, ok := e.links[iface.Index]; ok {
		l.users++
		return nil
	}
	if len(e.links) >= kernel.MaxXDPInterfaces {
		return fmt.Errorf("the XDP program runs on at most %d interfaces", kernel.MaxXDPInterfaces)
	}
	x, err := e.AttachXDP(iface.Index, iface.Name, e.opts.XDPGeneric)
	if err != nil {
		return err
	}
	e.links[iface.Index] = &xdpLink{link: x, name: iface.Name, users: 1, stacks: stacks}
	return nil
}

// release counts one user fewer of the program on each interface, and
// detaches it from those it no longer serves; e.mu must be held.
func (e *xdpEngine) release(ifaces []int) {
	for _, i := range ifaces {
		l, ok := e.links[i]
		if !ok {
			continue
		}
		if l.users--; l.users > 0 {
			continue
		}
		delete(e.links, i)
		// The link's close detaches the program; an error leaves
		// nothing to do but let the process's exit close it.
		_ = l.link.Close()
	}
	e.setStacked()
}

// interfaces are those the XDP program goes on for a listener on addr, and
// those of its traffic it does not go on, with why; and the kinds of the
// host's interfaces, by index. Named in the options:
// those, but one whose frames it cannot read (no Ethernet header). Else
// those up that hold addr (every one that is up for a wildcard), but
// loopback (the socket filter decides what arrives there: a listener on a
// loopback address gets no XDP program) and the ones it leaves out by
// default (linkKind.leftOut: bridges, VLANs, bonds and their ports,
// tunnels), which it reports.
func (e *xdpEngine) interfaces(addr netip.Addr) ([]net.Interface, []socketOnly, map[int]linkKind, error) {
	kinds, err := linkKinds()
	if err != nil {
		return nil, nil, nil, err
	}
	var out []net.Interface
	var without []socketOnly
	if len(e.opts.XDPInterfaces) > 0 {
		for _, name := range e.opts.XDPInterfaces {
			iface, err := net.InterfaceByName(name)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("xdp_interfaces: no interface %q on this host (`ip link` lists them)", name)
			}
			if why := kinds[iface.Index].notEthernet(); why != "" {
				without = append(without, socketOnly{name: name, reason: fmt.Sprintf("xdp_interfaces: %s: %s", name, why)})
				continue
			}
			out = append(out, *iface)
		}
		return out, without, kinds, nil
	}
	all, err := net.Interfaces()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listing the network interfaces: %w", err)
	}
	names := map[int]string{}
	for _, iface := range all {
		names[iface.Index] = iface.Name
	}
	addr = addr.Unmap()
	for _, iface := range all {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		if !addr.IsUnspecified() {
			held, err := iface.Addrs()
			if err != nil {
				return nil, nil, nil, fmt.Errorf("listing the addresses of %s: %w", iface.Name, err)
			}
			if !slices.ContainsFunc(held, func(a net.Addr) bool {
				p, ok := a.(*net.IPNet)
				if !ok {
					return false
				}
				ip, ok := netip.AddrFromSlice(p.IP)
				return ok && ip.Unmap() == addr
			}) {
				continue
			}
		}
		if why := kinds[iface.Index].leftOut(names); why != "" {
			without = append(without, socketOnly{name: iface.Name, reason: why, leftOut: true})
			continue
		}
		out = append(out, iface)
	}
	return out, without, kinds, nil
}

// listenAddrs are the addresses a socket receives datagrams to: its local
// address, and for a dual-stack IPv6 wildcard socket the IPv4 wildcard too.
func listenAddrs(conn *net.UDPConn) ([]netip.AddrPort, error) {
	ap := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	ap = netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
	out := []netip.AddrPort{ap}
	if !ap.Addr().Is6() || !ap.Addr().IsUnspecified() {
		return out, nil
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("reading the socket: %w", err)
	}
	var only int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		only, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
	}); err != nil {
		return nil, fmt.Errorf("reading the socket: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("reading IPV6_V6ONLY: %w", serr)
	}
	if only == 0 {
		out = append(out, netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port()))
	}
	return out, nil
}

// XDPGrant says what gives a process the XDP program.
var XDPGrant = strings.Join([]string{
	"grant CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON (setcap cap_bpf,cap_perfmon,cap_net_admin,cap_net_bind_service+p on the binary;",
	"see Privileges in the README), and name interfaces whose driver has native XDP (or set xdp_generic), to filter at the driver",
}, " ")
