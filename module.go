// Package rakelimit is a Caddy module that protects HTTP/3 (QUIC over UDP)
// listeners from packet floods. It attaches a BPF socket filter to the UDP
// socket quic-go reads from, so that flood packets are dropped in the kernel,
// before any handshake work; the filter is a hierarchical fair-share rate
// limiter over the source address, its prefixes and the ports (see
// internal/sketch for the algorithm).
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
)

// RakeLimit is a packet conn wrapper that rate-limits the UDP packets of the
// sockets it wraps in the kernel, with a BPF socket filter, before quic-go
// reads them. Each packet is counted under generalisations of its source:
// the address, its prefixes (IPv4 /32, /24, all; IPv6 /64, /48, all), with the
// source port or any port. A stream over its limit at the most specific
// level is cut there; whatever it does not send there counts against the
// more general levels, where a flood spread over ports, addresses or a
// whole subnet is caught.
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

	// Limit is the rate, in packets per second, allowed to every stream at
	// every level (unless level_limits or unlimited_levels say otherwise).
	// From 1 to 10,000,000. Default: 1000.
	Limit uint32 `json:"limit,omitempty"`

	// Window is the period over which rates are smoothed, from 10ms to 1h.
	// A fresh stream may send limit x window packets back to back.
	// Default: 1s.
	Window caddy.Duration `json:"window,omitempty"`

	// LevelLimits overrides the limit, in packets per second, of whole
	// levels, keyed by level number (see above).
	LevelLimits map[int]uint32 `json:"level_limits,omitempty"`

	// UnlimitedLevels lifts the limit of these levels. Lifting the last
	// level removes the cap on the socket's total, which otherwise equals
	// the limit: busy sites lift or raise it.
	UnlimitedLevels []int `json:"unlimited_levels,omitempty"`

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

	set settings
	state
}

// settings is everything a wrapper asks of its limiter.
type settings struct {
	Limiter sketch.Config
	DryRun  bool
	Allow   []netip.Prefix
}

// equal reports whether two settings would limit alike.
func (s settings) equal(o settings) bool {
	ja, _ := json.Marshal(s)
	jb, _ := json.Marshal(o)
	return bytes.Equal(ja, jb)
}

// settings validates the module's options and converts them.
func (r *RakeLimit) settings() (settings, error) {
	c, err := r.config()
	if err != nil {
		return settings{}, err
	}
	s := settings{Limiter: c, DryRun: r.DryRun}
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
	if len(s.Allow) > bpf.MaxAllow {
		return settings{}, fmt.Errorf("allow: %d prefixes, more than the %d the kernel's allowlist holds; "+
			"merge them into shorter prefixes", len(s.Allow), bpf.MaxAllow)
	}
	return s, nil
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
	levels := c.Levels()
	if len(r.LevelLimits)+len(r.UnlimitedLevels) > 0 {
		c.LevelLimits = map[int]uint32{}
	}
	for lvl, lim := range r.LevelLimits {
		if lim == sketch.Unlimited { // the limiter's sentinel: use unlimited_levels
			return c, fmt.Errorf("level_limits[%d] %d out of range [1, %d] packets per second", lvl, lim, sketch.MaxLimit)
		}
		c.LevelLimits[lvl] = lim
	}
	for _, lvl := range r.UnlimitedLevels {
		if lvl < 0 || lvl >= levels {
			return c, fmt.Errorf("unlimited_levels (level_limit %d off): level %d does not exist: levels are 0 to %d", lvl, lvl, levels-1)
		}
		if _, ok := r.LevelLimits[lvl]; ok {
			return c, fmt.Errorf("level %d is in both level_limits and unlimited_levels (level_limit %d off)", lvl, lvl)
		}
		if c.LevelLimits[lvl] == sketch.Unlimited {
			return c, fmt.Errorf("unlimited_levels: level %d listed twice", lvl)
		}
		c.LevelLimits[lvl] = sketch.Unlimited
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
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
