package engine

import (
	"net/netip"
	"testing"

	"go.uber.org/zap/zapcore"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestSettingsFields: the log line that describes a limiter has a field for
// each of its report's settings, named as there, with the allowlist counted
// and a lifted level written off.
func TestSettingsFields(t *testing.T) {
	c := testutil.QUICLimits(1000, 200_000)
	c.Limiter.LevelLimits = map[int]uint32{3: sketch.Unlimited}
	for _, p := range []string{"192.0.2.0/24", "198.51.100.7/32", "2001:db8::/32"} {
		c.Allow = append(c.Allow, netip.MustParsePrefix(p))
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range SettingsFields(c) {
		f.AddTo(enc)
	}
	for _, tt := range []struct {
		key  string
		want any
	}{
		{"limit", uint32(1000)},
		{"allowlisted_prefixes", int64(3)},
		{"classify", true},
		{"version_negotiation", c.Negotiation},
	} {
		if got := enc.Fields[tt.key]; got != tt.want {
			t.Errorf("%s = %v (%T), want %v (%T)", tt.key, got, got, tt.want, tt.want)
		}
	}
	if _, ok := enc.Fields["allow"]; ok {
		t.Errorf("the log line lists the allowlist: %v", enc.Fields["allow"])
	}
	levels, ok := enc.Fields["level_limits"].([]any)
	if !ok || len(levels) != 4 || levels[0] != "1000" || levels[3] != "off" {
		t.Errorf("level_limits = %#v, want 1000 at level 0 and off at level 3", enc.Fields["level_limits"])
	}
}
