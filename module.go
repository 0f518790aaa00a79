// Package rakelimit is a Caddy module that protects HTTP/3 (QUIC over UDP)
// listeners from packet floods. It attaches a BPF socket filter to the UDP
// socket quic-go reads from, so that flood packets are dropped in the kernel,
// before any handshake work. The filter sorts datagrams by QUIC class
// (internal/quicclass): invalid ones are dropped, packets that open
// connections and packets of established connections each go through a
// hierarchical fair-share rate limiter over the source address, its prefixes
// and the ports (internal/sketch).
package rakelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/bpf"
	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

func init() {
	caddy.RegisterModule(RakeLimit{})
	caddy.RegisterModule(App{})
}

// Defaults for options left out.
const (
	DefaultName   = "default"
	DefaultLimit  = 1000
	DefaultWindow = time.Second
	// DefaultOpeningTotal caps the connection-opening packets of the whole
	// socket (the last level of the opening class) when classifying, with
	// the cap shared fairly among networks: of the caps measured on a
	// 2-core machine (README, "Choosing numbers"), the one that served a
	// quiet network's new connections as well as any higher cap, with a
	// third of quic-go's receive-queue overflows and half the latency of
	// 50,000. A limit above it raises the cap to the limit.
	DefaultOpeningTotal = 20_000
	// DefaultEstablishedLimit is the limit of established-connection
	// packets at every level but the last, which is unlimited: 200,000
	// packets per second is about 2.4 Gbit/s of 1,500-byte datagrams, so
	// that one client's gigabit transfer in either direction passes
	// untouched.
	DefaultEstablishedLimit = 200_000
	// DefaultVersionNegotiation is how many datagrams with a QUIC version
	// quic-go lacks pass per second, for the whole socket.
	DefaultVersionNegotiation = 10
)

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
	// every level but the last, which is unlimited (unless
	// established_level_limits or established_unlimited_levels say
	// otherwise). From 1 to 10,000,000. Default: 200,000, about 2.4 Gbit/s
	// of full-size datagrams from one source.
	EstablishedLimit uint32 `json:"established_limit,omitempty"`

	// EstablishedLevelLimits and EstablishedUnlimitedLevels are
	// LevelLimits and UnlimitedLevels for established connections.
	EstablishedLevelLimits     map[int]uint32 `json:"established_level_limits,omitempty"`
	EstablishedUnlimitedLevels []int          `json:"established_unlimited_levels,omitempty"`

	// Classify sorts datagrams by QUIC class (see above). Off, every
	// datagram counts alike against limit and level_limits, as before the
	// filter knew QUIC: for comparison, or for a socket that serves
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

	// IPv4Prefixes and IPv6Prefixes are the source prefix lengths the
	// levels are built from, most specific first, strictly decreasing,
	// ending with 0; both lists have the same length (1 to 4). Defaults:
	// [32, 24, 0] and [64, 48, 0].
	IPv4Prefixes []int `json:"ipv4_prefixes,omitempty"`
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
	Allow []string `json:"allow,omitempty"`

	// Mode chooses where datagrams are decided: "bpf" in the kernel, by a
	// BPF socket filter (Linux; the process needs CAP_BPF and
	// CAP_PERFMON), or refuse to start; "userspace" in front of quic-go,
	// on every system and without privileges, at the cost of receiving
	// every flood datagram (see the README); "auto", the BPF filter when it
	// loads and attaches, otherwise userspace, with one warning that says
	// why. The mode of a running limiter changes only with a restart.
	// Default: auto.
	Mode string `json:"mode,omitempty"`

	set settings
	state
}

// settings is everything a wrapper asks of its limiter.
type settings datagram.Config

// equal reports whether two settings would limit alike.
func (s settings) equal(o settings) bool {
	ja, _ := json.Marshal(s)
	jb, _ := json.Marshal(o)
	return bytes.Equal(ja, jb)
}

