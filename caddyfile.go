package rakelimit

import (
	"fmt"
	"reflect"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func init() {
	httpcaddyfile.RegisterDirective("rakelimit", parseDirective)
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
