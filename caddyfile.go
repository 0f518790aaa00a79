package rakelimit

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

func init() {
	httpcaddyfile.RegisterDirective("rakelimit", parseDirective)
}

// UnmarshalCaddyfile sets up the wrapper from Caddyfile tokens. Syntax:
//
//	rakelimit [<limit>] {
//	    limit                   <packets per second>
//	    window                  <duration>
//	    level_limit             <level> <packets per second>|off
//	    established_limit       <packets per second>
//	    established_level_limit <level> <packets per second>|off
//	    classify                on|off
//	    block_source_ports      <port|low-high> ...|none
//	    version_negotiation     <datagrams per second>|off
//	    ipv4_prefixes           <length> ...
//	    ipv6_prefixes           <length> ...
//	    per_destination_port
//	    name                    <name>
//	    dry_run
//	    allow                   <cidr|address> ...
//	    mode                    auto|xdp|bpf|userspace
//	    xdp_interfaces          <interface> ...
//	    xdp_generic
//	    verify_connection_ids   on|off
//	}
//
// Every option may be left out. The directive stands in a site block, or
// under the global option servers { packet_conn_wrappers { rakelimit ... } }.
func (r *RakeLimit) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		lim, err := parseLimit(d, "limit", d.Val())
		if err != nil {
			return err
		}
		r.Limit = lim
		if d.NextArg() {
			return d.Errf("rakelimit takes one argument, the limit, got %q after it; set other options in a block", d.Val())
		}
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		name := d.Val()
		opt, ok := caddyfileOption(name)
		if !ok {
			return d.Errf("unrecognized rakelimit option %q; the options are: %s", name, strings.Join(caddyfileOptionNames(), ", "))
		}
		if seen[name] && !opt.repeatable {
			return d.Errf("%s already specified", name)
		}
		seen[name] = true
		args := d.RemainingArgs()
		if opt.flag && len(args) > 0 {
			return d.Errf("%s takes no value, got %q: write %s alone to turn it on, leave it out for off", name, args[0], name)
		}
		if err := opt.parse(r, d, name, args); err != nil {
			return err
		}
	}
	// Each value is checked at its token; what the block alone cannot
	// tell, such as mismatched prefix lists or a limit too large for the
	// window, is checked here, at adapt time rather than at run time, and
	// named as in the JSON.
	if _, err := r.config(); err != nil {
		return d.Errf("%v", err)
	}
	return nil
}

