//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rakelimit/caddy-rakelimit/lab/dashboard"
)

// DashboardFile is the Grafana dashboard -dashboard renders, relative to
// the repository's root (rakebench runs from there).
const DashboardFile = "deploy/grafana/rakelimit.json"

// DashboardSVG is the file -dashboard writes in the output directory.
const DashboardSVG = "dashboard.svg"

// The dashboard recording: a scrape every dashboardInterval, from
// dashboardLead before the measured window to dashboardTail after it (long
// enough for the rate window to empty).
const (
	dashboardInterval = time.Second
	dashboardLead     = 3 * time.Second
	dashboardTail     = 5 * time.Second
)

// loadDashboard reads the dashboard and parses its queries, so that a query
// outside the rendering's subset stops the run before any measuring.
func loadDashboard() (*dashboard.Compiled, error) {
	d, err := dashboard.Load(DashboardFile)
	if err != nil {
		return nil, fmt.Errorf("-dashboard (run rakebench from the repository's root): %w", err)
	}
	vals, err := d.Values(dashboardInterval)
	if err != nil {
		return nil, fmt.Errorf("-dashboard: %s: %w", DashboardFile, err)
	}
	c, err := dashboard.Compile(d, vals)
	if err != nil {
		return nil, fmt.Errorf("-dashboard: %s: %w", DashboardFile, err)
	}
	return c, nil
}

// recording is the scrapes of one scenario run for the dashboard.
type recording struct {
	scenario Scenario
	variant  string
	scrapes  []dashboard.Scrape
	failures int
	firstErr string
	// window is the measured window (the flood's, or the transfers').
	window dashboard.Span
}

// recorder scrapes Caddy's /metrics every dashboardInterval until stopped,
// keeping the metrics the dashboard reads.
type recorder struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	rec    recording
}

// startRecorder starts scraping c.
func startRecorder(ctx context.Context, c *caddyProc, metrics []string) *recorder {
	ctx, cancel := context.WithCancel(ctx)
	r := &recorder{cancel: cancel, done: make(chan struct{})}
	keep := func(m string) bool { return slices.Contains(metrics, m) }
	go func() {
		defer close(r.done)
		tick := time.NewTicker(dashboardInterval)
		defer tick.Stop()
		for {
			at := time.Now()
			body, err := c.admin(ctx, "/metrics")
			if ctx.Err() != nil {
				return
			}
			var sc dashboard.Scrape
			if err == nil {
				sc, err = dashboard.ParseScrape(at, bytes.NewReader(body), keep)
			}
			r.mu.Lock()
			if err != nil {
				if r.rec.failures == 0 {
					r.rec.firstErr = err.Error()
				}
				r.rec.failures++
			} else {
				r.rec.scrapes = append(r.rec.scrapes, sc)
			}
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return r
}

// stop ends the scraping and returns what it recorded; it may be called
// again.
func (r *recorder) stop() recording {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec
}

// sleepCtx waits for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// windowLabel names the measured window of a scenario on the rendering.
func windowLabel(sc Scenario) string {
	switch {
	case sc.Flood != nil:
		return "flood: " + sc.Name
	case sc.Transfers:
		return "transfers"
	}
	return "clients, no flood"
}

// dashboardNote is the note results.md carries when a run was recorded.
func dashboardNote(r *recording) string {
	return fmt.Sprintf("Repetition 1 of %s with %s was also scraped every %v for %s (its figures include those scrapes).",
		r.scenario.Name, r.variant, dashboardInterval, DashboardSVG)
}

// writeDashboard renders the recording through the dashboard's queries into
// dir/DashboardSVG.
func writeDashboard(c *dashboard.Compiled, r *recording, date, dir string) (string, error) {
	if len(r.scrapes) < 2 {
		return "", fmt.Errorf("-dashboard: %d scrapes of /metrics succeeded, %d failed (first: %s): too few to draw rates",
			len(r.scrapes), r.failures, r.firstErr)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	sub := fmt.Sprintf("Scenario %s, variant %s, run of %s: Caddy's /metrics scraped every %v (%d scrapes",
		r.scenario.Name, r.variant, date, dashboardInterval, len(r.scrapes))
	if r.failures > 0 {
		sub += fmt.Sprintf(", %d failed", r.failures)
	}
	sub += fmt.Sprintf("); rates over $__rate_interval = %v; every limiter; seconds from the first scrape.", 4*dashboardInterval)
	svg := dashboard.Render(c.Evaluate(r.scrapes), dashboard.Page{
		Title:    "rakelimit dashboard (" + DashboardFile + "), rendered from a benchmark run",
		Subtitle: sub,
		Start:    r.scrapes[0].At, End: r.scrapes[len(r.scrapes)-1].At,
		Interval: dashboardInterval,
		Spans:    []dashboard.Span{r.window},
	})
	path := filepath.Join(dir, DashboardSVG)
	if err := os.WriteFile(path, []byte(svg), 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", DashboardSVG, err)
	}
	return path, nil
}
