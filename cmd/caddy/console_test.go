//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestOperatorViews runs Caddy with rakelimit and its admin endpoint, floods
// it from one loopback address, and checks what an operator sees: caddy
// rakelimit status names the flooding stream and the verdict; caddy
// rakelimit top, in a real terminal (tmux), shows the stream within 2 s
// of the flood's start and drops it after the flood has expired; top exits
// cleanly on Ctrl-C and prints plain text when not on a terminal; the
// Grafana dashboard and the Prometheus rules use only metrics and labels
// of the live scrape; and an unreachable endpoint gets a one-line error.
func TestOperatorViews(t *testing.T) {
	testutil.RequireRoot(t)
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		testutil.SkipOrFail(t, "tmux is needed (make deps installs it): %v", err)
	}
	const limit = 100
	port, admin := testutil.FreePort(t), testutil.FreePort(t)
	config := strings.Replace(processCaddyfile(t, port, "", fmt.Sprintf("rakelimit %d", limit)), "admin off",
		fmt.Sprintf("admin localhost:%d", admin), 1)
	cfg := writeConfig(t, config)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := testCaddy(t, nil, nil, cfg, port)
	testutil.StartCaddy(t, c)
	address := fmt.Sprintf("localhost:%d", admin)
	stream := floodSrc.String() + "/32"

	// top in a detached tmux session on a server of the test's own.
	sock := fmt.Sprintf("rakelimit-test-%d", os.Getpid())
	tm := func(args ...string) (string, error) {
		b, err := exec.Command(tmux, append([]string{"-L", sock}, args...)...).CombinedOutput()
		return string(b), err
	}
	if o, err := tm("new-session", "-d", "-x", "160", "-y", "50", "env", "RAKELIMIT_AS_CADDY=1",
		c.Bin, "rakelimit", "top", "--address", address); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, o)
	}
	t.Cleanup(func() { tm("kill-server") })
	screen := func() string {
		o, err := tm("capture-pane", "-p")
		if err != nil {
			t.Fatalf("tmux capture-pane: %v: %s", err, o)
		}
		return o
	}
	waitScreen := func(within time.Duration, what string, ok func(string) bool) (time.Duration, string) {
		start := time.Now()
		for {
			s := screen()
			if ok(s) {
				return time.Since(start), s
			}
			if time.Since(start) > within {
				t.Fatalf("top: %s not within %v; the screen:\n%s", what, within, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitScreen(10*time.Second, "the first screen", func(s string) bool { return strings.Contains(s, "limited streams: none") })

	// The flood: 30 times the limit for 5 s from one address.
	floodStart := time.Now()
	flooded := make(chan int, 1)
	go func() {
		flooded <- testutil.FloodInitials(t, floodSrc, testutil.LoopbackFor(floodSrc, uint16(port)), 30*limit, 5*time.Second)
	}()
	waitScreen(2*time.Second-time.Since(floodStart), "the flooding stream", func(s string) bool { return strings.Contains(s, stream) })
	t.Logf("top showed the flooding stream %v after the flood began", time.Since(floodStart).Round(10*time.Millisecond))

	t.Run("status", func(t *testing.T) {
		o, err := c.Command(ctx, "rakelimit", "status", "--address", address).CombinedOutput()
		if err != nil {
			t.Fatalf("caddy rakelimit status: %v:\n%s", err, o)
		}
		for _, want := range []string{"limiter default  mode bpf", stream + " sport=", "verdict: dropping a flood from " + stream + " at level 0"} {
			if !strings.Contains(string(o), want) {
				t.Errorf("status lacks %q:\n%s", want, o)
			}
		}
		if strings.Contains(string(o), "\x1b[") {
			t.Errorf("status printed escapes to a pipe:\n%q", o)
		}
		t.Logf("caddy rakelimit status:\n%s", o)
	})

	t.Run("top without a terminal, interrupted", func(t *testing.T) {
		top := c.Command(ctx, "rakelimit", "top", "--address", address)
		var o testutil.SyncBuffer
		top.Stdout, top.Stderr = &o, &o
		if err := top.Start(); err != nil {
			t.Fatal(err)
		}
		// Two screens (one a second), waited for: a loaded machine may
		// start the race-built binary late.
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if strings.Count(o.String(), "rakelimit at "+address) >= 2 {
				break
			}
		}
		top.Process.Signal(syscall.SIGINT)
		if err := top.Wait(); err != nil {
			t.Errorf("top after Ctrl-C: %v", err)
		}
		s := o.String()
		if n := strings.Count(s, "rakelimit at "+address); n < 2 || strings.Contains(s, "\x1b[") {
			t.Errorf("top on a pipe: %d screens (want 2 or more), escapes %v:\n%q", n, strings.Contains(s, "\x1b["), s)
		}
	})

	<-flooded
	t.Run("dashboard and rules", func(t *testing.T) {
		_, scrape := testutil.AdminGet(t, admin, "/metrics")
		checkDeployQueries(t, scrape)
	})

	t.Run("unreachable", func(t *testing.T) {
		o, err := c.Command(ctx, "rakelimit", "status", "--address", fmt.Sprintf("localhost:%d", testutil.FreePort(t))).CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(o)), "\n")
		if err == nil || len(lines) != 1 || !strings.Contains(lines[0], "cannot reach Caddy's admin endpoint at localhost:") {
			t.Errorf("status against nothing: %v, want one line saying the endpoint cannot be reached:\n%s", err, o)
		}
	})

	// After the flood, the stream expires (two windows without drops) and
	// leaves the screen.
	d, s := waitScreen(20*time.Second, "the stream gone", func(s string) bool {
		return !strings.Contains(s, stream) && strings.Contains(s, "limited streams: none")
	})
	t.Logf("the stream left top %v after the flood ended; the screen:\n%s", d.Round(100*time.Millisecond), s)
}

