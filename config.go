package rakelimit

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// Defaults for options left out: the name's is the module's; the others
// are the decision's, where they are chosen and explained
// (internal/decide/config.go).
const (
	DefaultName               = "default"
	DefaultLimit              = decide.DefaultLimit
	DefaultWindow             = decide.DefaultWindow
	DefaultOpeningTotal       = decide.DefaultOpeningTotal
	DefaultEstablishedLimit   = decide.DefaultEstablishedLimit
	DefaultVersionNegotiation = decide.DefaultVersionNegotiation
)

// engineOptions checks and returns the engine's options: xdp_interfaces and
// xdp_generic, for mode xdp, or mode auto with interfaces named.
func (r *RakeLimit) engineOptions() (engine.Options, error) {
	o := engine.Options{XDPGeneric: r.XDPGeneric}
	seen := map[string]bool{}
	for _, name := range r.XDPInterfaces {
		if err := checkInterfaceName(name); err != nil {
			return o, fmt.Errorf("xdp_interfaces: %w", err)
		}
		if seen[name] {
			return o, fmt.Errorf("xdp_interfaces: %q listed twice", name)
		}
		seen[name] = true
		o.XDPInterfaces = append(o.XDPInterfaces, name)
	}
	return o, engine.CheckOptions(r.mode(), o)
}

// checkInterfaceName checks a network interface's name as Linux does: 1 to
// 15 bytes, no slash, colon or white space, not "." or "..".
func checkInterfaceName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n\r\v\f") {
		return fmt.Errorf("invalid interface name %q: want 1 to 15 bytes without a slash, colon or space", name)
	}
	return nil
}

// mode returns the mode asked for, or the default.
func (r *RakeLimit) mode() string {
	if r.Mode == "" {
		return engine.DefaultMode
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

// UnmarshalJSON decodes the configuration as Caddy decodes every module,
// strictly (an unknown field is an error), and names the field and the
// value of one that does not decode.
func (r *RakeLimit) UnmarshalJSON(b []byte) error {
	type rakelimit RakeLimit
	err := caddy.StrictUnmarshalJSON(b, (*rakelimit)(r))
	if err == nil {
		return nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) == nil {
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			one, _ := json.Marshal(map[string]json.RawMessage{name: fields[name]})
			if caddy.StrictUnmarshalJSON(one, new(rakelimit)) != nil {
				return fmt.Errorf("%s: invalid value %s: %w", name, fields[name], err)
			}
		}
	}
	return err
}

// levelLimits checks and merges a class's level_limits and unlimited_levels
// (field names prefixed with prefix) for the levels of c.
func levelLimits(prefix string, limits map[int]uint32, unlimited []int, c sketch.Config) (map[int]uint32, error) {
	levels := c.Levels()
	out := map[int]uint32{}
	for _, lvl := range slices.Sorted(maps.Keys(limits)) {
		lim := limits[lvl]
		if err := sketch.CheckLevel(lvl, levels); err != nil {
			return nil, fmt.Errorf("%slevel_limits: %w", prefix, err)
		}
		// Unlimited, the limiter's sentinel, is out of range here too:
		// unlimited_levels lifts a level.
		if err := sketch.CheckLimit(lim, c.Window); err != nil {
			return nil, fmt.Errorf("%slevel_limits[%d] %d %w", prefix, lvl, lim, err)
		}
		out[lvl] = lim
	}
	for _, lvl := range unlimited {
		if sketch.CheckLevel(lvl, levels) != nil {
			return nil, fmt.Errorf("%sunlimited_levels (%slevel_limit %d off): level %d does not exist: levels are 0 to %d",
				prefix, prefix, lvl, lvl, levels-1)
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

// prefixLengths checks a list of prefix lengths of an address of bits bits;
// nil for an empty list (the default).
func prefixLengths(field string, lens []int, bits int) ([]uint8, error) {
	if len(lens) == 0 {
		return nil, nil
	}
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
	if err := sketch.CheckPrefixes(out, uint8(bits)); err != nil {
		return nil, fmt.Errorf("%s %v: %w", field, lens, err)
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
