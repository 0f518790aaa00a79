package rakelimit

import (
	"encoding/json"
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
