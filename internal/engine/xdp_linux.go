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

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
)

// xdpEngine is mode xdp: the BPF filter's XDP program on the interfaces
// that carry the listeners' traffic, and its socket filter on the sockets,
// which decides what arrives elsewhere (loopback) and leaves alone what the
// XDP program decided. One program serves every listener of the limiter:
// an interface carries it once, however many listeners it serves.
type xdpEngine struct {
	kernelEngine
	opts Options

	mu sync.Mutex
	// listeners are the protected sockets, with the addresses each listens
	// on (a dual-stack wildcard: both families') and the interfaces its
	// traffic arrives on.
	listeners map[*net.UDPConn]xdpListener
	// links are the program's links, by interface index.
	links map[int]*xdpLink
}

// xdpListener is a protected socket as the XDP program sees it.
type xdpListener struct {
	addrs  []netip.AddrPort
	ifaces []int
}

// xdpLink is the program on one interface and the sockets it serves there.
type xdpLink struct {
	link  *kernel.XDPLink
	name  string
	users int
}

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
	return &xdpEngine{kernelEngine: kernelEngine{f}, opts: o, listeners: map[*net.UDPConn]xdpListener{},
		links: map[int]*xdpLink{}}, nil
}

func (*xdpEngine) Mode() string { return ModeXDP }

// Protect attaches the socket filter to the socket and the XDP program to
// the interfaces its traffic arrives on (once each), and makes the program
// decide the datagrams to its address. On an error the socket is left
// without either.
func (e *xdpEngine) Protect(conn *net.UDPConn, read ReadConn) error {
	addrs, err := listenAddrs(conn)
	if err != nil {
		return err
	}
	ifaces, err := e.interfaces(addrs[0].Addr())
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
	e.listeners[conn] = xdpListener{addrs: addrs}
	err = e.setListeners()
	var attached []int
	for i := 0; err == nil && i < len(ifaces); i++ {
		if err = e.hold(ifaces[i]); err == nil {
			attached = append(attached, ifaces[i].Index)
		}
	}
	if err != nil {
		e.release(attached)
		delete(e.listeners, conn)
		if serr := e.setListeners(); serr != nil {
			err = fmt.Errorf("%w; and %w", err, serr)
		}
		if derr := kernel.Detach(conn); derr != nil && !errors.Is(derr, net.ErrClosed) {
			err = fmt.Errorf("%w; and %w", err, derr)
		}
		return err
	}
	e.listeners[conn] = xdpListener{addrs: addrs, ifaces: attached}
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
		if serr := e.setListeners(); serr != nil && err == nil {
			err = serr
		}
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
		// A failure leaves a closed socket's address listed, which
		// only makes the XDP program decide for nothing.
		_ = e.setListeners()
	}
}

// Close detaches the XDP program from every interface and closes the
// filter; the sockets keep the socket filter until they close or detach it
// (Unprotect), as in mode bpf.
func (e *xdpEngine) Close() error {
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

// XDPInterfaces lists the interfaces the program runs on, by name, with the
// listeners it serves on each.
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
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// setListeners writes every protected socket's addresses to the XDP
// program; e.mu must be held.
func (e *xdpEngine) setListeners() error {
	var all []netip.AddrPort
	for _, l := range e.listeners {
		all = append(all, l.addrs...)
	}
	return e.SetListeners(all)
}

// hold attaches the program to the interface, or counts one more user of
// it there; e.mu must be held.
func (e *xdpEngine) hold(iface net.Interface) error {
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
	e.links[iface.Index] = &xdpLink{link: x, name: iface.Name, users: 1}
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
}

// interfaces are those the XDP program runs on for a listener on addr: the
// ones the options name, else those up that hold addr (every one that is
// up for a wildcard), loopback left out: the socket filter decides what
// arrives there, and a listener on a loopback address gets no XDP program.
func (e *xdpEngine) interfaces(addr netip.Addr) ([]net.Interface, error) {
	if len(e.opts.XDPInterfaces) > 0 {
		var out []net.Interface
		for _, name := range e.opts.XDPInterfaces {
			iface, err := net.InterfaceByName(name)
			if err != nil {
				return nil, fmt.Errorf("xdp_interfaces: no interface %q on this host (`ip link` lists them)", name)
			}
			out = append(out, *iface)
		}
		return out, nil
	}
	all, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing the network interfaces: %w", err)
	}
	addr = addr.Unmap()
	var out []net.Interface
	for _, iface := range all {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		if addr.IsUnspecified() {
			out = append(out, iface)
			continue
		}
		held, err := iface.Addrs()
		if err != nil {
			return nil, fmt.Errorf("listing the addresses of %s: %w", iface.Name, err)
		}
		if slices.ContainsFunc(held, func(a net.Addr) bool {
			p, ok := a.(*net.IPNet)
			if !ok {
				return false
			}
			ip, ok := netip.AddrFromSlice(p.IP)
			return ok && ip.Unmap() == addr
		}) {
			out = append(out, iface)
		}
	}
	return out, nil
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
	"grant CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON (setcap cap_bpf,cap_perfmon,cap_net_admin,cap_net_bind_service+ep on the binary;",
	"see Privileges in the README), and name interfaces whose driver has native XDP (or set xdp_generic), to filter at the driver",
}, " ")
