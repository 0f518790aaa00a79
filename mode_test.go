//go:build linux

package rakelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// siteWithMode is siteWithLimit with a mode option.
const siteWithMode = `127.0.0.1:{port}, localhost:{port} {
	tls internal
	rakelimit {
		limit %d
		mode %s
	}
	respond "hello over {http.request.proto}"
}
`

// TestUserspaceMode runs the limiter in userspace, in front of quic-go, on a
// real Caddy: a flood at 30 times the limit is held while requests from
// another address succeed; the metrics and the admin view say the mode; a
// reload changes the limit on the running listener; a reload that asks for
// the kernel filter is refused, saying to restart; and removing the
// directive lets the listener's datagrams through again.
func TestUserspaceMode(t *testing.T) {
	const limit = 100
	c := startCaddyWith(t, &testCaddy{admin: freePort(t)}, fmt.Sprintf(siteWithMode, limit, engine.ModeUserspace))
	lim := limiterNamed(DefaultName)
	if lim == nil || lim.Mode() != engine.ModeUserspace {
		t.Fatalf("limiter %v not in userspace mode", lim)
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/", c.port)
	done := make(chan struct{})
	var sent int
	var dropped uint64
	go func() { sent, dropped = c.floodDropped(limit); close(done) }()
	ok := 0
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, _, err := h3Get(ctx, legitSrc, url)
		cancel()
		if err == nil && body == "hello over HTTP/3.0" {
			ok++
		}
		time.Sleep(100 * time.Millisecond)
	}
	<-done
	if !held(sent, dropped, limit) || ok != 5 {
		t.Fatalf("userspace: a flood of %d at 30x the limit, %d dropped; %d of 5 requests succeeded beside it", sent, dropped, ok)
	}
	_, m := c.adminGet("/metrics")
	if got := metric(t, m, "caddy_rakelimit_mode", `mode="userspace"`, fmt.Sprintf(`listener="[::]:%d"`, c.port)); got != 1 {
		t.Errorf("caddy_rakelimit_mode{mode=userspace} = %v", got)
	}
	_, body := c.adminGet("/rakelimit/")
	var view report.View
	if err := json.Unmarshal([]byte(body), &view); err != nil || len(view.Limiters) != 1 || view.Limiters[0].Mode != engine.ModeUserspace {
		t.Errorf("admin view %s, %v: want mode userspace", body, err)
	}

	// A new limit on the running listener, in the same mode or auto.
	if err := c.load(fmt.Sprintf(siteWithMode, 3*limit, engine.ModeAuto)); err != nil {
		t.Fatal(err)
	}
	if limiterNamed(DefaultName) != lim || lim.Setting().Config.Limiter.Limit != 3*limit || lim.Mode() != engine.ModeUserspace {
		t.Fatalf("after the reload: limiter %v, limit %d, mode %s", lim, lim.Setting().Config.Limiter.Limit, lim.Mode())
	}
	err := c.load(fmt.Sprintf(siteWithMode, limit, engine.ModeBPF))
	if err == nil || !strings.Contains(err.Error(), "runs in userspace mode, and mode bpf cannot take over its running listeners; restart Caddy") {
		t.Fatalf("a reload to mode bpf: %v, want a refusal that says to restart", err)
	}

	// Without the directive the conn lets everything through.
	if err := c.load("127.0.0.1:{port}, localhost:{port} {\n\ttls internal\n\trespond \"hello\"\n}\n"); err != nil {
		t.Fatal(err)
	}
	if limiterNamed(DefaultName) != nil {
		t.Fatal("limiter still registered after its removal")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if body, _, err := h3Get(ctx, legitSrc, url); err != nil || body != "hello" {
		t.Fatalf("after removing rakelimit: %q, %v", body, err)
	}
}

// TestModeChangeRefused: a limiter running in the kernel cannot move to
// userspace on a reload, since Caddy does not call wrappers on a running
// socket; the reload is refused, saying to restart, and the filter stays.
func TestModeChangeRefused(t *testing.T) {
	const limit = 100
	c := startCaddy(t, fmt.Sprintf(siteWithMode, limit, engine.ModeBPF))
	lim := limiterNamed(DefaultName)
	err := c.load(fmt.Sprintf(siteWithMode, limit, engine.ModeUserspace))
	if err == nil || !strings.Contains(err.Error(), "runs in bpf mode, and mode userspace cannot take over") {
		t.Fatalf("a reload to mode userspace: %v", err)
	}
	if limiterNamed(DefaultName) != lim || lim.Mode() != engine.ModeBPF {
		t.Fatal("the refused reload changed the limiter")
	}
	if sent, dropped := c.floodDropped(limit); !held(sent, dropped, limit) {
		t.Fatalf("after the refused reload: a flood of %d at 30x the limit, %d dropped", sent, dropped)
	}
}

// TestModesAcceptTheSameConfigurations: a configuration valid in one mode
// is valid in the others, and one invalid in one is invalid in all, with
// the same error.
func TestModesAcceptTheSameConfigurations(t *testing.T) {
	for _, options := range []string{
		`"limit":500`,
		`"limit":500,"level_limits":{"3":100000},"established_limit":300000`,
		`"classify":false,"allow":["192.0.2.0/24","2001:db8::/32"]`,
		`"limit":0,"window":"1ms"`,
		`"limit":10000,"window":"1h"`,
		`"block_source_ports":["1024-1023"]`,
		`"version_negotiation":2000000`,
	} {
		var errs []string
		modes := []string{engine.ModeAuto, engine.ModeXDP, engine.ModeBPF, engine.ModeUserspace}
		for _, mode := range modes {
			var r RakeLimit
			err := json.Unmarshal([]byte(`{`+options+`,"mode":"`+mode+`"}`), &r)
			if err == nil {
				err = r.Validate()
			}
			errs = append(errs, fmt.Sprint(err))
		}
		for i := range errs {
			if errs[i] != errs[0] {
				t.Errorf("%s: %s %s; %s %s", options, modes[0], errs[0], modes[i], errs[i])
			}
		}
	}
	var r RakeLimit
	if err := json.Unmarshal([]byte(`{"mode":"kernel"}`), &r); err != nil || r.Validate() == nil ||
		!strings.Contains(r.Validate().Error(), `mode "kernel": want auto, xdp, bpf or userspace`) {
		t.Errorf("mode kernel: %v", r.Validate())
	}
}

// TestXDPOptions: xdp_interfaces and xdp_generic are checked where they are
// read, and go with mode xdp, or mode auto with interfaces named.
func TestXDPOptions(t *testing.T) {
	for _, tt := range []struct {
		json, err string
	}{
		{`"mode":"xdp"`, ""},
		{`"mode":"xdp","xdp_interfaces":["eth0","eth1"],"xdp_generic":true`, ""},
		{`"xdp_interfaces":["eth0"]`, ""},
		{`"xdp_interfaces":["eth0"],"xdp_generic":true`, ""},
		{`"mode":"xdp","xdp_interfaces":["eth0","eth0"]`, `xdp_interfaces: "eth0" listed twice`},
		{`"mode":"xdp","xdp_interfaces":["a/b"]`, `xdp_interfaces: invalid interface name "a/b"`},
		{`"mode":"xdp","xdp_interfaces":["abcdefghijklmnop"]`, `invalid interface name "abcdefghijklmnop": want 1 to 15 bytes`},
		{`"mode":"xdp","xdp_interfaces":[""]`, `invalid interface name ""`},
		{`"mode":"bpf","xdp_interfaces":["eth0"]`, `xdp_interfaces and xdp_generic need mode xdp (or auto), and mode is bpf`},
		{`"mode":"userspace","xdp_generic":true`, `need mode xdp (or auto), and mode is userspace`},
		{`"xdp_generic":true`, `xdp_generic in mode auto needs xdp_interfaces`},
		{`"mode":"xdp","xdp_interfaces":"eth0"`, `xdp_interfaces: invalid value "eth0"`},
	} {
		var r RakeLimit
		err := json.Unmarshal([]byte(`{`+tt.json+`}`), &r)
		if err == nil {
			err = r.Validate()
		}
		if (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("%s: %v, want %q", tt.json, err, tt.err)
		}
	}
}