// settings validates the module's options and converts them.
func (r *RakeLimit) settings() (settings, error) {
	switch r.mode() {
	case ModeAuto, ModeBPF, ModeUserspace:
	default:
		return settings{}, fmt.Errorf("mode %q: want auto, bpf or userspace", r.Mode)
	}
	c, err := r.config()
	if err != nil {
		return settings{}, err
	}
	s := settings{Limiter: c, DryRun: r.DryRun, Classify: r.classify(), Negotiation: DefaultVersionNegotiation}
	if r.VersionNegotiation != nil {
		s.Negotiation = *r.VersionNegotiation
		if s.Negotiation > datagram.MaxNegotiation {
			return settings{}, fmt.Errorf("version_negotiation %d out of range [0, %d] datagrams per second",
				s.Negotiation, datagram.MaxNegotiation)
		}
	}
	if s.BlockedPorts, err = blockedPorts(r.BlockSourcePorts); err != nil {
		return settings{}, err
	}
	seen := map[netip.Prefix]bool{}
	for _, a := range r.Allow {
		p, err := parsePrefix(a)
		if err != nil {
			return settings{}, fmt.Errorf("allow: %w", err)
		}
		if !seen[p] {
			seen[p] = true
			s.Allow = append(s.Allow, p)
		}
	}
	for fi, fam := range []string{"IPv4", "IPv6"} {
		n := 0
		for _, p := range s.Allow {
			if p.Addr().Is6() == (fi == 1) {
				n++
			}
		}
		if n > bpf.MaxAllow {
			return settings{}, fmt.Errorf("allow: %d %s prefixes, more than the %d of a family the kernel's allowlist holds; "+
				"merge them into shorter prefixes", n, fam, bpf.MaxAllow)
		}
	}
	return s, nil
}

// mode returns the mode asked for, or the default.
func (r *RakeLimit) mode() string {
	if r.Mode == "" {
		return ModeAuto
	}
	return r.Mode
}

// classify reports whether datagrams are sorted by QUIC class.
func (r *RakeLimit) classify() bool { return r.Classify == nil || *r.Classify }

// blockedPorts reads block_source_ports: nil for the default set, "none"
// for no port.
func blockedPorts(spec []string) (*quicclass.Ports, error) {
	if len(spec) == 0 {
		return quicclass.DefaultBlockedPorts(), nil
	}
	if len(spec) == 1 && spec[0] == "none" {
		return nil, nil
	}
	var ports quicclass.Ports
	for _, s := range spec {
		lo, hi, isRange := strings.Cut(s, "-")
		l, errLo := strconv.ParseUint(lo, 10, 16)
		h, errHi := l, error(nil)
		if isRange {
			h, errHi = strconv.ParseUint(hi, 10, 16)
		}
		if errLo != nil || errHi != nil || h < l {
			return nil, fmt.Errorf("block_source_ports: invalid port %q: want a port (0 to 65535), a range such as 0-1023, "+
				"or none", s)
		}
		ports.Add(uint16(l), uint16(h))
	}
	return &ports, nil
}

// parsePrefix reads a CIDR prefix or a single address (a /32 or /128).
func parsePrefix(s string) (netip.Prefix, error) {
	addr, length, isPrefix := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addr)
	if err != nil {
		if isPrefix {
			return netip.Prefix{}, fmt.Errorf("invalid prefix %q: %q is not an IP address", s, addr)
		}
		return netip.Prefix{}, fmt.Errorf("invalid address %q: want an address or a CIDR prefix", s)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid address %q: zones are not allowed", s)
	}
	if !isPrefix {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	bits, err := strconv.Atoi(length)
	if err != nil || bits < 0 || bits > a.BitLen() || length != strconv.Itoa(bits) {
		family := "IPv4"
		if a.Is6() {
			family = "IPv6"
		}
		return netip.Prefix{}, fmt.Errorf("invalid prefix %q: the length of an %s prefix is 0 to %d", s, family, a.BitLen())
	}
	p := netip.PrefixFrom(a, bits)
	if a.Is4In6() {
		if bits < 96 {
			return p, fmt.Errorf("invalid prefix %q: an IPv4-mapped prefix needs at least 96 bits", s)
		}
		p = netip.PrefixFrom(a.Unmap(), bits-96)
	}
	return p.Masked(), nil
}

// CaddyModule returns the Caddy module information.
func (RakeLimit) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.packetconns.rakelimit",
		New: func() caddy.Module { return new(RakeLimit) },
	}
}

