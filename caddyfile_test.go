package rakelimit

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"

	// The adapt tests need the http app, its directives and the tls and
	// pki apps that local_certs uses.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// update rewrites the JSON halves of the golden adapt files from the
// adapter's output: go test -run TestCaddyfileAdapt -update
var update = flag.Bool("update", false, "rewrite the expected JSON of testdata/caddyfile_adapt/*.caddyfiletest")

// noPanic runs f and turns a panic into a test failure: bad input must be
// reported as an error, never crash the adapter.
func noPanic(t *testing.T, f func() error) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("panicked: %v", p)
		}
	}()
	return f()
}

// wantErrContaining fails the test unless err is non-nil and its message
// contains every one of the substrings.
func wantErrContaining(t *testing.T, err error, substrings ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", substrings)
	}
	for _, s := range substrings {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

// TestUnmarshalCaddyfile proves that every documented form of the directive
// (bare, inline limit, full block) sets exactly the fields it names and
// leaves the others at their zero value, which config() turns into the
// defaults.
func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tt := range []struct {
		name  string
		input string
		want  RakeLimit
	}{
		{
			name:  "bare",
			input: `rakelimit`,
			want:  RakeLimit{},
		},
		{
			name:  "inline limit",
			input: `rakelimit 1000`,
			want:  RakeLimit{Limit: 1000},
		},
		{
			name:  "dry run and allowlist over two lines",
			input: "rakelimit {\n\tdry_run\n\tallow 192.0.2.0/24 2001:db8::/32\n\tallow 198.51.100.7 ::ffff:203.0.113.0/120\n}",
			want: RakeLimit{DryRun: true,
				Allow: []string{"192.0.2.0/24", "2001:db8::/32", "198.51.100.7", "::ffff:203.0.113.0/120"}},
		},
		{
			name:  "inline limit and empty block",
			input: "rakelimit 42 {\n}",
			want:  RakeLimit{Limit: 42},
		},
		{
			name:  "inline limit and block",
			input: "rakelimit 42 {\n\twindow 500ms\n}",
			want:  RakeLimit{Limit: 42, Window: caddy.Duration(500 * time.Millisecond)},
		},
		{
			name:  "largest limit",
			input: "rakelimit 10000000 {\n\twindow 500ms\n}",
			want:  RakeLimit{Limit: 10_000_000, Window: caddy.Duration(500 * time.Millisecond)},
		},
		{
			name: "quic classes",
			input: `rakelimit {
	established_limit 150000
	established_level_limit 2 300000
	established_level_limit 3 off
	classify on
	block_source_ports 0-1023 1900 11211
	version_negotiation off
}`,
			want: RakeLimit{EstablishedLimit: 150_000, EstablishedLevelLimits: map[int]uint32{2: 300_000},
				EstablishedUnlimitedLevels: []int{3}, Classify: ptr(true),
				BlockSourcePorts: []string{"0-1023", "1900", "11211"}, VersionNegotiation: ptr(uint32(0))},
		},
		{
			name:  "every datagram alike",
			input: "rakelimit {\n\tclassify off\n\tblock_source_ports none\n\tversion_negotiation 50\n}",
			want:  RakeLimit{Classify: ptr(false), BlockSourcePorts: []string{"none"}, VersionNegotiation: ptr(uint32(50))},
		},
		{
			name:  "window bounds",
			input: "rakelimit {\n\twindow 10ms\n}",
			want:  RakeLimit{Window: caddy.Duration(10 * time.Millisecond)},
		},
		{
			name:  "window upper bound",
			input: "rakelimit {\n\twindow 1h\n\testablished_limit 2000\n}",
			want:  RakeLimit{Window: caddy.Duration(time.Hour), EstablishedLimit: 2000},
		},
		{
			name: "full block",
			input: `rakelimit {
	limit 500
	window 2s
	level_limit 1 200
	level_limit 3 50000
	level_limit 5 off
	ipv4_prefixes 32 24 16 0
	ipv6_prefixes 64 56 48 0
	per_destination_port
	name edge
}`,
			want: RakeLimit{
				Name:               "edge",
				Limit:              500,
				Window:             caddy.Duration(2 * time.Second),
				LevelLimits:        map[int]uint32{1: 200, 3: 50000},
				UnlimitedLevels:    []int{5},
				IPv4Prefixes:       []int{32, 24, 16, 0},
				IPv6Prefixes:       []int{64, 56, 48, 0},
				PerDestinationPort: true,
			},
		},
		{
			name:  "prefixes with slashes",
			input: "rakelimit {\n\tipv4_prefixes /32 /0\n\tipv6_prefixes /64 /0\n}",
			want:  RakeLimit{IPv4Prefixes: []int{32, 0}, IPv6Prefixes: []int{64, 0}},
		},
		{
			name:  "several levels off",
			input: "rakelimit {\n\tlevel_limit 3 off\n\tlevel_limit 0 off\n}",
			want:  RakeLimit{UnlimitedLevels: []int{3, 0}},
		},
		{
			name:  "xdp on named interfaces, generic",
			input: "rakelimit {\n\tmode xdp\n\txdp_interfaces eth0 eth1\n\txdp_interfaces ens5\n\txdp_generic\n}",
			want:  RakeLimit{Mode: "xdp", XDPInterfaces: []string{"eth0", "eth1", "ens5"}, XDPGeneric: true},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := new(RakeLimit)
			err := noPanic(t, func() error {
				return got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			})
			if err != nil {
				t.Fatalf("UnmarshalCaddyfile: %v", err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", *got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate after a successful parse: %v", err)
			}
		})
	}
}