// option is one option of the rakelimit block.
type option struct {
	name string
	// repeatable options may be given more than once; flag options take
	// no value.
	repeatable, flag bool
	// parse sets the option called name from its arguments, checking
	// each value it reads.
	parse func(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error
}

// caddyfileOptions lists the block's options in the order the syntax shows
// them. A new option is one more entry.
func caddyfileOptions() []option {
	return []option{
		{name: "limit", parse: parseLimitOption},
		{name: "window", parse: parseWindowOption},
		{name: "level_limit", repeatable: true, parse: parseLevelLimitOption},
		{name: "established_limit", parse: parseEstablishedLimitOption},
		{name: "established_level_limit", repeatable: true, parse: parseLevelLimitOption},
		{name: "classify", parse: parseOnOffOption(func(r *RakeLimit) **bool { return &r.Classify })},
		{name: "block_source_ports", parse: parseBlockSourcePortsOption},
		{name: "version_negotiation", parse: parseVersionNegotiationOption},
		{name: "ipv4_prefixes", parse: parsePrefixesOption},
		{name: "ipv6_prefixes", parse: parsePrefixesOption},
		{name: "per_destination_port", flag: true, parse: func(r *RakeLimit, _ *caddyfile.Dispenser, _ string, _ []string) error {
			r.PerDestinationPort = true
			return nil
		}},
		{name: "name", parse: parseNameOption},
		{name: "dry_run", flag: true, parse: func(r *RakeLimit, _ *caddyfile.Dispenser, _ string, _ []string) error {
			r.DryRun = true
			return nil
		}},
		{name: "allow", repeatable: true, parse: parseAllowOption},
		{name: "mode", parse: parseModeOption},
		{name: "xdp_interfaces", repeatable: true, parse: parseXDPInterfacesOption},
		{name: "xdp_generic", flag: true, parse: func(r *RakeLimit, _ *caddyfile.Dispenser, _ string, _ []string) error {
			r.XDPGeneric = true
			return nil
		}},
		{name: "verify_connection_ids", parse: parseOnOffOption(func(r *RakeLimit) **bool { return &r.VerifyConnectionIDs })},
	}
}

// caddyfileOption finds an option by name.
func caddyfileOption(name string) (option, bool) {
	for _, o := range caddyfileOptions() {
		if o.name == name {
			return o, true
		}
	}
	return option{}, false
}

// caddyfileOptionNames lists the options' names.
func caddyfileOptionNames() []string {
	var names []string
	for _, o := range caddyfileOptions() {
		names = append(names, o.name)
	}
	return names
}

func parseLimitOption(r *RakeLimit, d *caddyfile.Dispenser, _ string, args []string) error {
	if r.Limit != 0 {
		return d.Errf("limit already specified")
	}
	if len(args) != 1 {
		return d.Errf("limit: want one value (packets per second), got %d", len(args))
	}
	lim, err := parseLimit(d, "limit", args[0])
	if err != nil {
		return err
	}
	r.Limit = lim
	return nil
}

func parseWindowOption(r *RakeLimit, d *caddyfile.Dispenser, _ string, args []string) error {
	if len(args) != 1 {
		return d.Errf("window: want one duration, got %d values", len(args))
	}
	w, err := caddy.ParseDuration(args[0])
	if err != nil {
		return d.Errf("window: invalid duration %q: want a number with a unit, such as 500ms, 1s or 2m", args[0])
	}
	// Zero too: it is the JSON's "left out", which the default would fill.
	if err := sketch.CheckWindow(w); err != nil {
		return d.Errf("window %q %v", args[0], err)
	}
	r.Window = caddy.Duration(w)
	return nil
}

// parseLevelLimitOption reads level_limit and established_level_limit.
func parseLevelLimitOption(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
	limits, unlimited := &r.LevelLimits, &r.UnlimitedLevels
	if name == "established_level_limit" {
		limits, unlimited = &r.EstablishedLevelLimits, &r.EstablishedUnlimitedLevels
	}
	if len(args) != 2 {
		return d.Errf("%s: want a level and a limit (or off), got %d values", name, len(args))
	}
	lvl, err := strconv.Atoi(args[0])
	if err != nil || lvl < 0 || lvl >= sketch.MaxLevels {
		return d.Errf("%s: invalid level %q: want 0 to %d", name, args[0], sketch.MaxLevels-1)
	}
	if _, ok := (*limits)[lvl]; ok || slices.Contains(*unlimited, lvl) {
		return d.Errf("%s: level %d already specified", name, lvl)
	}
	if args[1] == "off" {
		*unlimited = append(*unlimited, lvl)
		return nil
	}
	n, err := strconv.ParseUint(args[1], 10, 32)
	if err != nil || sketch.CheckLimit(uint32(n), 0) != nil {
		return d.Errf("%s %d: invalid value %q: want a whole number of packets per second from 1 to %d, "+
			"or off for no limit", name, lvl, args[1], sketch.MaxLimit)
	}
	if *limits == nil {
		*limits = map[int]uint32{}
	}
	(*limits)[lvl] = uint32(n)
	return nil
}

func parseEstablishedLimitOption(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
	if len(args) != 1 {
		return d.Errf("%s: want one value (packets per second), got %d", name, len(args))
	}
	lim, err := parseLimit(d, name, args[0])
	if err != nil {
		return err
	}
	r.EstablishedLimit = lim
	return nil
}

// parseOnOffOption reads an option that takes on or off into the field
// that field returns.
func parseOnOffOption(field func(*RakeLimit) **bool) func(*RakeLimit, *caddyfile.Dispenser, string, []string) error {
	return func(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
		if len(args) != 1 || (args[0] != "on" && args[0] != "off") {
			return d.Errf("%s: want on or off, got %q", name, strings.Join(args, " "))
		}
		on := args[0] == "on"
		*field(r) = &on
		return nil
	}
}

func parseBlockSourcePortsOption(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
	if len(args) == 0 {
		return d.Errf("%s: want ports and ranges such as 0-1023, or none", name)
	}
	if _, err := blockedPorts(args); err != nil {
		return d.Errf("%v", err)
	}
	r.BlockSourcePorts = args
	return nil
}

func parseVersionNegotiationOption(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
	if len(args) != 1 {
		return d.Errf("%s: want a number of datagrams per second, or off", name)
	}
	var n uint64
	if args[0] != "off" {
		var err error
		if n, err = strconv.ParseUint(args[0], 10, 32); err != nil || decide.CheckNegotiation(uint32(n)) != nil {
			return d.Errf("%s: invalid value %q: want a whole number of datagrams per second from 0 to %d, or off",
				name, args[0], decide.MaxNegotiation)
		}
	}
	v := uint32(n)
	r.VersionNegotiation = &v
	return nil
}

func parsePrefixesOption(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
	if len(args) == 0 {
		return d.Errf("%s: want one or more prefix lengths", name)
	}
	var lens []int
	for _, a := range args {
		n, err := strconv.ParseUint(strings.TrimPrefix(a, "/"), 10, 8)
		if err != nil {
			return d.Errf("%s: invalid prefix length %q: want a number of bits", name, a)
		}
		lens = append(lens, int(n))
	}
	if name == "ipv4_prefixes" {
		r.IPv4Prefixes = lens
	} else {
		r.IPv6Prefixes = lens
	}
	return nil
}

func parseNameOption(r *RakeLimit, d *caddyfile.Dispenser, _ string, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return d.Errf("name: want one name")
	}
	r.Name = args[0]
	return nil
}