// UnmarshalJSON decodes the configuration strictly (unknown fields are
// errors) and names the field of a value that does not decode.
func (r *RakeLimit) UnmarshalJSON(b []byte) error {
	type plain RakeLimit
	if err := strictJSON(b, (*plain)(r)); err != nil {
		var fields map[string]json.RawMessage
		if json.Unmarshal(b, &fields) == nil {
			names := make([]string, 0, len(fields))
			for name := range fields {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				one, _ := json.Marshal(map[string]json.RawMessage{name: fields[name]})
				var p plain
				if ferr := strictJSON(one, &p); ferr != nil {
					return fmt.Errorf("%s: invalid value %s: %w", name, fields[name], ferr)
				}
			}
		}
		return err
	}
	return nil
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// config fills the defaults and converts the module's settings to the
// limiter's configuration, reporting the first bad field.
func (r *RakeLimit) config() (sketch.Config, error) {
	c := sketch.Config{
		Limit:      r.Limit,
		Window:     time.Duration(r.Window),
		PerDstPort: r.PerDestinationPort,
	}
	var err error
	if c.IPv4Prefixes, err = prefixLengths("ipv4_prefixes", r.IPv4Prefixes, 32); err != nil {
		return c, err
	}
	if c.IPv6Prefixes, err = prefixLengths("ipv6_prefixes", r.IPv6Prefixes, 128); err != nil {
		return c, err
	}
	if c.Limit == 0 {
		c.Limit = DefaultLimit
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	c = c.WithDefaults()
	top := c.Levels() - 1
	if c.LevelLimits, err = levelLimits("", r.LevelLimits, r.UnlimitedLevels, top); err != nil {
		return c, err
	}
	// The defaults of the opening total and of established connections
	// are capped at the largest burst the counters hold, for long windows.
	burstCap := uint32(min(float64(sketch.MaxBurst)/c.Window.Seconds(), sketch.MaxLimit))
	_, totalSet := c.LevelLimits[top]
	if r.classify() && !totalSet {
		c.LevelLimits[top] = max(min(DefaultOpeningTotal, burstCap), c.Limit)
	}
	c.Established = sketch.Limits{Limit: r.EstablishedLimit}
	if c.Established.Limit == 0 {
		c.Established.Limit = min(DefaultEstablishedLimit, burstCap)
	}
	if c.Established.LevelLimits, err = levelLimits("established_", r.EstablishedLevelLimits, r.EstablishedUnlimitedLevels, top); err != nil {
		return c, err
	}
	if _, ok := c.Established.LevelLimits[top]; !ok {
		c.Established.LevelLimits[top] = sketch.Unlimited
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// levelLimits merges a class's level_limits and unlimited_levels (field
// names prefixed with prefix) for levels 0 to top.
func levelLimits(prefix string, limits map[int]uint32, unlimited []int, top int) (map[int]uint32, error) {
	out := map[int]uint32{}
	for lvl, lim := range limits {
		if lim == sketch.Unlimited { // the limiter's sentinel: use unlimited_levels
			return nil, fmt.Errorf("%slevel_limits[%d] %d out of range [1, %d] packets per second", prefix, lvl, lim, sketch.MaxLimit)
		}
		out[lvl] = lim
	}
	for _, lvl := range unlimited {
		if lvl < 0 || lvl > top {
			return nil, fmt.Errorf("%sunlimited_levels (%slevel_limit %d off): level %d does not exist: levels are 0 to %d",
				prefix, prefix, lvl, lvl, top)
		}
		if _, ok := limits[lvl]; ok {
			return nil, fmt.Errorf("level %d is in both %slevel_limits and %sunlimited_levels (%slevel_limit %d off)",
				lvl, prefix, prefix, prefix, lvl)
		}
		if out[lvl] == sketch.Unlimited {
			return nil, fmt.Errorf("%sunlimited_levels: level %d listed twice", prefix, lvl)
		}
		out[lvl] = sketch.Unlimited
	}
	return out, nil
}

// prefixLengths checks a list of prefix lengths of at most bits bits.
func prefixLengths(field string, lens []int, bits int) ([]uint8, error) {
	var out []uint8
	for _, l := range lens {
		if l < 0 {
			return nil, fmt.Errorf("%s %v: /%d is not a prefix length: lengths are 0 to %d", field, lens, l, bits)
		}
		if l > bits {
			return nil, fmt.Errorf("%s %v: /%d is longer than %d bits", field, lens, l, bits)
		}
		out = append(out, uint8(l))
	}
	return out, nil
}

// name returns the limiter's name, or the default.
func (r *RakeLimit) name() string {
	if r.Name == "" {
		return DefaultName
	}
	return r.Name
}

// Validate reports the first thing wrong with the configuration, naming the
// field and the value.
func (r *RakeLimit) Validate() error {
	_, err := r.settings()
	return err
}

// Interface guards
var (
	_ caddy.Provisioner       = (*RakeLimit)(nil)
	_ caddy.Validator         = (*RakeLimit)(nil)
	_ caddy.CleanerUpper      = (*RakeLimit)(nil)
	_ caddy.PacketConnWrapper = (*RakeLimit)(nil)
	_ json.Unmarshaler        = (*RakeLimit)(nil)
)
