//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/rakelimit/caddy-rakelimit/lab/dashboard"
)

// runOne starts a fresh Caddy for one scenario and variant, measures and
// stops it.
func (b *bench) runOne(ctx context.Context, sc Scenario, v Variant, rep int) (RunResult, error) {
	res := RunResult{Scenario: sc.Name, Variant: v.Name, Rep: rep}
	c, err := startCaddy(ctx, b.bin, b.dir, b.site, v, fmt.Sprintf("%s-%s-%d", sc.Name, v.Name, rep), b.o.CaddyCPUs, 30*time.Second)
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop(b.o.stopTimeout())
		}
	}()
	var rec *recorder
	if b.dash != nil && sc.Name == b.o.Dashboard && v.Name == b.o.DashboardVariant && rep == 1 {
		fmt.Fprintf(b.progress, "rakebench: scraping /metrics every %v for %s, from %v before to %v after the measured window\n",
			dashboardInterval, DashboardSVG, dashboardLead, dashboardTail)
		rec = startRecorder(ctx, c, b.dash.Metrics())
		defer rec.stop()
		if err := sleepCtx(ctx, dashboardLead); err != nil {
			return res, err
		}
	}
	measured := time.Now()
	if sc.Transfers {
		err = b.measureTransfers(ctx, c, &res)
	} else {
		err = b.measureFlood(ctx, c, sc, &res)
	}
	if err != nil {
		return res, err
	}
	if rec != nil {
		window := dashboard.Span{From: measured, To: time.Now(), Label: windowLabel(sc)}
		if err := sleepCtx(ctx, dashboardTail); err != nil {
			return res, err
		}
		r := rec.stop()
		r.scenario, r.variant, r.window = sc, v.Name, window
		b.recorded = &r
	}
	grace := b.o.floodStopTimeout()
	if sc.Transfers {
		grace = b.o.stopTimeout()
	}
	d, ok := c.Stop(grace)
	stopped = true
	res.StopSeconds, res.StopTimedOut = d.Seconds(), !ok
	return res, nil
}

// window measures Caddy's side between begin and end.
type window struct {
	c     *caddyProc
	s0    procSample
	m0    counters
	start time.Time
}

func (b *bench) begin(ctx context.Context, c *caddyProc) (*window, error) {
	w := &window{c: c}
	var err error
	if w.m0, err = scrape(ctx, c); err != nil {
		return nil, err
	}
	if err := c.resetPeakRSS(); err != nil {
		return nil, err
	}
	if w.s0, err = c.sample(); err != nil {
		return nil, err
	}
	w.start = w.s0.at
	return w, nil
}

func (w *window) end(ctx context.Context, res *RunResult) error {
	s1, err := w.c.sample()
	if err != nil {
		return err
	}
	rss, err := w.c.peakRSS()
	if err != nil {
		return err
	}
	body, err := w.c.admin(ctx, "/metrics")
	if err != nil {
		return fmt.Errorf("reading caddy's metrics: %w", err)
	}
	m1, err := parseCounters(bytes.NewReader(body))
	if err != nil {
		return err
	}
	userspace, err := inUserspace(bytes.NewReader(body))
	if err != nil {
		return err
	}
	series := m1.delta(w.m0)
	groups := summarize(series)
	refused, delivered := refusedDelivered(groups)
	drops := s1.drops - w.s0.drops
	rcvbuf := float64(drops) - refused
	if userspace {
		// The userspace limiter refuses datagrams the socket has
		// received: every socket drop is a full receive buffer.
		rcvbuf = float64(drops)
	}
	res.Seconds = s1.at.Sub(w.start).Seconds()
	res.Server = ServerStats{
		CPUPct: cpuPercent(w.s0, s1), CPUSeconds: float64(s1.cpuTicks-w.s0.cpuTicks) / clockTicks,
		PeakRSSBytes: rss, SocketDrops: drops,
		ModuleRefused: refused, ModuleDelivered: delivered, RcvbufDrops: rcvbuf, Userspace: userspace,
		Module: groups, Series: series,
	}
	return nil
}

// scrape reads the module's counters from Caddy's admin endpoint.
func scrape(ctx context.Context, c *caddyProc) (counters, error) {
	body, err := c.admin(ctx, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("reading caddy's metrics: %w", err)
	}
	return parseCounters(bytes.NewReader(body))
}