func parseAllowOption(r *RakeLimit, d *caddyfile.Dispenser, _ string, args []string) error {
	if len(args) == 0 {
		return d.Errf("allow: want one or more prefixes or addresses")
	}
	for _, a := range args {
		if _, err := parsePrefix(a); err != nil {
			return d.Errf("allow: %v", err)
		}
	}
	r.Allow = append(r.Allow, args...)
	return nil
}

func parseModeOption(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
	if len(args) != 1 || !engine.ValidMode(args[0]) {
		return d.Errf("%s: want %s, got %q", name, engine.ModeChoices(), strings.Join(args, " "))
	}
	r.Mode = args[0]
	return nil
}

func parseXDPInterfacesOption(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error {
	if len(args) == 0 {
		return d.Errf("%s: want one or more interface names", name)
	}
	for _, a := range args {
		if err := checkInterfaceName(a); err != nil {
			return d.Errf("%s: %v", name, err)
		}
	}
	r.XDPInterfaces = append(r.XDPInterfaces, args...)
	return nil
}

// parseLimit reads a limit in packets per second.
func parseLimit(d *caddyfile.Dispenser, field, s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || n > sketch.MaxLimit {
		return 0, d.Errf("%s: invalid value %q: want a whole number of packets per second from 1 to %d",
			field, s, sketch.MaxLimit)
	}
	return uint32(n), nil
}

// parseDirective turns the site directive into a packet conn wrapper for the
// site's server.
func parseDirective(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	if inBlock(h) {
		h.Next() // the directive's name, for the error's position
		return nil, h.Errf("rakelimit is a listener option, not a handler: it protects the UDP socket of the site's " +
			"whole listener, so write it directly in the site block, not inside route, handle or another directive " +
			"(or in the global option servers { packet_conn_wrappers { rakelimit ... } })")
	}
	r := new(RakeLimit)
	if err := r.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	if err := checkServersOption(h.Option("servers")); err != nil {
		return nil, h.Errf("%v", err)
	}
	return []httpcaddyfile.ConfigValue{{Class: "packet_conn_wrapper", Value: r}}, nil
}

// inBlock reports whether the directive stands inside another directive's
// block (route, handle, a named route) rather than in a site block. Caddy's
// adapter gives site-level directives one map as State and BlockState, and
// the directives of a nested block a copy of BlockState.
func inBlock(h httpcaddyfile.Helper) bool {
	if h.State == nil || h.BlockState == nil {
		return false
	}
	return h.IsNamedRoute() || reflect.ValueOf(h.State).UnsafePointer() != reflect.ValueOf(h.BlockState).UnsafePointer()
}

// checkServersOption refuses a site-level rakelimit that a global servers
// block would silently drop: Caddy replaces a server's packet conn wrappers
// with those of the servers block that applies to it, even an empty list.
// A block for every server (no listener address) drops the directive for
// sure; one for a listener address may, and a directive cannot tell which
// listener its site is on (the README warns about it). The option's type is
// not exported, hence the reflection.
func checkServersOption(opt any) error {
	v := reflect.ValueOf(opt)
	if v.Kind() != reflect.Slice {
		return nil
	}
	for i := range v.Len() {
		s := v.Index(i)
		if s.Kind() != reflect.Struct {
			continue
		}
		if addr := s.FieldByName("ListenerAddress"); addr.IsValid() && addr.String() == "" {
			return fmt.Errorf("rakelimit in a site block would be ignored: the global servers block replaces " +
				"every server's packet conn wrappers; configure it there instead: " +
				"servers { packet_conn_wrappers { rakelimit ... } }")
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*RakeLimit)(nil)
)
