//go:build linux

package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/lab/dashboard"
)

// chdirRoot runs the test from the repository's root, where rakebench runs.
func chdirRoot(t *testing.T) {
	t.Helper()
	t.Chdir(filepath.Join("..", ".."))
}

// TestRecorderAndDashboard scrapes a stand-in admin endpoint whose counter
// grows by 100 a second, and renders the shipped dashboard from the
// scrapes: the file has every panel's title and the series.
func TestRecorderAndDashboard(t *testing.T) {
	chdirRoot(t)
	c, err := loadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	start := time.Now()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		served.Add(1)
		n := int(time.Since(start).Seconds() * 100)
		fmt.Fprintf(w, "# TYPE caddy_rakelimit_packets_total counter\n"+
			`caddy_rakelimit_packets_total{limiter="l0",listener="udp/:1",family="ipv4",class="opening",verdict="dropped",level="1"} %d`+"\n"+
			"# TYPE go_goroutines gauge\ngo_goroutines 7\n", n)
	})}
	go srv.Serve(l)
	defer srv.Close()

	proc := &caddyProc{site: site{adminPort: l.Addr().(*net.TCPAddr).Port}}
	r := startRecorder(context.Background(), proc, c.Metrics())
	time.Sleep(2500 * time.Millisecond)
	rec := r.stop()
	if again := r.stop(); len(again.scrapes) != len(rec.scrapes) {
		t.Errorf("a second stop returned %d scrapes, the first %d", len(again.scrapes), len(rec.scrapes))
	}
	// Three scrapes in 2.5 s at one a second (the first at once); a slow
	// machine may miss one, never add one.
	if n := len(rec.scrapes); n < 2 || n > 3 || rec.failures != 0 {
		t.Fatalf("%d scrapes, %d failures (%s), want 2 or 3 and none", n, rec.failures, rec.firstErr)
	}
	for _, s := range rec.scrapes {
		for _, x := range s.Samples {
			if x.Metric == "go_goroutines" {
				t.Fatal("kept go_goroutines, a metric the dashboard does not read")
			}
		}
	}
	rec.scenario, rec.variant = Scenario{Name: "one-source"}, "rakelimit"
	rec.window = dashboard.Span{From: rec.scrapes[0].At, To: rec.scrapes[len(rec.scrapes)-1].At, Label: "flood: one-source"}
	dir := t.TempDir()
	path, err := writeDashboard(c, &rec, "2026-01-01T00:00:00Z", dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, p := range c.Dashboard.Panels {
		if !strings.Contains(svg, p.Title) {
			t.Errorf("%s has no panel %q", DashboardSVG, p.Title)
		}
	}
	for _, want := range []string{"opening dropped", "opening level 1", "Scenario one-source, variant rakelimit", "flood: one-source"} {
		if !strings.Contains(svg, want) {
			t.Errorf("%s has no %q", DashboardSVG, want)
		}
	}
}

func TestWriteDashboardTooFewScrapes(t *testing.T) {
	chdirRoot(t)
	c, err := loadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	rec := &recording{scrapes: []dashboard.Scrape{{At: time.Now()}}, failures: 4, firstErr: "connection refused"}
	dir := t.TempDir()
	if _, err := writeDashboard(c, rec, "", dir); err == nil || !strings.Contains(err.Error(), "1 scrapes of /metrics succeeded, 4 failed (first: connection refused)") {
		t.Errorf("err = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, DashboardSVG)); !os.IsNotExist(err) {
		t.Errorf("%s written from one scrape: %v", DashboardSVG, err)
	}
}

func TestLoadDashboardOutsideRoot(t *testing.T) {
	t.Chdir(t.TempDir())
	if _, err := loadDashboard(); err == nil || !strings.Contains(err.Error(), "run rakebench from the repository's root") {
		t.Errorf("err = %v", err)
	}
}
