// Package rakelimit is a Caddy module that protects HTTP/3 (QUIC over UDP)
// listeners from packet floods. It puts a BPF program in front of the UDP
// socket quic-go reads from, so that flood packets are dropped in the kernel
// before any handshake work: a socket filter (mode bpf), or an XDP program
// at the driver with the socket filter behind it (mode xdp); without the
// privileges to load it, the same decision runs in Caddy in front of quic-go
// (mode userspace). The program sorts datagrams by QUIC class
// (internal/decide/quicclass), verifies them by what the server sent
// (internal/packetconn/learn: its connection IDs, the peers it answered and
// their credit), drops the invalid ones, and puts the packets that open
// connections and those of established connections each through a
// hierarchical fair-share rate limiter over the source address, its
// prefixes and the ports (internal/decide/sketch). This package is the
// Caddy glue: the module, its options and Caddyfile, the commit of settings
// on start, the registry of limiters, and the views of their report.
package rakelimit

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

func init() {
	caddy.RegisterModule(RakeLimit{})
	caddy.RegisterModule(App{})
	caddy.RegisterModule(Admin{registry: limiters.registry})
}

// RakeLimit is a packet conn wrapper that rate-limits the UDP datagrams of
// the sockets it wraps in the kernel, with a BPF socket filter, before quic-go
// reads them.
//
// Datagrams are sorted by QUIC class first. Invalid ones, which no client
// sends to a server (not QUIC, truncated, Initials under 1200 bytes, Retry
// and Version Negotiation packets, source ports reflection attacks come
// from), are dropped. Long headers of a version quic-go lacks, which make it
// answer with Version Negotiation, pass at version_negotiation per second.
// Connection-opening packets (long headers: Initial, 0-RTT, Handshake) go
// through the limits of limit and level_limit; packets of established
// connections (short headers) through those of established_limit and
// established_level_limit, by default high enough for a gigabit transfer.
//
// In each class every packet is counted under generalisations of its
// source: the address, its prefixes (IPv4 /32, /24, all; IPv6 /64, /48, all),
// with the source port or any port. A stream over its limit at the most
// specific level is cut there; whatever it does not send there counts
// against the more general levels, where a flood spread over ports,
// addresses or a whole subnet is caught. The socket's total, the last level,
// is shared max-min fairly among networks, by whole sources.
//
// Levels, with the default prefixes (level: streams counted there):
//
//	0: one address and source port
//	1: one address, any port;    one /24 (/48) and source port
//	2: one /24 (/48), any port;  all sources from one source port (reflection)
//	3: all sources, any port: the socket's total
//
// Limits count packets per second. A stream that was quiet may send a burst
// of limit x window packets at once.
//
// Caddy applies packet conn wrappers when it opens a socket. A reload that
// keeps the listener address keeps the socket and the filter: new limits,
// window, dry run and allowlist take effect within a packet, with the counts
// kept. Adding the wrapper to a running listener, renaming it, or changing
// the number of prefixes or per_destination_port needs a new listener
// address or a restart.
type RakeLimit struct {
	// Name identifies the limiter across config reloads: module instances
	// with the same name share one filter, its counts and settings. Sites
	// on one listener must use the same name and settings; listeners that
	// should be limited apart need different names (otherwise they share
	// one limiter and its caps). Default: "default".
	Name string `json:"name,omitempty"`

	// Limit is the rate, in packets per second, of connection-opening
	// packets allowed to every stream at every level (unless level_limits
	// or unlimited_levels say otherwise), or of every datagram when
	// classify is off. From 1 to 10,000,000, and limit x window at most
	// 8,388,608 packets. Default: 1000.
	Limit uint32 `json:"limit,omitempty"`

	// Window is the period over which rates are smoothed, from 10ms to 1h.
	// A fresh stream may send limit x window packets back to back.
	// Default: 1s.
	Window caddy.Duration `json:"window,omitempty"`

	// LevelLimits overrides the limit, in packets per second, of whole
	// levels, keyed by level number (see above).
	LevelLimits map[int]uint32 `json:"level_limits,omitempty"`

	// UnlimitedLevels lifts the limit of these levels. The last level caps
	// the socket's total of connection-opening packets: by default at
	// 20,000 (or the limit, if higher), shared fairly among networks; with
	// classify off, at the limit.
	UnlimitedLevels []int `json:"unlimited_levels,omitempty"`

	// EstablishedLimit is the rate, in packets per second, of packets of
	// established connections (short headers) allowed to every stream at
	// every level but the last, whose total starts lifted and follows
	// quic-go's receive queue, never under this limit (unless
	// established_level_limits or established_unlimited_levels say
	// otherwise). From 1 to 10,000,000; a window over 41.9 s needs one
	// set. Default: 200,000, about 2.4 Gbit/s of full-size datagrams from
	// one source.
	EstablishedLimit uint32 `json:"established_limit,omitempty"`

	// EstablishedLevelLimits is LevelLimits for established connections.
	EstablishedLevelLimits map[int]uint32 `json:"established_level_limits,omitempty"`
	// EstablishedUnlimitedLevels is UnlimitedLevels for established
	// connections.
	EstablishedUnlimitedLevels []int `json:"established_unlimited_levels,omitempty"`

	// Classify sorts datagrams by QUIC class (see above). Off, every
	// datagram counts alike against limit and level_limits, with no
	// regard to QUIC: for comparison, or for a socket that serves
	// something else than QUIC. Default: on.
	Classify *bool `json:"classify,omitempty"`

	// BlockSourcePorts are the source ports whose datagrams are invalid:
	// ports ("53") and ranges ("0-1023"); "none" blocks none. Default:
	// every port below 1024 (no client sends from one; HAProxy blocks
	// them too), and the amplification vectors SSDP 1900, WS-Discovery
	// 3702, mDNS 5353, CoAP 5683 and memcached 11211.
	BlockSourcePorts []string `json:"block_source_ports,omitempty"`

	// VersionNegotiation is how many datagrams per second, for the whole
	// socket, with a QUIC version quic-go lacks may pass: quic-go answers
	// each with a Version Negotiation packet, which is how a client learns
	// the versions, and which a spoofed flood would reflect to its
	// victims. 0 drops them all. Default: 10.
	VersionNegotiation *uint32 `json:"version_negotiation,omitempty"`

	// IPv4Prefixes are the IPv4 source prefix lengths the levels are
	// built from, most specific first, strictly decreasing, ending with 0:
	// 1 to 4 of them. Default: 32 24 0.
	IPv4Prefixes []int `json:"ipv4_prefixes,omitempty"`
	// IPv6Prefixes are the IPv6 source prefix lengths, as IPv4Prefixes,
	// as many as those. Default: 64 48 0.
	IPv6Prefixes []int `json:"ipv6_prefixes,omitempty"`

	// PerDestinationPort adds the destination port as a dimension, for a
	// limiter (one name) shared by listeners on several ports. Default:
	// off (one port per limiter).
	PerDestinationPort bool `json:"per_destination_port,omitempty"`

	// DryRun measures, logs and counts what the limits would drop, and
	// drops nothing. A reload switches it on or off on the running socket.
	// Default: off.
	DryRun bool `json:"dry_run,omitempty"`

	// Allow exempts source prefixes (CIDR, or single addresses), IPv4 or
	// IPv6, from limiting and from counting: health checkers, monitoring,
	// office networks. Their packets are counted as allowlisted only.
	// Default: none.
	Allow []string `json:"allow,omitempty"`

	// VerifyConnectionIDs checks what clients send against what only the
	// server knows: the connection IDs it chose, each with the address it
	// sent it to, learned from the datagrams quic-go sends, the addresses
	// it talks to, each with a credit its datagrams there grant, and the
	// addresses that proved they receive what it sends there. A short
	// header that carries a server ID sent to its source, or comes from a
	// proven address, or from one it talks to on its credit, is
	// established; any other is unverified, held by a small total of its
	// own (1,000 per second per stream, 500 for the socket, shared
	// fairly); a Handshake packet that neither carries one nor comes from
	// an address the server answered is invalid, and so is a long header
	// whose lengths do not add up (RFC 9000 section 17.2). An Initial that
	// carries a server ID sent to its source passes at the established
	// limits, and one from a proven address is a returning user's: past
	// its network's limits, and first within half of the opening total
	// (credit, which a spoofer earns for an address it names, makes no
	// returning user). Needs classify. Off,
	// short headers are established on their first byte. Default: on.
	VerifyConnectionIDs *bool `json:"verify_connection_ids,omitempty"`

	// Mode chooses where datagrams are decided: "xdp" at the driver, by an
	// XDP program on the interfaces that carry the listeners' traffic
	// (see xdp_interfaces), with the BPF socket filter on the sockets for
	// what arrives elsewhere, such as loopback (Linux; the process needs
	// CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON), or refuse to start;
	// "bpf" in the kernel, by a BPF socket filter (Linux; the process
	// needs CAP_BPF and CAP_PERFMON), or refuse to start; "userspace" in
	// front of quic-go, on every system and without privileges, at the
	// cost of receiving every flood datagram (see the README); "auto", the
	// XDP program when xdp_interfaces names interfaces, the BPF filter when
	// it loads and attaches, otherwise userspace, with one warning that
	// says why. The mode of a running limiter changes only with a restart.
	// Default: auto.
	Mode string `json:"mode,omitempty"`

	// XDPInterfaces names the network interfaces the XDP program runs on
	// in mode xdp; by default those that hold a listener's address (for a
	// wildcard listener, every interface that is up but loopback). In mode
	// auto, naming interfaces makes it try XDP first. Changes only with a
	// restart. Default: none named.
	XDPInterfaces []string `json:"xdp_interfaces,omitempty"`

	// XDPGeneric runs the XDP program in generic mode, after the kernel has
	// allocated the packet, for drivers without native XDP: slower than
	// native XDP, faster than the socket filter. Changes only with a
	// restart. Default: off (native XDP, in the driver).
	XDPGeneric bool `json:"xdp_generic,omitempty"`

	// set is the decision configuration the options make, checked is
	// true once Provision made it; logger and lim are the provisioned
	// wrapper's.
	set     decide.Config
	checked bool
	logger  *zap.Logger
	lim     *engine.Limiter
	// onValidate is the limiter configuration's OnValidate: a test's
	// count of the validations of one wrapper's configuration.
	onValidate func()
}

