package filterbench

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	o, err := ParseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultOptions()
	if o.Rounds != 15 || o.Repeat != def.Repeat || o.Once != def.Once || o.LeadIn != defaultLeadIn || o.Clock != ClockKernel || o.Cases != nil ||
		o.CloudflareVersion != CloudflareVersion || o.CacheDir == "" {
		t.Errorf("defaults: %+v", o)
	}
	o, err = ParseFlags([]string{"-rounds", "3", "-cases", "ipv4-under,ipv4-random", "-clock", "wall", "-cloudflare", "/x.o", "-out", "/tmp/f.md"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Rounds != 3 || !slices.Equal(o.Cases, []string{"ipv4-under", "ipv4-random"}) || o.Clock != ClockWall ||
		o.CloudflareObject != "/x.o" || o.Out != "/tmp/f.md" {
		t.Errorf("parsed: %+v", o)
	}
	if _, err := ParseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-rounds", "0"}, "-rounds 0: want at least 1"},
		{[]string{"-repeat", "-5"}, "-repeat -5: want at least 1"},
		{[]string{"-once", "0"}, "-once 0: want at least 1"},
		{[]string{"-warmup", "-1"}, "-warmup -1: want at least 0"},
		{[]string{"-lead-in", "-1"}, "-lead-in -1: want at least 0"},
		{[]string{"-lead-in", "20000000"}, "-lead-in 20000000: want at most"},
		{[]string{"-repeat", "4294967296"}, "-repeat 4294967296: want at most"},
		{[]string{"-clock", "tsc"}, `-clock "tsc": want kernel or wall`},
		{[]string{"-cases", "ipv4-under,nope"}, `-cases "nope": unknown case`},
		{[]string{"-cache", ""}, "-cache \"\": want a directory"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := ParseFlags(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseFlags(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseFlags(%q): a multi-line error %q", tt.args, err)
		}
	}
}

func TestCases(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range cases() {
		if seen[c.key] {
			t.Errorf("case key %q twice", c.key)
		}
		seen[c.key] = true
		if err := c.ours.Validate(); err != nil {
			t.Errorf("case %s: this filter's configuration: %v", c.key, err)
		}
		switch {
		case c.once && (c.wantOurs != anyVerdict || c.wantCloudflare != anyVerdict):
			t.Errorf("case %s: a verdict expected of packets from new sources, which are a mix", c.key)
		case c.once && c.randomSource:
			t.Errorf("case %s: both distinct frames and the bench switch", c.key)
		case c.randomSource && c.cloudflareLimit != 0:
			t.Errorf("case %s: Cloudflare's has no bench switch, so no new source per repetition", c.key)
		case !c.once && !c.randomSource && (c.wantOurs == anyVerdict || c.wantCloudflare == anyVerdict):
			t.Errorf("case %s: one source and no expected verdict", c.key)
		}
	}
	// The three cases are there, with Cloudflare's.
	for _, k := range []string{"ipv4-under", "ipv4-over", "ipv4-random"} {
		if cs := selectCases([]string{k}); len(cs) != 1 || cs[0].cloudflareLimit == 0 {
			t.Errorf("case %s: missing or without Cloudflare's", k)
		}
	}
	if got := selectCases(nil); len(got) != len(CaseKeys()) {
		t.Errorf("no keys selected %d cases, want all %d", len(got), len(CaseKeys()))
	}
}
