package rakelimit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestValidateJSONConfig runs whole JSON configurations through
// caddy.Validate, the path of `caddy validate` and `caddy run`: bad settings
// fail with an error naming the field and the value, before any BPF is
// loaded (so this test needs no privilege).
func TestValidateJSONConfig(t *testing.T) {
	tests := []struct {
		name    string
		wrapper string
		want    []string
	}{
		{"limit too large", `{"wrapper":"rakelimit","limit":20000000}`, []string{"limit 20000000 out of range"}},
		{"limit negative", `{"wrapper":"rakelimit","limit":-3}`, []string{"limit", "-3"}},
		{"limit not a number", `{"wrapper":"rakelimit","limit":"many"}`, []string{"limit", `"many"`}},
		{"window unparseable", `{"wrapper":"rakelimit","window":"soon"}`, []string{"window", `"soon"`}},
		{"window tiny", `{"wrapper":"rakelimit","window":"1ms"}`, []string{"window 1ms out of range"}},
		{"window negative", `{"wrapper":"rakelimit","window":"-2s"}`, []string{"window -2s out of range"}},
		{"unknown field", `{"wrapper":"rakelimit","limmit":5}`, []string{"limmit"}},
		{"level out of range", `{"wrapper":"rakelimit","level_limits":{"8":5}}`, []string{"level 8 does not exist"}},
		{"prefix too long", `{"wrapper":"rakelimit","ipv4_prefixes":[40,0],"ipv6_prefixes":[64,0]}`, []string{"ipv4_prefixes [40 0]", "/40"}},
		{"allowlist over the kernel's cap", `{"wrapper":"rakelimit","allow":[` + manyPrefixes(1100) + `]}`, []string{"allow: 1100 IPv4 prefixes", "1024"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":[":0"],` +
				`"packet_conn_wrappers":[` + tt.wrapper + `]}}}}}`
			var cfg caddy.Config
			if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
				t.Fatal(err)
			}
			err := caddy.Validate(&cfg)
			if err == nil {
				t.Fatalf("config %s validated", tt.wrapper)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// manyPrefixes lists n distinct IPv4 addresses as JSON strings.
func manyPrefixes(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`"10.0.%d.%d"`, i/256, i%256)
	}
	return strings.Join(out, ",")
}

// TestAllowDuplicatesCountOnce: the same prefix written twice, or as an
// address and its /32, takes one allowlist entry, so 1,024 distinct
// prefixes fit however often they are repeated.
func TestAllowDuplicatesCountOnce(t *testing.T) {
	r := RakeLimit{Allow: []string{"10.0.0.1", "10.0.0.1/32", "::ffff:10.0.0.1/128", "10.0.0.0/8", "10.1.2.3/8"}}
	s, err := r.config()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Allow) != 2 {
		t.Fatalf("allow %v became %v, want 2 prefixes", r.Allow, s.Allow)
	}
	var list []string
	for i := range 1024 {
		list = append(list, fmt.Sprintf("10.0.%d.%d", i/256, i%256), fmt.Sprintf("10.0.%d.%d/32", i/256, i%256))
	}
	r = RakeLimit{Allow: list}
	if err := r.Validate(); err != nil {
		t.Fatalf("1,024 distinct prefixes, each written twice: %v", err)
	}
}
