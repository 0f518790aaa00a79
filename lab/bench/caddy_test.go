//go:build linux

package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/rakelimit/caddy-rakelimit"
)

// TestCaddyfileAdapts: the configuration of each built-in variant adapts,
// with the directive where it belongs and the routes the benchmark uses.
func TestCaddyfileAdapts(t *testing.T) {
	s := site{port: 8443, httpPort: 8080, adminPort: 2999, backendPort: 9000, storage: "/tmp/x/storage", www: "/tmp/x/www"}
	for _, v := range append(builtinVariants(), Variant{Name: "block", Directive: expandBlock("rakelimit { limit 500; window 2s }")}) {
		t.Run(v.Name, func(t *testing.T) {
			js, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(s.caddyfile(v.Directive)), nil)
			if err != nil {
				t.Fatalf("adapting:\n%s\n%v", s.caddyfile(v.Directive), err)
			}
			for _, w := range warnings {
				if !strings.Contains(w.Message, "not formatted") {
					t.Errorf("warning: %+v", w)
				}
			}
			var cfg struct {
				Admin struct {
					Listen string `json:"listen"`
				} `json:"admin"`
				Apps struct {
					HTTP struct {
						Servers map[string]struct {
							Listen             []string          `json:"listen"`
							PacketConnWrappers []json.RawMessage `json:"packet_conn_wrappers"`
						} `json:"servers"`
					} `json:"http"`
				} `json:"apps"`
			}
			if err := json.Unmarshal(js, &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.Admin.Listen != "127.0.0.1:2999" {
				t.Errorf("admin listens on %q", cfg.Admin.Listen)
			}
			wrappers := 0
			var listens []string
			for _, srv := range cfg.Apps.HTTP.Servers {
				wrappers += len(srv.PacketConnWrappers)
				listens = append(listens, srv.Listen...)
			}
			if want := min(len(v.Directive), 1); wrappers != want {
				t.Errorf("%d packet conn wrappers, want %d: %s", wrappers, want, js)
			}
			if strings.Join(listens, ",") != ":8443" {
				t.Errorf("servers listen on %v, want :8443 only", listens)
			}
			for _, want := range []string{`"/upload"`, `"127.0.0.1:9000"`, `"/files/*"`, `"root":"/tmp/x/www"`, `"body":"hello"`, `"install_trust":false`, `"persist":false`} {
				if !strings.Contains(string(js), want) {
					t.Errorf("config lacks %s: %s", want, js)
				}
			}
			if v.Name == "block" && !strings.Contains(string(js), `"limit":500`) {
				t.Errorf("block directive not applied: %s", js)
			}
		})
	}
}

func TestParseStatCPU(t *testing.T) {
	// pid (comm) state ppid ... utime (14) stime (15) ...; a name with
	// spaces and parentheses.
	stat := "4242 (caddy (x) y) S 1 4242 4242 0 -1 4194560 9000 0 0 0 1234 567 0 0 20 0 12 0 100 2000000 5000"
	got, err := parseStatCPU(stat)
	if err != nil || got != 1801 {
		t.Fatalf("parseStatCPU = %d, %v; want 1801", got, err)
	}
	if _, err := parseStatCPU("4242 (caddy) S 1"); err == nil {
		t.Error("short stat parsed")
	}
	a := procSample{cpuTicks: 100}
	b := procSample{at: a.at.Add(2e9), cpuTicks: 250}
	if p := cpuPercent(a, b); p != 75 {
		t.Errorf("150 ticks in 2 s = %v%%, want 75%%", p)
	}
}

func TestParseVmHWM(t *testing.T) {
	got, err := parseVmHWM("Name:\tcaddy\nVmPeak:\t  900 kB\nVmHWM:\t   65432 kB\nVmRSS:\t 60000 kB\n")
	if err != nil || got != 65432*1024 {
		t.Fatalf("parseVmHWM = %d, %v", got, err)
	}
	if _, err := parseVmHWM("Name:\tcaddy\n"); err == nil {
		t.Error("status without VmHWM parsed")
	}
}

func TestModuleRoot(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := moduleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "caddy", "main.go")); err != nil {
		t.Errorf("module root %s has no cmd/caddy: %v", root, err)
	}
	if _, err := moduleRoot(t.TempDir()); err == nil || !strings.Contains(err.Error(), "pass -caddy") {
		t.Errorf("outside the repository: err = %v", err)
	}
}