// CaddyModule returns the Caddy module information.
func (RakeLimit) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.packetconns.rakelimit",
		New: func() caddy.Module { return new(RakeLimit) },
	}
}

// Provision checks the wrapper against its HTTP server and loads the filter
// (or joins the one already loaded under the same name), so that every
// error, from bad settings and a listener it could not protect to a missing
// CAP_BPF or CAP_PERFMON in mode bpf, fails the configuration before any
// socket is touched.
func (r *RakeLimit) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	set, err := r.config()
	if err != nil {
		return err
	}
	r.set, r.checked = set, true
	app, err := loadApp(ctx)
	if err != nil {
		return err
	}
	srv, err := serverOf(ctx)
	if err != nil {
		return err
	}
	if srv != nil {
		if len(srv.before) > 0 {
			return fmt.Errorf("packet conn wrapper %q is listed before rakelimit on server %s: rakelimit must be "+
				"the first packet conn wrapper, since it puts its own conn between quic-go and the socket (to filter "+
				"in userspace, and to learn the server's connection IDs from what quic-go writes) and would take a "+
				"wrapper beneath it out of quic-go's path; list rakelimit first", srv.before[0], srv.name)
		}
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
			if err := checkRunning(srv, r.name(), limiters.registry); err != nil {
				return err
			}
		}
	}
	if err := limiters.metrics.register(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	opts, err := r.engineOptions()
	if err != nil {
		return err
	}
	s := engine.Setting{Config: set, Mode: r.mode(), Options: opts, Logger: r.logger}
	lim, err := limiters.acquire(r.name(), s)
	if err != nil {
		return err
	}
	r.lim = lim // from here on, Cleanup releases it
	return app.govern(lim, s)
}

