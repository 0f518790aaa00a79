//go:build linux

package rakelimit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// The operator's view under a flood: metrics, the admin API, logs of limited
// streams, dry run and the allowlist, on a real Caddy.

// adminGet fetches path from the admin endpoint of c.
func (c *testCaddy) adminGet(path string) (int, string) {
	c.t.Helper()
	return testutil.AdminGet(c.t, c.admin, path)
}

// metric returns the value of the sample of name whose labels include all of
// want (label="value" pairs), from a Prometheus text exposition.
func metric(t *testing.T, exposition, name string, want ...string) float64 {
	t.Helper()
	return testutil.Metric(t, exposition, name, want...)
}

// TestMetricsAndAdmin floods one listener and reads /metrics and
// /rakelimit/ on the admin endpoint: the counters move by the flood, the
// settings are reported, and the admin JSON names the flooding stream.
func TestMetricsAndAdmin(t *testing.T) {
	const limit, rate = 200, 5000
	c := startCaddyWith(t, &testCaddy{admin: freePort(t)}, fmt.Sprintf(siteWithLimit, limit))
	labels := []string{`limiter="default"`, `family="ipv4"`, `class="opening"`, `verdict="dropped"`, `level="0"`}
	code, before := c.adminGet("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, before)
	}
	dropped0 := metric(t, before, "caddy_rakelimit_packets_total", labels...)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	sent := quicFlood(t, floodSrc, dst, rate, 2*time.Second)

	_, after := c.adminGet("/metrics")
	dropped := metric(t, after, "caddy_rakelimit_packets_total", labels...) - dropped0
	if dropped < float64(sent-4*limit) || dropped > float64(sent) {
		t.Errorf("caddy_rakelimit_packets_total{verdict=dropped} rose by %v for a flood of %d", dropped, sent)
	}
	for _, m := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"caddy_rakelimit_limit_packets_per_second", []string{`class="opening"`, `level="0"`}, limit},
		{"caddy_rakelimit_limit_packets_per_second", []string{`class="established"`, `level="0"`}, DefaultEstablishedLimit},
		{"caddy_rakelimit_limit_packets_per_second", []string{`class="opening"`, `level="3"`}, DefaultOpeningTotal},
		{"caddy_rakelimit_version_negotiation_per_second", nil, DefaultVersionNegotiation},
		{"caddy_rakelimit_window_seconds", nil, 1},
		{"caddy_rakelimit_dry_run", nil, 0},
		{"caddy_rakelimit_limited_streams", nil, 1},
	} {
		if got := metric(t, after, m.name, m.labels...); got != m.want {
			t.Errorf("%s %v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
	if !strings.Contains(after, fmt.Sprintf(`listener="[::]:%d"`, c.port)) {
		t.Errorf("no listener label for [::]:%d", c.port)
	}

	code, body := c.adminGet("/rakelimit/")
	if code != http.StatusOK {
		t.Fatalf("/rakelimit/: %d %s", code, body)
	}
	var view report.View
	if err := json.Unmarshal([]byte(body), &view); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	if len(view.Limiters) != 1 || len(view.Limiters[0].LimitedStreams) != 1 {
		t.Fatalf("admin view: %s", body)
	}
	l := view.Limiters[0]
	s := l.LimitedStreams[0]
	prefix := fmt.Sprintf("%s/32 sport=", floodSrc)
	suffix := fmt.Sprintf(" -> :%d", c.port)
	if !strings.HasPrefix(s.Stream, prefix) || !strings.HasSuffix(s.Stream, suffix) || s.Level != 0 ||
		s.LimitPPS != limit || s.RatePPS < 1000 || s.Dropped == 0 {
		t.Errorf("limited stream %+v, want %s<port>%s at level 0 over %d pps", s, prefix, suffix, limit)
	}
	if l.Config.Limit != limit || l.Config.Window.String() != "1s" || len(l.Listeners) != 1 ||
		l.Counters["ipv4"].Classes["opening"].Dropped["0"] == 0 {
		t.Errorf("limiter %+v", l)
	}
	if code, _ := post(t, fmt.Sprintf("http://localhost:%d/rakelimit/", c.admin)); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /rakelimit/: %d, want 405", code)
	}
	t.Logf("metrics after a flood of %d:\n%s", sent, grep(after, "caddy_rakelimit_"))
	t.Logf("admin view:\n%s", body)
}

func post(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// grep keeps the lines of s that contain sub and carry a non-zero value.
func grep(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) && !strings.HasPrefix(line, "#") && !strings.HasSuffix(line, " 0") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestDryRunReload: a dry-run listener drops nothing while its counters say
// what it would have dropped; a reload switches enforcement on, on the same
// socket, without attaching again.
func TestDryRunReload(t *testing.T) {
	const limit, rate = 200, 5000
	dry := strings.Replace(fmt.Sprintf(siteWithLimit, limit), "window 1s", "window 1s\n\t\tdry_run", 1)
	c := startCaddyWith(t, &testCaddy{admin: freePort(t)}, dry)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	drops0 := testutil.ReadDrops(t, c.port)
	sent := quicFlood(t, floodSrc, dst, rate, 2*time.Second)
	_, m := c.adminGet("/metrics")
	would := metric(t, m, "caddy_rakelimit_packets_total", `class="opening"`, `verdict="dry_run"`, `level="0"`, `family="ipv4"`)
	if d := testutil.ReadDrops(t, c.port).FilteredSince(drops0); d != 0 || would < float64(sent-4*limit) {
		t.Fatalf("dry run: the socket dropped %d of %d, dry_run counter %v", d, sent, would)
	}
	if metric(t, m, "caddy_rakelimit_dry_run") != 1 {
		t.Error("caddy_rakelimit_dry_run is not 1")
	}
	lim := limiterNamed(DefaultName)
	if err := c.load(fmt.Sprintf(siteWithLimit, limit)); err != nil {
		t.Fatal(err)
	}
	if limiterNamed(DefaultName) != lim || len(listenersOf(lim)) != 1 {
		t.Fatal("the reload replaced the limiter or attached again")
	}
	drops1 := socketDrops(t, c.port)
	sent = quicFlood(t, floodSrc, dst, rate, time.Second)
	if d := socketDrops(t, c.port) - drops1; d < uint64(sent-4*limit) {
		t.Fatalf("enforcing after the reload: the socket dropped %d of %d", d, sent)
	}
}

// TestAllowlistedFlood: an allowlisted source floods and is never dropped,
// nor counted by the limiter, while a source beside it is held to the
// limit.
func TestAllowlistedFlood(t *testing.T) {
	const limit, rate = 200, 5000
	allowed := netip.MustParseAddr("127.0.0.7")
	site := strings.Replace(fmt.Sprintf(siteWithLimit, limit), "window 1s",
		"window 1s\n\t\tallow 127.0.0.7 10.0.0.0/8 fd00:1::/32", 1)
	c := startCaddyWith(t, &testCaddy{admin: freePort(t)}, site)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	// The filter's own count of drops: the allowlisted flood, delivered,
	// may also overflow the socket's receive queue, which the socket's
	// drop counter would mix in.
	lim := limiterNamed(DefaultName)
	_, drops0 := limiterStats(t, lim)
	done := make(chan int)
	go func() { done <- quicFlood(t, allowed, dst, rate, 2*time.Second) }()
	sentOther := quicFlood(t, floodSrc, dst, rate, 2*time.Second)
	sentAllowed := <-done
	_, m := c.adminGet("/metrics")
	allowlisted := metric(t, m, "caddy_rakelimit_packets_total", `verdict="allowlisted"`, `family="ipv4"`)
	_, drops := limiterStats(t, lim)
	drops -= drops0
	if allowlisted != float64(sentAllowed) {
		t.Errorf("allowlisted counter %v, the allowed source sent %d", allowlisted, sentAllowed)
	}
	// Only the other source's packets are dropped: at most all of them.
	if drops > uint64(sentOther) || drops < uint64(sentOther-4*limit) {
		t.Errorf("the filter dropped %d; the other source sent %d, the allowlisted one %d", drops, sentOther, sentAllowed)
	}
	_, body := c.adminGet("/rakelimit/")
	if !strings.Contains(body, `"allow":["127.0.0.7/32","10.0.0.0/8","fd00:1::/32"]`) {
		t.Errorf("admin view lacks the allowlist: %s", body)
	}
}

// logLines reads a JSON log file and returns the records whose message is
// msg.
func logLines(t *testing.T, path, msg string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// TestLimitedStreamLogs: a flood of a hundred thousand packets from one
// source logs one line when its stream starts being limited, with the
// stream, level, rate and limit, and one when it stops, with the duration
// and the packets dropped: two lines, not one per packet.
func TestLimitedStreamLogs(t *testing.T) {
	const limit, rate, seconds = 100, 25000, 4
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	c := startCaddyWith(t, &testCaddy{logFile: logFile}, fmt.Sprintf(siteWithLimit, limit))
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	sent := quicFlood(t, floodSrc, dst, rate, seconds*time.Second)
	// The stream ends after two quiet seconds (twice the window, at least
	// 2 s); the sweep runs every second.
	deadline := time.Now().Add(10 * time.Second)
	for len(logLines(t, logFile, "stream no longer limited")) == 0 && time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
	}
	starts := logLines(t, logFile, "limiting stream")
	stops := logLines(t, logFile, "stream no longer limited")
	if len(starts) != 1 || len(stops) != 1 {
		t.Fatalf("a flood of %d packets logged %d start and %d stop lines, want 1 and 1", sent, len(starts), len(stops))
	}
	start, stop := starts[0], stops[0]
	stream, _ := start["stream"].(string)
	if !strings.HasPrefix(stream, floodSrc.String()+"/32 sport=") || start["lattice_level"] != 0.0 || start["class"] != "opening" ||
		start["limit_pps"] != float64(limit) || start["rate_pps"].(float64) < limit {
		t.Errorf("start line %v", start)
	}
	dropped, _ := stop["dropped"].(float64)
	if stop["stream"] != stream || dropped < 0.8*float64(sent-seconds*2*limit) || dropped > 1.2*float64(sent) {
		t.Errorf("stop line %v for a flood of %d", stop, sent)
	}
	if d, _ := stop["duration"].(float64); d < seconds-1 || d > seconds+1 {
		t.Errorf("stop line duration %v s for a %d s flood", stop["duration"], seconds)
	}
	b, _ := json.Marshal(start)
	e, _ := json.Marshal(stop)
	t.Logf("flood of %d packets, log lines:\n%s\n%s", sent, b, e)
}

// listenerLabels returns the distinct values of the listener label of
// caddy_rakelimit_packets_total in a Prometheus exposition.
func listenerLabels(exposition string) []string {
	seen := map[string]bool{}
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, "caddy_rakelimit_packets_total{") {
			continue
		}
		_, rest, ok := strings.Cut(line, `listener="`)
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, `"`)
		seen[v] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// TestClosedListenersForgotten: after five reloads that move the listener
// to a new port, the admin view lists the one open listener, and the
// metrics' listener label names it alone: the sockets Caddy closed are
// forgotten.
func TestClosedListenersForgotten(t *testing.T) {
	c := startCaddyWith(t, &testCaddy{admin: freePort(t)}, fmt.Sprintf(siteWithLimit, 100))
	for i := range 5 {
		c.port = freePort(t)
		if err := c.load(fmt.Sprintf(siteWithLimit, 100)); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		want := fmt.Sprintf("[::]:%d", c.port)
		var view report.View
		var labels []string
		// Caddy closes the old socket as it stops the old configuration.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, body := c.adminGet("/rakelimit/")
			if err := json.Unmarshal([]byte(body), &view); err != nil {
				t.Fatalf("decoding %s: %v", body, err)
			}
			_, m := c.adminGet("/metrics")
			labels = listenerLabels(m)
			if len(view.Limiters) == 1 && slices.Equal(view.Limiters[0].Listeners, []string{want}) &&
				slices.Equal(labels, []string{want}) || time.Now().After(deadline) {
				break
			}
		}
		if len(view.Limiters) != 1 || !slices.Equal(view.Limiters[0].Listeners, []string{want}) {
			t.Fatalf("after reload %d to port %d the admin view lists %+v", i, c.port, view.Limiters)
		}
		if !slices.Equal(labels, []string{want}) {
			t.Fatalf("after reload %d to port %d the metrics' listener labels are %q", i, c.port, labels)
		}
	}
}