// TestUnmarshalCaddyfileErrors proves that every malformed directive is
// refused with an error, not a panic, and that the error names the option
// and the offending value, and says what is valid.
func TestUnmarshalCaddyfileErrors(t *testing.T) {
	block := func(lines ...string) string {
		return "rakelimit {\n\t" + strings.Join(lines, "\n\t") + "\n}"
	}
	for _, tt := range []struct {
		name  string
		input string
		want  []string
	}{
		// limit
		{"inline limit 0", `rakelimit 0`, []string{"limit", `"0"`, "from 1 to 10000000"}},
		{"inline limit negative", `rakelimit -5`, []string{"limit", `"-5"`}},
		{"inline limit not a number", `rakelimit abc`, []string{"limit", `"abc"`}},
		{"inline limit too large", `rakelimit 99999999999`, []string{"limit", `"99999999999"`}},
		{"inline limit over MaxLimit", `rakelimit 10000001`, []string{"limit", `"10000001"`}},
		{"inline limit fraction", `rakelimit 1.5`, []string{"limit", `"1.5"`}},
		{"block limit 0", block("limit 0"), []string{"limit", `"0"`}},
		{"block limit negative", block("limit -5"), []string{"limit", `"-5"`}},
		{"block limit not a number", block("limit abc"), []string{"limit", `"abc"`}},
		{"block limit too large", block("limit 99999999999"), []string{"limit", `"99999999999"`}},
		{"block limit fraction", block("limit 1.5"), []string{"limit", `"1.5"`}},
		{"block limit missing", block("limit"), []string{"limit", "got 0"}},
		{"block limit two values", block("limit 1 2"), []string{"limit", "got 2"}},
		{"limit inline and in block", "rakelimit 10 {\n\tlimit 20\n}", []string{"limit already specified"}},
		{"limit twice in block", block("limit 10", "limit 20"), []string{"limit already specified"}},
		{"extra inline argument", `rakelimit 10 20`, []string{"rakelimit takes one argument, the limit", `"20"`}},

		// window
		{"window 0", block("window 0"), []string{"window", `"0"`, "out of range"}},
		{"window negative", block("window -1s"), []string{"window", `"-1s"`, "out of range"}},
		{"window too short", block("window 1ms"), []string{"window", `"1ms"`, "out of range"}},
		{"window too long", block("window 2h"), []string{"window", `"2h"`, "out of range"}},
		{"window not a duration", block("window abc"), []string{"window", `"abc"`, "invalid duration"}},
		{"window missing", block("window"), []string{"window", "got 0"}},
		{"window two values", block("window 1s 2s"), []string{"window", "got 2"}},
		{"window twice", block("window 1s", "window 2s"), []string{"window already specified"}},
		{"window too long for the default established limit", block("window 10m"),
			[]string{"window 10m0s", "default established_limit", "set established_limit (at most 13981"}},
		{"burst below one packet", block("limit 50", "window 10ms"), []string{"limit 50", "window 10ms", "less than one packet"}},

		// dry_run and allow
		{"dry_run with an argument", block("dry_run yes"), []string{"dry_run takes no value", `"yes"`}},
		{"dry_run true", block("dry_run true"), []string{"dry_run takes no value", `"true"`, "dry_run alone"}},
		{"dry_run twice", block("dry_run", "dry_run"), []string{"dry_run already specified"}},
		{"allow without values", block("allow"), []string{"allow", "want one or more"}},
		{"allow not a prefix", block("allow 192.0.2.0/33"), []string{"allow", `"192.0.2.0/33"`, "IPv4 prefix is 0 to 32"}},
		{"allow IPv6 prefix too long", block("allow 2001:db8::/129"), []string{"allow", `"2001:db8::/129"`, "IPv6 prefix is 0 to 128"}},
		{"allow prefix length not a number", block("allow 192.0.2.0/x"), []string{"allow", `"192.0.2.0/x"`, "0 to 32"}},
		{"allow prefix of a name", block("allow office/24"), []string{"allow", `"office/24"`, `"office" is not an IP address`}},
		{"allow not an address", block("allow office"), []string{"allow", `"office"`}},
		{"allow short mapped prefix", block("allow ::ffff:0:0/90"), []string{"allow", `"::ffff:0:0/90"`, "96 bits"}},
		{"allow with a zone", block("allow fe80::1%eth0"), []string{"allow", `"fe80::1%eth0"`, "zones"}},

		// unknown options
		{"unknown option", block("foo"), []string{"unrecognized rakelimit option", `"foo"`,
			"the options are: " + strings.Join(optionNames(), ", ")}},
		{"unknown option with args", block("foo 1 2"), []string{"unrecognized rakelimit option", `"foo"`, "the options are:"}},

		// level_limit
		{"level_limit no values", block("level_limit"), []string{"level_limit", "got 0"}},
		{"level_limit one value", block("level_limit 1"), []string{"level_limit", "got 1"}},
		{"level_limit three values", block("level_limit 1 2 3"), []string{"level_limit", "got 3"}},
		{"level_limit level 9", block("level_limit 9 10"), []string{"level_limit", `invalid level "9"`}},
		{"level_limit level negative", block("level_limit -1 10"), []string{"level_limit", `invalid level "-1"`}},
		{"level_limit level not a number", block("level_limit x 10"), []string{"level_limit", `invalid level "x"`}},
		{"level_limit limit not a number", block("level_limit 1 abc"), []string{"level_limit 1", `"abc"`, "or off"}},
		{"level_limit unlimited", block("level_limit 3 unlimited"), []string{"level_limit 3", `"unlimited"`, "or off"}},
		{"level_limit limit 0", block("level_limit 1 0"), []string{"level_limit 1", `"0"`}},
		{"level_limit limit too large", block("level_limit 1 99999999999"), []string{"level_limit 1", `"99999999999"`}},
		{"level_limit same level twice", block("level_limit 1 10", "level_limit 1 20"), []string{"level_limit", "level 1 already specified"}},
		{"level_limit same level off twice", block("level_limit 2 off", "level_limit 2 off"), []string{"level_limit", "level 2 already specified"}},
		{"level_limit same level limit and off", block("level_limit 2 10", "level_limit 2 off"), []string{"level_limit", "level 2 already specified"}},
		{"level_limit same level spelled 01", block("level_limit 1 10", "level_limit 01 20"), []string{"level_limit", "level 1 already specified"}},
		// Levels 4 and 5 pass the parser (MaxLevels) but not the default
		// prefixes, which have levels 0 to 3.
		{"level_limit level beyond prefixes", block("level_limit 4 10"), []string{"level_limits", "level 4 does not exist", "0 to 3"}},
		{"level_limit level off beyond prefixes", block("level_limit 5 off"), []string{"level 5 does not exist", "0 to 3"}},

		// prefixes
		{"ipv4_prefixes no values", block("ipv4_prefixes"), []string{"ipv4_prefixes", "want one or more"}},
		{"ipv6_prefixes no values", block("ipv6_prefixes"), []string{"ipv6_prefixes", "want one or more"}},
		{"ipv4_prefixes 33", block("ipv4_prefixes 33"), []string{"ipv4_prefixes [33]", "/33 is longer than 32 bits"}},
		{"ipv6_prefixes 129", block("ipv6_prefixes 129 0"), []string{"ipv6_prefixes [129 0]", "/129 is longer than 128 bits"}},
		{"ipv4_prefixes not a number", block("ipv4_prefixes 32 x 0"), []string{"ipv4_prefixes", `"x"`}},
		{"ipv4_prefixes over a byte", block("ipv4_prefixes 256 0"), []string{"ipv4_prefixes", `"256"`}},
		{"ipv4_prefixes negative", block("ipv4_prefixes -1"), []string{"ipv4_prefixes", `"-1"`}},
		{"ipv4_prefixes not decreasing", block("ipv4_prefixes 24 32 0"), []string{"ipv4_prefixes [24 32 0]", "strictly decreasing"}},
		{"ipv4_prefixes repeated length", block("ipv4_prefixes 32 32 0"), []string{"ipv4_prefixes [32 32 0]", "strictly decreasing"}},
		{"ipv4_prefixes no trailing 0", block("ipv4_prefixes 32 24"), []string{"ipv4_prefixes [32 24]", "last prefix must be 0"}},
		{"ipv4_prefixes too many", block("ipv4_prefixes 32 24 16 8 0", "ipv6_prefixes 64 56 48 32 0"), []string{"ipv4_prefixes [32 24 16 8 0]", "1 to 4"}},
		{"prefix lists of different lengths", block("ipv4_prefixes 32 24 16 0", "ipv6_prefixes 64 48 0"),
			[]string{"ipv4_prefixes [32 24 16 0]", "ipv6_prefixes [64 48 0]", "same length"}},
		{"ipv4_prefixes twice", block("ipv4_prefixes 32 0", "ipv4_prefixes 24 0"), []string{"ipv4_prefixes already specified"}},

		// xdp
		{"xdp_interfaces no value", block("mode xdp", "xdp_interfaces"), []string{"xdp_interfaces: want one or more interface names"}},
		{"xdp_interfaces bad name", block("mode xdp", "xdp_interfaces eth0 a:b"), []string{"xdp_interfaces", `invalid interface name "a:b"`}},
		{"xdp_interfaces twice the same", block("mode xdp", "xdp_interfaces eth0", "xdp_interfaces eth0"), []string{`xdp_interfaces: "eth0" listed twice`}},
		{"xdp_interfaces in mode bpf", block("mode bpf", "xdp_interfaces eth0"), []string{"need mode xdp (or auto), and mode is bpf"}},
		{"xdp_generic with a value", block("mode xdp", "xdp_generic on"), []string{"xdp_generic takes no value", `"on"`}},
		{"xdp_generic in mode auto alone", block("xdp_generic"), []string{"xdp_generic in mode auto needs xdp_interfaces"}},

		{"per_destination_port with an argument", block("per_destination_port yes"), []string{"per_destination_port takes no value", `"yes"`}},
		{"per_destination_port twice", block("per_destination_port", "per_destination_port"), []string{"per_destination_port already specified"}},

		// name
		{"name no value", block("name"), []string{"name: want one name"}},
		{"name two values", block("name a b"), []string{"name: want one name"}},
		{"name empty", block(`name ""`), []string{"name: want one name"}},
		{"name twice", block("name a", "name b"), []string{"name already specified"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := new(RakeLimit)
			err := noPanic(t, func() error {
				return r.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			})
			wantErrContaining(t, err, tt.want...)
			t.Logf("error: %v", err)
		})
	}
}