// Patterns of the PromQL the deploy files use: metric names, label
// matchers and grouping labels.
var (
	metricRe  = regexp.MustCompile(`caddy_rakelimit_[a-z_]+`)
	matcherRe = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	byRe      = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	sampleRe  = regexp.MustCompile(`^(caddy_rakelimit_[a-z_]+)(?:\{(.*)\})? `)
	pairRe    = regexp.MustCompile(`([a-z_]+)="((?:[^"\\]|\\.)*)"`)
)

// checkDeployQueries reads every PromQL expression of the Grafana dashboard
// and the Prometheus rules and requires each metric, label and literal
// label value they use to be in scrape.
func checkDeployQueries(t *testing.T, scrape string) {
	t.Helper()
	// What the scrape has: metric -> label -> values.
	have := map[string]map[string]map[string]bool{}
	for line := range strings.SplitSeq(scrape, "\n") {
		m := sampleRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := have[m[1]]
		if labels == nil {
			labels = map[string]map[string]bool{}
			have[m[1]] = labels
		}
		for _, p := range pairRe.FindAllStringSubmatch(m[2], -1) {
			if labels[p[1]] == nil {
				labels[p[1]] = map[string]bool{}
			}
			labels[p[1]][p[2]] = true
		}
	}
	exprs := map[string]string{} // expression -> where
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	readJSON(t, filepath.Join("..", "..", "deploy", "grafana", "rakelimit.json"), &dash)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs[tg.Expr] = "panel " + p.Title
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			exprs[fmt.Sprint(q["query"])] = "variable " + v.Name
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "rakelimit-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("rakelimit-rules.yml: %v", err)
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs[r.Expr] = "alert " + r.Alert
			alerts++
		}
	}
	if len(dash.Panels) < 8 || alerts < 5 {
		t.Fatalf("%d panels and %d alerts, want at least 8 and 5", len(dash.Panels), alerts)
	}
	for expr, where := range exprs {
		metrics := metricRe.FindAllString(expr, -1)
		if len(metrics) == 0 {
			t.Errorf("%s: no rakelimit metric in %q", where, expr)
		}
		// Every label an expression names must be on one of its metrics.
		labelValues := func(label string) (map[string]bool, bool) {
			for _, m := range metrics {
				if vals, ok := have[m][label]; ok {
					return vals, true
				}
			}
			return nil, false
		}
		for _, m := range metrics {
			if have[m] == nil {
				t.Errorf("%s: metric %s is not exported (expression %q)", where, m, expr)
			}
		}
		for _, mm := range matcherRe.FindAllStringSubmatch(expr, -1) {
			label, op, value := mm[1], mm[2], mm[3]
			vals, ok := labelValues(label)
			if !ok {
				t.Errorf("%s: label %s is on none of %v (expression %q)", where, label, metrics, expr)
				continue
			}
			if strings.Contains(value, "$") || op == "!=" || op == "!~" {
				continue // a dashboard variable, or a negation
			}
			for _, alt := range strings.Split(value, "|") {
				// A scrape in bpf mode lacks the mode label's other value.
				if !vals[alt] && !(label == "mode" && alt == engine.ModeUserspace) {
					t.Errorf("%s: %s=%q: the scrape has no such value (it has %v)", where, label, alt, keys(vals))
				}
			}
		}
		for _, by := range byRe.FindAllStringSubmatch(expr, -1) {
			for _, label := range strings.Split(by[1], ",") {
				if label = strings.TrimSpace(label); label != "" {
					if _, ok := labelValues(label); !ok {
						t.Errorf("%s: grouping label %s is on none of %v", where, label, metrics)
					}
				}
			}
		}
		for _, lf := range regexp.MustCompile(`label_values\(\s*[a-z_]+\s*,\s*([a-z_]+)\s*\)`).FindAllStringSubmatch(expr, -1) {
			if _, ok := labelValues(lf[1]); !ok {
				t.Errorf("%s: label_values of %s, which is on none of %v", where, lf[1], metrics)
			}
		}
	}
	t.Logf("%d expressions checked against %d metrics of the scrape", len(exprs), len(have))
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