// TestReloadLogsNewSettings: a reload that changes the settings logs them
// at INFO, as the start does; a reload that changes nothing logs nothing.
func TestReloadLogsNewSettings(t *testing.T) {
	const msg = "new settings in force"
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	c := startCaddyWith(t, &testCaddy{logFile: logFile}, fmt.Sprintf(siteWithLimit, 200))
	changed := strings.Replace(fmt.Sprintf(siteWithLimit, 600), "window 1s", "window 2s\n\t\tlevel_limit 3 off\n\t\tdry_run", 1)
	for _, site := range []string{changed, changed} {
		if err := c.load(site); err != nil {
			t.Fatal(err)
		}
	}
	lines := logLines(t, logFile, msg)
	if len(lines) != 1 {
		t.Fatalf("%d lines %q after a reload that changed the settings and one that did not, want 1", len(lines), msg)
	}
	l := lines[0]
	levels, _ := json.Marshal(l["level_limits"])
	if l["level"] != "info" || l["limit"] != 600.0 || l["window"] != 2.0 || l["dry_run"] != true ||
		string(levels) != `["600","600","600","off"]` || fmt.Sprint(l["listeners"]) != fmt.Sprintf("[[::]:%d]", c.port) {
		t.Fatalf("log line %v", l)
	}
	b, _ := json.Marshal(l)
	t.Logf("%s", b)
}