// TestUnmarshalJSON proves that JSON configurations decode strictly through
// RakeLimit.UnmarshalJSON, that Validate accepts the good ones, and that a
// bad one fails, in decoding or in Validate, with an error naming the field
// and the value. A limit or window of 0 is the same as leaving it out: the
// default applies (config() fills it), so {"limit":0} is valid.
func TestUnmarshalJSON(t *testing.T) {
	for _, tt := range []struct {
		name string
		json string
		// want is nil for a good config, else substrings of the error.
		want []string
		// check, for good configs, inspects the decoded wrapper.
		check func(t *testing.T, r *RakeLimit)
	}{
		{name: "empty", json: `{}`, check: func(t *testing.T, r *RakeLimit) {
			wantConfig(t, r, DefaultLimit, DefaultWindow)
		}},
		{name: "limit 0 means the default", json: `{"limit":0}`, check: func(t *testing.T, r *RakeLimit) {
			if r.Limit != 0 {
				t.Errorf("Limit = %d, want 0", r.Limit)
			}
			wantConfig(t, r, DefaultLimit, DefaultWindow)
		}},
		{name: "window 0 means the default", json: `{"window":0}`, check: func(t *testing.T, r *RakeLimit) {
			wantConfig(t, r, DefaultLimit, DefaultWindow)
		}},
		{name: "limit and window string", json: `{"limit":250,"window":"2s"}`, check: func(t *testing.T, r *RakeLimit) {
			wantConfig(t, r, 250, 2*time.Second)
		}},
		{name: "window in nanoseconds", json: `{"window":1500000000}`, check: func(t *testing.T, r *RakeLimit) {
			wantConfig(t, r, DefaultLimit, 1500*time.Millisecond)
		}},
		{name: "largest limit", json: `{"limit":10000000,"window":"500ms"}`, check: func(t *testing.T, r *RakeLimit) {
			wantConfig(t, r, 10_000_000, 500*time.Millisecond)
		}},
		{name: "window bounds", json: `{"limit":100,"window":"10ms"}`},
		{name: "window upper bound", json: `{"window":"1h","established_limit":2000}`},
		{name: "window too long for the default established limit", json: `{"window":"1h"}`,
			want: []string{"window 1h0m0s", "default established_limit of 200000", "at most 2330", "at most 41.943s"}},
		{
			name: "full",
			json: `{"name":"edge","limit":500,"window":"2s","level_limits":{"1":200,"3":50000},"unlimited_levels":[5],
				"ipv4_prefixes":[32,24,16,0],"ipv6_prefixes":[64,56,48,0],"per_destination_port":true}`,
			check: func(t *testing.T, r *RakeLimit) {
				want := RakeLimit{
					Name:               "edge",
					Limit:              500,
					Window:             caddy.Duration(2 * time.Second),
					LevelLimits:        map[int]uint32{1: 200, 3: 50000},
					UnlimitedLevels:    []int{5},
					IPv4Prefixes:       []int{32, 24, 16, 0},
					IPv6Prefixes:       []int{64, 56, 48, 0},
					PerDestinationPort: true,
				}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got  %+v\nwant %+v", *r, want)
				}
			},
		},

		{name: "limit negative", json: `{"limit":-1}`, want: []string{"limit", "-1"}},
		{name: "limit string", json: `{"limit":"abc"}`, want: []string{"limit", `"abc"`}},
		{name: "limit 1e12", json: `{"limit":1e12}`, want: []string{"limit", "1e12"}},
		{name: "limit beyond uint32", json: `{"limit":99999999999}`, want: []string{"limit", "99999999999"}},
		{name: "limit over MaxLimit", json: `{"limit":10000001}`, want: []string{"limit 10000001", "out of range"}},
		{name: "limit fraction", json: `{"limit":1.5}`, want: []string{"limit", "1.5"}},
		{name: "window string", json: `{"window":"abc"}`, want: []string{"window", `"abc"`}},
		{name: "window negative", json: `{"window":"-1s"}`, want: []string{"window -1s", "out of range"}},
		{name: "window negative nanoseconds", json: `{"window":-1}`, want: []string{"window -1ns", "out of range"}},
		{name: "window too short", json: `{"window":"1ms"}`, want: []string{"window 1ms", "out of range"}},
		{name: "window too long", json: `{"window":"2h"}`, want: []string{"window 2h", "out of range"}},
		{name: "window bool", json: `{"window":true}`, want: []string{"window", "true"}},
		{name: "burst below one packet", json: `{"limit":50,"window":"10ms"}`, want: []string{"limit 50", "window 10ms", "less than one packet"}},
		{name: "unknown field", json: `{"unknown_field":1}`, want: []string{"unknown_field", "1"}},
		{name: "unknown field beside good ones", json: `{"limit":5,"unknown_field":"x"}`, want: []string{"unknown_field", `"x"`}},
		{name: "level_limits level 7", json: `{"level_limits":{"7":10}}`, want: []string{"level_limits", "level 7 does not exist"}},
		{name: "level_limits level not a number", json: `{"level_limits":{"x":10}}`, want: []string{"level_limits", `"x"`}},
		{name: "level_limits limit 0", json: `{"level_limits":{"1":0}}`, want: []string{"level_limits[1] 0", "out of range"}},
		{name: "level_limits limit over MaxLimit", json: `{"level_limits":{"1":20000000}}`, want: []string{"level_limits[1] 20000000", "out of range"}},
		{name: "level_limits limit negative", json: `{"level_limits":{"1":-3}}`, want: []string{"level_limits", "-3"}},
		{name: "unlimited_levels level 9", json: `{"unlimited_levels":[9]}`, want: []string{"unlimited_levels", "level 9 does not exist"}},
		{name: "unlimited_levels level negative", json: `{"unlimited_levels":[-1]}`, want: []string{"unlimited_levels", "level -1 does not exist"}},
		{name: "level in both", json: `{"level_limits":{"2":10},"unlimited_levels":[2]}`,
			want: []string{"level 2", "level_limits", "unlimited_levels"}},
		{name: "ipv4_prefixes too long", json: `{"ipv4_prefixes":[33,24,0]}`, want: []string{"ipv4_prefixes [33 24 0]", "/33"}},
		{name: "ipv4_prefixes over a byte", json: `{"ipv4_prefixes":[256,0]}`, want: []string{"ipv4_prefixes [256 0]", "/256"}},
		{name: "ipv4_prefixes not decreasing", json: `{"ipv4_prefixes":[24,32,0]}`, want: []string{"ipv4_prefixes [24 32 0]", "strictly decreasing"}},
		{name: "ipv4_prefixes no trailing 0", json: `{"ipv4_prefixes":[32,24]}`, want: []string{"ipv4_prefixes [32 24]", "last prefix must be 0"}},
		{name: "ipv6_prefixes too long", json: `{"ipv6_prefixes":[129,0],"ipv4_prefixes":[32,0]}`, want: []string{"ipv6_prefixes [129 0]", "/129"}},
		{name: "prefix lists of different lengths", json: `{"ipv4_prefixes":[32,24,16,0],"ipv6_prefixes":[64,48,0]}`,
			want: []string{"ipv4_prefixes [32 24 16 0]", "ipv6_prefixes [64 48 0]", "same length"}},
		{name: "prefix list against the default", json: `{"ipv4_prefixes":[32,0]}`,
			want: []string{"ipv4_prefixes [32 0]", "ipv6_prefixes [64 48 0]", "same length"}},
		{name: "per_destination_port string", json: `{"per_destination_port":"yes"}`, want: []string{"per_destination_port", `"yes"`}},
		{name: "name number", json: `{"name":5}`, want: []string{"name", "5"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := new(RakeLimit)
			err := noPanic(t, func() error {
				if err := json.Unmarshal([]byte(tt.json), r); err != nil {
					return err
				}
				return r.Validate()
			})
			if tt.want != nil {
				wantErrContaining(t, err, tt.want...)
				t.Logf("error: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("got %v, want no error", err)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

// wantConfig checks the limit and window that config() derives, defaults
// filled in.
func wantConfig(t *testing.T, r *RakeLimit, limit uint32, window time.Duration) {
	t.Helper()
	s, err := r.config()
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	if c := s.Limiter; c.Limit != limit || c.Window != window {
		t.Errorf("config: limit %d window %v, want limit %d window %v", c.Limit, c.Window, limit, window)
	}
}

// TestJSONRoundTrip proves that what the Caddyfile adapter writes (the
// struct marshaled by encoding/json) decodes back to the same settings
// through the strict UnmarshalJSON. Note that encoding/json writes the
// []uint8 prefix lists as base64 strings ("IBgQAA==" for [32 24 16 0]), as
// the golden adapt files show; decoding accepts both that and a list.
func TestJSONRoundTrip(t *testing.T) {
	in := RakeLimit{
		Name:               "edge",
		Limit:              500,
		Window:             caddy.Duration(2 * time.Second),
		LevelLimits:        map[int]uint32{1: 200},
		UnlimitedLevels:    []int{5},
		IPv4Prefixes:       []int{32, 24, 16, 0},
		IPv6Prefixes:       []int{64, 56, 48, 0},
		PerDestinationPort: true,
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out := new(RakeLimit)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	if !reflect.DeepEqual(*out, in) {
		t.Errorf("round trip of %s:\ngot  %+v\nwant %+v", b, *out, in)
	}
	if err := out.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

const adaptDir = "testdata/caddyfile_adapt"

// adaptSeparator divides a golden file's Caddyfile from its expectation.
const adaptSeparator = "\n----------\n"

// TestCaddyfileAdapt proves, with golden files in Caddy's own format, what
// the Caddyfile adapter makes of the directive and of the global option
// servers { packet_conn_wrappers { rakelimit } }: the wrapper appears as
// {"wrapper":"rakelimit", ...} in the server's packet_conn_wrappers, and bad
// input fails adaptation with the expected message. A file whose expectation
// does not start with '{' holds an error substring. With -update, the JSON
// expectations are rewritten from the adapter's output.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(adaptDir, "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no golden files in %s", adaptDir)
	}
	// Glob returns the names sorted.
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			text := strings.ReplaceAll(string(data), "\r\n", "\n")
			before, after, ok := strings.Cut(text, adaptSeparator)
			if !ok {
				t.Fatalf("no %q line", strings.TrimSpace(adaptSeparator))
			}
			input := strings.TrimSpace(before) + "\n"
			expected := strings.TrimSpace(after)

			if !strings.HasPrefix(expected, "{") {
				_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
				if err == nil {
					t.Fatalf("adapting succeeded, want an error containing %q", expected)
				}
				if !strings.Contains(err.Error(), expected) {
					t.Errorf("error %q does not contain %q", err, expected)
				}
				t.Logf("error: %v", err)
				return
			}

			if *update {
				got, err := adaptIndented(input)
				if err != nil {
					t.Fatal(err)
				}
				out := input + strings.TrimSpace(adaptSeparator) + "\n" + got + "\n"
				if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				expected = got
			}
			if !caddytest.CompareAdapt(t, file, input, "caddyfile", expected) {
				t.Errorf("adapted JSON differs from %s (diff above; rerun with -update to rewrite it)", file)
			}
		})
	}
}

// adaptIndented adapts a Caddyfile and indents the JSON as CompareAdapt
// does.
func adaptIndented(input string) (string, error) {
	result, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), map[string]any{})
	if err != nil {
		return "", err
	}
	if len(warnings) > 0 {
		return "", fmt.Errorf("warnings: %v", warnings)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, result, "", "\t"); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// TestDocsCaddyfilesFormatted: every Caddyfile in the README and the
// example is as `caddy fmt` writes it, so that a reader who copies one gets
// no "Caddyfile input is not formatted" warning.
func TestDocsCaddyfilesFormatted(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{}
	for i, part := range strings.Split(string(readme), "```caddyfile\n")[1:] {
		block, _, ok := strings.Cut(part, "```")
		if !ok {
			t.Fatalf("README block %d is not closed", i)
		}
		blocks[fmt.Sprintf("README block %d", i)] = block
	}
	if len(blocks) < 3 {
		t.Fatalf("found %d Caddyfile blocks in the README", len(blocks))
	}
	example, err := os.ReadFile("testdata/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	blocks["testdata/Caddyfile"] = string(example)
	for name, block := range blocks {
		if got := string(caddyfile.Format([]byte(block))); got != block {
			t.Errorf("%s is not formatted; caddy fmt writes:\n%s", name, got)
		}
	}
}

// ptr returns a pointer to v, for the options that tell unset from zero.
func ptr[T any](v T) *T { return &v }
