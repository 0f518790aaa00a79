//go:build linux

package bench

import (
	"errors"
	"flag"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantErr   string // substring; empty: success
		scenarios []string
		variants  []string
	}{
		{name: "defaults", args: nil, scenarios: ScenarioNames(), variants: []string{"plain", "rakelimit"}},
		{name: "some scenarios", args: []string{"-scenarios", "pulse, idle,pulse"}, scenarios: []string{"pulse", "idle"},
			variants: []string{"plain", "rakelimit"}},
		{name: "unknown scenario", args: []string{"-scenarios", "idle,nope"},
			wantErr: `-scenarios: unknown scenario "nope": want all or some of idle, one-source, many-ports`},
		{name: "extra variant runs with all", args: []string{"-variant", "userspace=rakelimit { mode userspace }"},
			scenarios: ScenarioNames(), variants: []string{"plain", "rakelimit", "userspace"}},
		{name: "selected variant, plain added first", args: []string{"-variant", "strict=rakelimit 200", "-variants", "strict"},
			scenarios: ScenarioNames(), variants: []string{"plain", "strict"}},
		{name: "unknown variant", args: []string{"-variants", "rakelimit,fast"},
			wantErr: `-variants: unknown variant "fast": want all or some of plain, rakelimit`},
		{name: "variant without =", args: []string{"-variant", "rakelimit 200"}, wantErr: `want name=directive text`},
		{name: "variant bad name", args: []string{"-variant", "Big Name=rakelimit"}, wantErr: `name "Big Name"`},
		{name: "variant empty directive", args: []string{"-variant", "x="}, wantErr: `empty directive`},
		{name: "variant built in", args: []string{"-variant", "plain=rakelimit"}, wantErr: `"plain" is built in`},
		{name: "variant twice", args: []string{"-variant", "a=rakelimit 1", "-variant", "a=rakelimit 2"}, wantErr: `"a" given twice`},
		{name: "variant unbalanced", args: []string{"-variant", "a=rakelimit {"}, wantErr: `unbalanced braces`},
		{name: "reps", args: []string{"-reps", "0"}, wantErr: "-reps 0: want 1 to 100"},
		{name: "scale", args: []string{"-scale", "0"}, wantErr: "-scale 0: want 0.05 to 100"},
		{name: "transfer scale", args: []string{"-transfer-scale", "1000"}, wantErr: "-transfer-scale 1000"},
		{name: "caddy cpus", args: []string{"-caddy-cpus", "1,2-3"}, scenarios: ScenarioNames(), variants: []string{"plain", "rakelimit"}},
		{name: "caddy cpus not a list", args: []string{"-caddy-cpus", "1;rm"}, wantErr: `-caddy-cpus "1;rm"`},
		{name: "gtlsclient mode", args: []string{"-gtlsclient", "maybe"}, wantErr: `-gtlsclient "maybe": want auto, require or off`},
		{name: "port range", args: []string{"-port", "70000"}, wantErr: "-port 70000: want 1 to 65535"},
		{name: "same ports", args: []string{"-port", "9000", "-admin-port", "9000"}, wantErr: "-port and -admin-port are both 9000"},
		{name: "timeout", args: []string{"-timeout", "1ns"}, wantErr: "-timeout 1ns"},
		{name: "unknown flag", args: []string{"-bogus"}, wantErr: "flag provided but not defined: -bogus (rakebench -h lists the flags)"},
		{name: "dashboard", args: []string{"-scenarios", "idle,one-source", "-dashboard", "one-source"},
			scenarios: []string{"idle", "one-source"}, variants: []string{"plain", "rakelimit"}},
		{name: "dashboard scenario not run", args: []string{"-scenarios", "idle", "-dashboard", "one-source"},
			wantErr: `-dashboard one-source: scenario "one-source" is not among the scenarios run`},
		{name: "dashboard of plain", args: []string{"-dashboard", "idle/plain"}, wantErr: "plain Caddy exports no rakelimit metrics"},
		{name: "dashboard variant not run", args: []string{"-dashboard", "idle/strict"},
			wantErr: `-dashboard idle/strict: variant "strict" is not among the variants run`},
		{name: "dashboard with -from", args: []string{"-from", "r.json", "-dashboard", "idle"}, wantErr: "needs a measuring run"},
		{name: "stray argument", args: []string{"idle"}, wantErr: `unexpected argument "idle"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var sc, vs []string
			for _, s := range o.Scenarios {
				sc = append(sc, s.Name)
			}
			for _, v := range o.Variants {
				vs = append(vs, v.Name)
			}
			if strings.Join(sc, ",") != strings.Join(tt.scenarios, ",") || strings.Join(vs, ",") != strings.Join(tt.variants, ",") {
				t.Errorf("scenarios %v, variants %v; want %v, %v", sc, vs, tt.scenarios, tt.variants)
			}
		})
	}
}

func TestExpandBlock(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"rakelimit", "rakelimit"},
		{"rakelimit 200", "rakelimit 200"},
		{"rakelimit { mode userspace }", "rakelimit {\n\tmode userspace\n}"},
		{"rakelimit { limit 500; window 2s; }", "rakelimit {\n\tlimit 500\n\twindow 2s\n}"},
		{"rakelimit {\n\tlimit 500\n}", "rakelimit {\n\tlimit 500\n}"},
		{"header X-Host {host}", "header X-Host {host}"},
	} {
		if got := expandBlock(tt.in); got != tt.want {
			t.Errorf("expandBlock(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseFlagsHelp(t *testing.T) {
	var out strings.Builder
	if _, err := ParseFlags([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"usage: rakebench", "-scenarios", "-variant", "-scale"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseFlagsValues(t *testing.T) {
	o, err := ParseFlags([]string{"-variant", "u=rakelimit {\n\tmode userspace\n}", "-scale", "0.2", "-reps", "2", "-timeout", "2s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Variants[2].Directive != "rakelimit {\n\tmode userspace\n}" || o.Reps != 2 || o.Timeout != 2*time.Second {
		t.Errorf("options %+v", o)
	}
	if got := o.floodDuration(); got != 2*time.Second {
		t.Errorf("flood duration at scale 0.2 = %v, want 2s", got)
	}
	if got := o.stallTimeout(); got != 2*time.Second {
		t.Errorf("stall timeout at scale 0.2 = %v, want the 2s floor", got)
	}
	if o.Args[0] != "rakebench" || o.Args[len(o.Args)-1] != "2s" {
		t.Errorf("args %q", o.Args)
	}
	if o.Dashboard != "" {
		t.Errorf("dashboard %q by default", o.Dashboard)
	}
	o, err = ParseFlags([]string{"-variant", "u=rakelimit { mode userspace }", "-dashboard", "spread-1024/u"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Dashboard != "spread-1024" || o.DashboardVariant != "u" {
		t.Errorf("-dashboard spread-1024/u: scenario %q, variant %q", o.Dashboard, o.DashboardVariant)
	}
	if o, err = ParseFlags([]string{"-dashboard", "idle"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.Dashboard != "idle" || o.DashboardVariant != "rakelimit" {
		t.Errorf("-dashboard idle: scenario %q, variant %q, want idle and rakelimit", o.Dashboard, o.DashboardVariant)
	}
}

func TestCheckPortFree(t *testing.T) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPortFree("-port", port, true); err != nil {
		t.Fatalf("free port %d: %v", port, err)
	}
	u, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	err = checkPortFree("-port", port, true)
	if err == nil || !strings.Contains(err.Error(), "-port "+strconv.Itoa(port)+": port in use (udp)") {
		t.Fatalf("port taken for UDP: err = %v", err)
	}
	if err := checkPortFree("-admin-port", port, false); err != nil {
		t.Fatalf("UDP-only use should not matter to a TCP port: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := checkPortFree("-admin-port", port, false); err == nil || !strings.Contains(err.Error(), "port in use (tcp)") {
		t.Fatalf("port taken for TCP: err = %v", err)
	}
}
