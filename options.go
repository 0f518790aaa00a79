package rakelimit

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// This file owns the module's options: the table of options (options), each
// with its Caddyfile syntax, its default as the docs state it, how it reads
// its tokens and how its value enters the decision configuration. The
// syntax below, the README's syntax block and table of options, the JSON
// fields' doc comments (Caddy's JSON docs) and the tests are checked
// against the table (options_test.go). The decision's own defaults, ranges
// and the totals' policy are internal/decide/config.go's.

// UnmarshalCaddyfile sets up the wrapper from Caddyfile tokens. Syntax:
//
//	rakelimit [<limit>] {
//	    window                  <duration>
//	    limit                   <packets per second>
//	    ipv4_prefixes           <length> ...
//	    ipv6_prefixes           <length> ...
//	    per_destination_port
//	    level_limit             <level> <packets per second>|off
//	    established_limit       <packets per second>
//	    established_level_limit <level> <packets per second>|off
//	    classify                on|off
//	    verify_connection_ids   on|off
//	    block_source_ports      <port|low-high> ...|none
//	    version_negotiation     <datagrams per second>|off
//	    allow                   <cidr|address> ...
//	    dry_run
//	    name                    <name>
//	    mode                    auto|xdp|bpf|userspace
//	    xdp_interfaces          <interface> ...
//	    xdp_generic
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
		opt, ok := optionNamed(name)
		if !ok {
			return d.Errf("unrecognized rakelimit option %q; the options are: %s", name, strings.Join(optionNames(), ", "))
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

// option is one option of the module.
type option struct {
	// name is the option's Caddyfile name; syntax what follows it there
	// ("" for a flag); fields are the JSON fields it sets (its name when
	// nil).
	name, syntax string
	fields       []string
	// def is the default as the docs state it (the field's "Default:"
	// and the README's table), "" when the docs state it in words.
	def string
	// example is an occurrence of the option, with the options it needs
	// on lines before it (the tests read it).
	example string
	// repeatable options may be given more than once; flag options take
	// no value.
	repeatable, flag bool
	// parse sets the option called name from its Caddyfile arguments,
	// checking each value it reads.
	parse func(r *RakeLimit, d *caddyfile.Dispenser, name string, args []string) error
	// apply checks the option's value, naming it as in the JSON, and sets
	// it in the decision configuration when it is the decision's (mode
	// and xdp_interfaces only check theirs: xdp_interfaces checks
	// xdp_generic with it, the engine's options); nil for an option it
	// has nothing to do for. The table applies them in its order, and
	// the first error is the configuration's.
	apply func(r *RakeLimit, s *decide.Config) error
	// after names the options whose applied values apply reads (a range
	// that depends on the window, the levels that the prefixes make):
	// they come before it in the table (TestOptionOrder).
	after []string
}

// jsonFields are the JSON fields that o sets.
func (o option) jsonFields() []string {
	if o.fields == nil {
		return []string{o.name}
	}
	return o.fields
}

// options lists the module's options in the order the syntax shows them
// and their values are applied. A new option is one more entry.
func options() []option {
	flag := func(field func(*RakeLimit) *bool) func(*RakeLimit, *caddyfile.Dispenser, string, []string) error {
		return func(r *RakeLimit, _ *caddyfile.Dispenser, _ string, _ []string) error {
			*field(r) = true
			return nil
		}
	}
	return []option{
		{name: "window", syntax: "<duration>", def: strings.TrimSuffix(DefaultWindow.String(), "0s"), example: "window 2s",
			parse: parseWindowOption, apply: applyWindow},
		{name: "limit", syntax: "<packets per second>", def: strconv.Itoa(DefaultLimit), example: "limit 500",
			parse: parseLimitOption, apply: applyLimit, after: []string{"window"}},
		{name: "ipv4_prefixes", syntax: "<length> ...", def: lengths(sketch.DefaultIPv4Prefixes), example: "ipv4_prefixes 32 16 0",
			parse: parsePrefixesOption, apply: applyIPv4Prefixes},
		{name: "ipv6_prefixes", syntax: "<length> ...", def: lengths(sketch.DefaultIPv6Prefixes), example: "ipv6_prefixes 64 32 0",
			parse: parsePrefixesOption, apply: applyIPv6Prefixes, after: []string{"ipv4_prefixes"}},
		{name: "per_destination_port", flag: true, def: "off", example: "per_destination_port",
			parse: flag(func(r *RakeLimit) *bool { return &r.PerDestinationPort }),
			apply: func(r *RakeLimit, s *decide.Config) error { s.Limiter.PerDstPort = r.PerDestinationPort; return nil }},
		{name: "level_limit", syntax: "<level> <packets per second>|off", fields: []string{"level_limits", "unlimited_levels"},
			repeatable: true, example: "level_limit 3 50000", parse: parseLevelLimitOption, apply: applyLevelLimits,
			after: []string{"window", "ipv4_prefixes", "ipv6_prefixes", "per_destination_port"}},
		{name: "established_limit", syntax: "<packets per second>", def: strconv.Itoa(DefaultEstablishedLimit),
			example: "established_limit 100000", parse: parseEstablishedLimitOption, apply: applyEstablishedLimit,
			after: []string{"window"}},
		{name: "established_level_limit", syntax: "<level> <packets per second>|off",
			fields: []string{"established_level_limits", "established_unlimited_levels"}, repeatable: true,
			example: "established_level_limit 3 off", parse: parseLevelLimitOption, apply: applyEstablishedLevelLimits,
			after: []string{"window", "ipv4_prefixes", "ipv6_prefixes", "per_destination_port"}},
		{name: "classify", syntax: "on|off", def: "on", example: "classify off",
			parse: parseOnOffOption(func(r *RakeLimit) **bool { return &r.Classify }),
			apply: func(r *RakeLimit, s *decide.Config) error { s.Classify = r.classify(); return nil }},
		{name: "verify_connection_ids", syntax: "on|off", example: "verify_connection_ids off",
			parse: parseOnOffOption(func(r *RakeLimit) **bool { return &r.VerifyConnectionIDs }), apply: applyVerifyIDs,
			after: []string{"classify"}},
		{name: "block_source_ports", syntax: "<port|low-high> ...|none", example: "block_source_ports 0-1023 11211",
			parse: parseBlockSourcePortsOption, apply: func(r *RakeLimit, s *decide.Config) (err error) {
				s.BlockedPorts, err = blockedPorts(r.BlockSourcePorts)
				return err
			}},
		{name: "version_negotiation", syntax: "<datagrams per second>|off", def: strconv.Itoa(DefaultVersionNegotiation),
			example: "version_negotiation 50", parse: parseVersionNegotiationOption, apply: applyNegotiation},
		{name: "allow", syntax: "<cidr|address> ...", repeatable: true, def: "none", example: "allow 192.0.2.0/24 2001:db8::1",
			parse: parseAllowOption, apply: applyAllow},
		{name: "dry_run", flag: true, def: "off", example: "dry_run",
			parse: flag(func(r *RakeLimit) *bool { return &r.DryRun }),
			apply: func(r *RakeLimit, s *decide.Config) error { s.DryRun = r.DryRun; return nil }},
		{name: "name", syntax: "<name>", def: DefaultName, example: "name edge", parse: parseNameOption},
		{name: "mode", syntax: strings.Join(engine.ModeNames(), "|"), def: engine.DefaultMode, example: "mode userspace",
			parse: parseModeOption, apply: func(r *RakeLimit, _ *decide.Config) error {
				if !engine.ValidMode(r.mode()) {
					return fmt.Errorf("mode %q: want %s", r.Mode, engine.ModeChoices())
				}
				return nil
			}},
		{name: "xdp_interfaces", syntax: "<interface> ...", repeatable: true, example: "xdp_interfaces eth0",
			parse: parseXDPInterfacesOption, apply: func(r *RakeLimit, _ *decide.Config) error {
				_, err := r.engineOptions()
				return err
			}, after: []string{"mode"}},
		{name: "xdp_generic", flag: true, def: "off", example: "mode xdp\n\txdp_generic",
			parse: flag(func(r *RakeLimit) *bool { return &r.XDPGeneric })},
	}
}

// lengths writes prefix lengths as the docs do: "32 24 0".
func lengths(l []uint8) string {
	s := make([]string, len(l))
	for i, n := range l {
		s[i] = strconv.Itoa(int(n))
	}
	return strings.Join(s, " ")
}

// optionNamed finds an option by name.
func optionNamed(name string) (option, bool) {
	for _, o := range options() {
		if o.name == name {
			return o, true
		}
	}
	return option{}, false
}

// optionNames lists the options' names.
func optionNames() []string {
	var names []string
	for _, o := range options() {
		names = append(names, o.name)
	}
	return names
}

// config converts the module's options to the decision configuration:
// each option applies its value in the table's order, checking it where it
// is read, so that an error names the JSON field and the value; the
// totals' policy (decide.WithTotals) then fills the totals left unset,
// and the decision configuration's own validation runs once, as a last
// check.
func (r *RakeLimit) config() (decide.Config, error) {
	s := decide.Config{Limiter: sketch.Config{OnValidate: r.onValidate}}
	for _, o := range options() {
		if o.apply == nil {
			continue
		}
		if err := o.apply(r, &s); err != nil {
			return decide.Config{}, err
		}
	}
	s = decide.WithTotals(s)
	if err := s.Validate(); err != nil {
		return decide.Config{}, err
	}
	return s, nil
}

func applyWindow(r *RakeLimit, s *decide.Config) error {
	s.Limiter.Window = time.Duration(r.Window)
	if s.Limiter.Window == 0 {
		s.Limiter.Window = DefaultWindow
	} else if err := sketch.CheckWindow(s.Limiter.Window); err != nil {
		return fmt.Errorf("window %v %w", s.Limiter.Window, err)
	}
	return nil
}

func applyLimit(r *RakeLimit, s *decide.Config) error {
	s.Limiter.Limit = r.Limit
	if s.Limiter.Limit == 0 {
		s.Limiter.Limit = DefaultLimit
	} else if err := sketch.CheckLimit(s.Limiter.Limit, s.Limiter.Window); err != nil {
		return fmt.Errorf("limit %d %w", s.Limiter.Limit, err)
	}
	return nil
}

func applyIPv4Prefixes(r *RakeLimit, s *decide.Config) (err error) {
	s.Limiter.IPv4Prefixes, err = prefixLengths("ipv4_prefixes", r.IPv4Prefixes, 32)
	return err
}

// applyIPv6Prefixes reads ipv6_prefixes, fills the default lists, and
// checks that both have a length for each level.
func applyIPv6Prefixes(r *RakeLimit, s *decide.Config) (err error) {
	c := &s.Limiter
	if c.IPv6Prefixes, err = prefixLengths("ipv6_prefixes", r.IPv6Prefixes, 128); err != nil {
		return err
	}
	*c = c.WithDefaults()
	if len(c.IPv4Prefixes) != len(c.IPv6Prefixes) {
		return fmt.Errorf("ipv4_prefixes %v and ipv6_prefixes %v %w", c.IPv4Prefixes, c.IPv6Prefixes, sketch.ErrPrefixLengths)
	}
	return nil
}

func applyLevelLimits(r *RakeLimit, s *decide.Config) (err error) {
	s.Limiter.LevelLimits, err = levelLimits("", r.LevelLimits, r.UnlimitedLevels, s.Limiter)
	return err
}

// applyEstablishedLimit reads established_limit, or fills its default. The
// default is not lowered to fit a long window, which would cut one
// client's transfer without a word: a window too long for it needs an
// established_limit of the operator's.
func applyEstablishedLimit(r *RakeLimit, s *decide.Config) error {
	c := &s.Limiter
	c.Established = sketch.Limits{Limit: r.EstablishedLimit}
	if c.Established.Limit != 0 {
		if err := sketch.CheckLimit(c.Established.Limit, c.Window); err != nil {
			return fmt.Errorf("established_limit %d %w", c.Established.Limit, err)
		}
		return nil
	}
	if sketch.CheckLimit(DefaultEstablishedLimit, c.Window) != nil {
		burstCap := uint32(min(float64(sketch.MaxBurst)/c.Window.Seconds(), sketch.MaxLimit))
		longest := time.Duration(float64(sketch.MaxBurst) / DefaultEstablishedLimit * float64(time.Second))
		return fmt.Errorf("window %v is too long for the default established_limit of %d packets per second "+
			"(limit x window must stay under %d): set established_limit (at most %d with this window), or a "+
			"window of at most %v", c.Window, DefaultEstablishedLimit, sketch.MaxBurst, burstCap, longest.Truncate(time.Millisecond))
	}
	c.Established.Limit = DefaultEstablishedLimit
	return nil
}

func applyEstablishedLevelLimits(r *RakeLimit, s *decide.Config) (err error) {
	s.Limiter.Established.LevelLimits, err = levelLimits("established_", r.EstablishedLevelLimits, r.EstablishedUnlimitedLevels, s.Limiter)
	return err
}

// applyVerifyIDs reads verify_connection_ids, on by default when
// classifying.
func applyVerifyIDs(r *RakeLimit, s *decide.Config) error {
	verify := r.VerifyConnectionIDs == nil || *r.VerifyConnectionIDs
	if verify && !s.Classify && r.VerifyConnectionIDs != nil {
		return errors.New("verify_connection_ids true needs classify: without classes there is nothing to verify")
	}
	s.VerifyIDs = verify && s.Classify
	return nil
}

func applyNegotiation(r *RakeLimit, s *decide.Config) error {
	s.Negotiation = DefaultVersionNegotiation
	if r.VersionNegotiation != nil {
		s.Negotiation = *r.VersionNegotiation
		if err := decide.CheckNegotiation(s.Negotiation); err != nil {
			return fmt.Errorf("version_negotiation %d %w", s.Negotiation, err)
		}
	}
	return nil
}

// applyAllow reads allow, each prefix once.
func applyAllow(r *RakeLimit, s *decide.Config) error {
	seen := map[netip.Prefix]bool{}
	for _, a := range r.Allow {
		p, err := parsePrefix(a)
		if err != nil {
			return fmt.Errorf("allow: %w", err)
		}
		if !seen[p] {
			seen[p] = true
			s.Allow = append(s.Allow, p)
		}
	}
	if err := decide.CheckAllowCapacity(s.Allow); err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	return nil
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
