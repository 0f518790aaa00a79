package rakelimit

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// state is what a provisioned wrapper holds.
type state struct {
	logger *zap.Logger
	lim    *limiter
}

// Provision checks the wrapper against its HTTP server and loads the filter
// (or joins the one already loaded under the same name), so that every
// error, from bad settings and a listener it could not protect to a missing
// CAP_BPF or CAP_PERFMON in mode bpf, fails the configuration before any
// socket is touched.
func (r *RakeLimit) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	set, err := r.settings()
	if err != nil {
		return err
	}
	r.set = set
	app, err := loadApp(ctx)
	if err != nil {
		return err
	}
	srv, err := serverOf(ctx)
	if err != nil {
		return err
	}
	if srv != nil {
		first, err := app.claim(srv.name, srv.listen, r.name())
		if err != nil {
			return err
		}
		if first && len(srv.h3) == 0 {
			r.logger.Warn("rakelimit protects nothing on this server: it has no HTTP/3 listener",
				zap.String("server", srv.name), zap.Strings("listen", srv.listen),
				zap.String("limiter", r.name()), zap.String("why", srv.noH3))
		}
		if first {
			if err := checkRunning(srv, r.name()); err != nil {
				return err
			}
		}
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	lim, err := limiters.acquire(r.name(), set, r.mode(), r.logger)
	if err != nil {
		return err
	}
	r.lim = lim // from here on, Cleanup releases it
	// Each configuration load has its own metrics registry: it tells two
	// wrappers of one load from a reload.
	return lim.provision(app, ctx.GetMetricsRegistry(), set, r.mode(), r.logger)
}

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
	hs := &httpServer{name: srv.Name(), listen: srv.Listen}
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
// under the same name. Adding rakelimit to a running listener, or renaming
// its limiter, needs a restart or a new listener address.
func checkRunning(srv *httpServer, name string) error {
	for _, a := range srv.h3 {
		hostport := a.JoinHostPort(0)
		if caddy.ListenerUsage("quic"+a.Network, hostport) == 0 {
			continue // a new socket: the http app's start wraps it
		}
		owner, ok := limiters.ownerOf(func(c *net.UDPConn) bool { return socketIs(a, c) })
		switch {
		case !ok:
			return fmt.Errorf("cannot add rakelimit %q to the running HTTP/3 listener %s/%s of server %s: "+
				"Caddy keeps its socket across a reload without calling packet conn wrappers, so it would stay "+
				"unprotected; restart Caddy to add rakelimit to a running listener (or use a new listener address)",
				name, a.Network, hostport, srv.name)
		case owner.name != name:
			return fmt.Errorf("cannot rename rakelimit %q to %q on the running HTTP/3 listener %s/%s of server %s: "+
				"its socket keeps the filter of %q until it closes; restart Caddy to rename a limiter "+
				"(or use a new listener address)", owner.name, name, a.Network, hostport, srv.name, owner.name)
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

// Cleanup releases the limiter; the last wrapper of a name to go detaches
// its filter from the sockets that remain and closes it.
func (r *RakeLimit) Cleanup() error {
	if r.lim == nil {
		return nil
	}
	r.lim = nil
	return limiters.release(r.name())
}

// WrapPacketConn puts the limiter in front of the socket under pc: it
// attaches the BPF filter and returns the socket itself, a *net.UDPConn, or
// in userspace mode returns a conn that decides each datagram before quic-go
// reads it; either way quic-go keeps its fast path (batched reads, GSO, ECN,
// path MTU discovery). Caddy calls it when it opens a listener; it cannot
// fail the configuration, so a socket it cannot protect is logged as an
// error and served unprotected.
func (r *RakeLimit) WrapPacketConn(pc net.PacketConn) net.PacketConn {
	conn := udpConn(pc)
	if conn == nil {
		r.lim.attachErrors.Add(1)
		r.logger.Error("listener NOT protected: no UDP socket under the packet conn",
			zap.String("limiter", r.name()), zap.String("type", fmt.Sprintf("%T", pc)))
		return pc
	}
	out, attached, err := r.lim.attach(conn)
	if err != nil {
		r.lim.attachErrors.Add(1)
		r.logger.Error("listener NOT protected", zap.String("limiter", r.name()),
			zap.String("listener", conn.LocalAddr().String()), zap.Error(err))
		return conn
	}
	if attached {
		r.logger.Info("protecting listener", append([]zap.Field{zap.String("limiter", r.name()),
			zap.String("listener", conn.LocalAddr().String()), zap.String("mode", r.lim.modeNow())},
			settingsFields(r.set)...)...)
	}
	return out
}

// udpConn finds the *net.UDPConn under Caddy's wrappers.
func udpConn(pc net.PacketConn) *net.UDPConn {
	for pc != nil {
		if c, ok := pc.(*net.UDPConn); ok {
			return c
		}
		u, ok := pc.(interface{ Unwrap() net.PacketConn })
		if !ok {
			return nil
		}
		pc = u.Unwrap()
	}
	return nil
}
