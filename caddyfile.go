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

	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

func init() {
	httpcaddyfile.RegisterDirective("rakelimit", parseDirective)
}

// UnmarshalCaddyfile sets up the wrapper from Caddyfile tokens. Syntax:
//
//	rakelimit [<limit>] {
//	    limit                <packets per second>
//	    window               <duration>
//	    level_limit          <level> <packets per second>|off
//	    ipv4_prefixes        <length> ...
//	    ipv6_prefixes        <length> ...
//	    per_destination_port
//	    name                 <name>
//	    dry_run
//	    allow                <cidr|address> ...
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
			return d.ArgErr()
		}
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		opt := d.Val()
		if seen[opt] && opt != "level_limit" && opt != "allow" {
			return d.Errf("%s already specified", opt)
		}
		seen[opt] = true
		args := d.RemainingArgs()
		switch opt {
		case "limit":
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
		case "window":
			if len(args) != 1 {
				return d.Errf("window: want one duration, got %d values", len(args))
			}
			w, err := caddy.ParseDuration(args[0])
			if err != nil {
				return d.Errf("window: invalid duration %q: %v", args[0], err)
			}
			if w < sketch.MinWindow || w > sketch.MaxWindow {
				return d.Errf("window %q out of range [%v, %v]", args[0], sketch.MinWindow, sketch.MaxWindow)
			}
			r.Window = caddy.Duration(w)
		case "level_limit":
			if len(args) != 2 {
				return d.Errf("level_limit: want a level and a limit (or off), got %d values", len(args))
			}
			lvl, err := strconv.Atoi(args[0])
			if err != nil || lvl < 0 || lvl >= sketch.MaxLevels {
				return d.Errf("level_limit: invalid level %q: want 0 to %d", args[0], sketch.MaxLevels-1)
			}
			if _, ok := r.LevelLimits[lvl]; ok || slices.Contains(r.UnlimitedLevels, lvl) {
				return d.Errf("level_limit: level %d already specified", lvl)
			}
			if args[1] == "off" {
				r.UnlimitedLevels = append(r.UnlimitedLevels, lvl)
				continue
			}
			lim, err := parseLimit(d, fmt.Sprintf("level_limit %d", lvl), args[1])
			if err != nil {
				return err
			}
			if r.LevelLimits == nil {
				r.LevelLimits = map[int]uint32{}
			}
			r.LevelLimits[lvl] = lim
		case "ipv4_prefixes", "ipv6_prefixes":
			if len(args) == 0 {
				return d.Errf("%s: want one or more prefix lengths", opt)
			}
			var lens []int
			for _, a := range args {
				n, err := strconv.ParseUint(strings.TrimPrefix(a, "/"), 10, 8)
				if err != nil {
					return d.Errf("%s: invalid prefix length %q", opt, a)
				}
				lens = append(lens, int(n))
			}
			if opt == "ipv4_prefixes" {
				r.IPv4Prefixes = lens
			} else {
				r.IPv6Prefixes = lens
			}
		case "per_destination_port":
			if len(args) != 0 {
				return d.ArgErr()
			}
			r.PerDestinationPort = true
		case "dry_run":
			if len(args) != 0 {
				return d.ArgErr()
			}
			r.DryRun = true
		case "allow":
			if len(args) == 0 {
				return d.Errf("allow: want one or more prefixes or addresses")
			}
			for _, a := range args {
				if _, err := parsePrefix(a); err != nil {
					return d.Errf("allow: %v", err)
				}
			}
			r.Allow = append(r.Allow, args...)
		case "name":
			if len(args) != 1 || args[0] == "" {
				return d.Errf("name: want one name")
			}
			r.Name = args[0]
		default:
			return d.Errf("unrecognized rakelimit option %q", opt)
		}
	}
	// Catch what the block alone cannot, such as mismatched prefix lists,
	// at adapt time rather than at run time.
	if err := r.Validate(); err != nil {
		return d.Errf("%v", err)
	}
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
	r := new(RakeLimit)
	if err := r.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	if err := checkServersOption(h.Option("servers")); err != nil {
		return nil, h.Errf("%v", err)
	}
	return []httpcaddyfile.ConfigValue{{Class: "packet_conn_wrapper", Value: r}}, nil
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