// Validate reports the first thing wrong with the configuration, naming the
// field and the value. Caddy calls it after Provision, which converted and
// checked the options already: it then has nothing left to check.
func (r *RakeLimit) Validate() error {
	if r.checked {
		return nil
	}
	_, err := r.config()
	return err
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

// WrapPacketConn puts the limiter in front of the socket under pc and
// returns a conn that embeds the socket, a *net.UDPConn, so that quic-go
// keeps its fast path (batched reads, GSO, ECN, path MTU discovery): it
// passes every datagram while the BPF filter decides them in the kernel,
// and decides each one in userspace mode. Caddy calls it when it opens a
// listener; it cannot fail the configuration, so a socket it cannot protect
// is logged as an error and served unprotected through that conn, and the
// next reload attaches again (in mode auto the limiter moves to userspace
// instead). Provision refuses a packet conn wrapper listed before
// rakelimit, which this would take out of quic-go's path.
func (r *RakeLimit) WrapPacketConn(pc net.PacketConn) net.PacketConn {
	conn, above := udpConn(pc)
	if conn == nil || above != "" {
		r.lim.AttachError()
		why := "no UDP socket under the packet conn"
		if conn != nil {
			why = "the packet conn wrapper " + above + " comes before rakelimit, and rakelimit must read the socket itself"
		}
		r.logger.Error("listener NOT protected: "+why,
			zap.String("limiter", r.name()), zap.String("type", fmt.Sprintf("%T", pc)))
		return pc
	}
	out, attached, err := limiters.registry.Attach(r.lim, conn)
	if err != nil {
		r.lim.AttachError()
		r.logger.Error("listener NOT protected", zap.String("limiter", r.name()),
			zap.String("listener", conn.LocalAddr().String()), zap.Error(err))
		if out == nil {
			return pc
		}
		return out
	}
	if attached {
		r.logger.Info("protecting listener", append([]zap.Field{zap.String("limiter", r.name()),
			zap.String("listener", conn.LocalAddr().String()), zap.String("mode", r.lim.Mode())},
			engine.SettingsFields(r.set)...)...)
	}
	return out
}

// Interface guards
var (
	_ caddy.Provisioner       = (*RakeLimit)(nil)
	_ caddy.Validator         = (*RakeLimit)(nil)
	_ caddy.CleanerUpper      = (*RakeLimit)(nil)
	_ caddy.PacketConnWrapper = (*RakeLimit)(nil)
	_ json.Unmarshaler        = (*RakeLimit)(nil)
)
