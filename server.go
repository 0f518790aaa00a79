package rakelimit

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// Which server and which socket a wrapper protects: the HTTP server being
// provisioned, its HTTP/3 sockets, the packet conn wrappers before
// rakelimit, and the UDP socket under the packet conn Caddy hands over.

// httpServer is what a wrapper needs to know of the HTTP server whose
// sockets it wraps.
type httpServer struct {
	name   string
	listen []string
	// h3 are the addresses of the server's HTTP/3 sockets, one per port,
	// on the network Caddy opens them (udp, udp4, udp6 or fdgram).
	h3 []caddy.NetworkAddress
	// noH3 says why listen addresses have no HTTP/3 socket.
	noH3 string
	// before are the packet conn wrappers listed before rakelimit.
	before []string
}

// http3Networks maps a listener's network to its HTTP/3 socket's, as the
// http app does.
var http3Networks = map[string]string{
	"tcp": "udp", "tcp4": "udp4", "tcp6": "udp6", "udp": "udp", "udp4": "udp4", "udp6": "udp6", "fdgram": "fdgram",
}

// serverOf describes the HTTP server whose packet conn wrappers are being
// provisioned, with the HTTP/3 sockets its start will open (the rules of
// the http app's Start); nil when no HTTP server provisions the wrapper.
func serverOf(ctx caddy.Context) (*httpServer, error) {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return nil, nil
	}
	httpPort := caddyhttp.DefaultHTTPPort
	for _, m := range ctx.Modules() {
		if app, ok := m.(*caddyhttp.App); ok && app.HTTPPort != 0 {
			httpPort = app.HTTPPort
		}
	}
	before, err := wrappersBefore(srv.PacketConnWrappersRaw)
	if err != nil {
		return nil, fmt.Errorf("server %s: %w", srv.Name(), err)
	}
	hs := &httpServer{name: srv.Name(), listen: srv.Listen, before: before}
	var why []string
	for i, ln := range srv.Listen {
		addr, err := caddy.ParseNetworkAddress(ln)
		if err != nil {
			return nil, fmt.Errorf("server %s: parsing listen address %q: %w", srv.Name(), ln, err)
		}
		protocols := srv.Protocols
		if srv.ListenProtocols != nil && srv.ListenProtocols[i] != nil {
			protocols = srv.ListenProtocols[i]
		}
		h3net, ok := http3Networks[strings.ToLower(addr.Network)]
		switch {
		case !slices.Contains(protocols, "h3"):
			why = append(why, fmt.Sprintf("%s: its protocols (%s) leave out h3", ln, strings.Join(protocols, " ")))
			continue
		case !ok:
			why = append(why, fmt.Sprintf("%s: network %s carries no HTTP/3", ln, addr.Network))
			continue
		}
		for off := range addr.PortRangeSize() {
			if len(srv.TLSConnPolicies) == 0 || int(addr.StartPort+off) == httpPort {
				why = append(why, fmt.Sprintf("%s: HTTP/3 needs TLS, and this listener serves plain HTTP", addr.JoinHostPort(off)))
				continue
			}
			a := addr.At(off)
			a.Network = h3net
			hs.h3 = append(hs.h3, a)
		}
	}
	hs.noH3 = strings.Join(why, "; ")
	return hs, nil
}

// checkRunning refuses a wrapper that would leave a running listener
// unprotected. Caddy keeps the socket of a listener whose address stays
// across a reload and does not call packet conn wrappers on it: a limiter
// can govern such a socket only if its filter is already attached there,
// under the same name (reg says who owns each socket). Adding rakelimit to
// a running listener, or renaming its limiter, needs a restart or a new
// listener address.
func checkRunning(srv *httpServer, name string, reg *engine.Registry) error {
	for _, a := range srv.h3 {
		hostport := a.JoinHostPort(0)
		if caddy.ListenerUsage("quic"+a.Network, hostport) == 0 {
			continue // a new socket: the http app's start wraps it
		}
		owner, ok := reg.Owner(func(c *net.UDPConn) bool { return socketIs(a, c) })
		switch {
		case !ok:
			return fmt.Errorf("cannot add rakelimit %q to the running HTTP/3 listener %s/%s of server %s: "+
				"Caddy keeps its socket across a reload without calling packet conn wrappers, so it would stay "+
				"unprotected; restart Caddy to add rakelimit to a running listener (or use a new listener address)",
				name, a.Network, hostport, srv.name)
		case owner.Name() != name:
			return fmt.Errorf("cannot rename rakelimit %q to %q on the running HTTP/3 listener %s/%s of server %s: "+
				"its socket keeps the filter of %q until it closes; restart Caddy to rename a limiter "+
				"(or use a new listener address)", owner.Name(), name, a.Network, hostport, srv.name, owner.Name())
		}
	}
	return nil
}

// socketIs reports whether conn is the socket of the HTTP/3 listener a:
// the same inode for a file descriptor network, else the same port and
// local address.
func socketIs(a caddy.NetworkAddress, conn *net.UDPConn) bool {
	if a.IsFdNetwork() {
		fd, err := strconv.Atoi(a.Host)
		return err == nil && sameSocketFile(fd, conn)
	}
	la, ok := conn.LocalAddr().(*net.UDPAddr)
	if !ok || la.Port != int(a.StartPort) {
		return false
	}
	local, _ := netip.AddrFromSlice(la.IP)
	local = local.Unmap()
	if a.Host == "" {
		return local.IsUnspecified()
	}
	if ip, err := netip.ParseAddr(a.Host); err == nil {
		return ip.Unmap() == local
	}
	ips, err := net.LookupIP(a.Host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if resolved, ok := netip.AddrFromSlice(ip); ok && resolved.Unmap() == local {
			return true
		}
	}
	return false
}

// caddyPackage is the package of Caddy's own packet conns, which wrap the
// socket only to share it and close it, and which Caddy itself takes away
// when a listener has no packet conn wrapper.
const caddyPackage = "github.com/caddyserver/caddy/v2"

// udpConn finds the *net.UDPConn under Caddy's own packet conns; above names
// the type of the first other wrapper on the way, if any.
func udpConn(pc net.PacketConn) (conn *net.UDPConn, above string) {
	for pc != nil {
		if c, ok := pc.(*net.UDPConn); ok {
			return c, above
		}
		if t := reflect.TypeOf(pc); above == "" && !strings.HasPrefix(pkgPath(t), caddyPackage) {
			above = t.String()
		}
		u, ok := pc.(interface{ Unwrap() net.PacketConn })
		if !ok {
			return nil, above
		}
		pc = u.Unwrap()
	}
	return nil, above
}

// pkgPath is the package of a type or of what it points to.
func pkgPath(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}

// wrappersBefore returns the packet conn wrappers the HTTP server lists
// before the first rakelimit wrapper, by module name.
func wrappersBefore(raw []json.RawMessage) ([]string, error) {
	var names []string
	for _, r := range raw {
		var w struct {
			Wrapper string `json:"wrapper"`
		}
		if err := json.Unmarshal(r, &w); err != nil {
			return nil, fmt.Errorf("reading packet_conn_wrappers: %w", err)
		}
		if w.Wrapper == "rakelimit" {
			return names, nil
		}
		names = append(names, w.Wrapper)
	}
	return names, nil
}
