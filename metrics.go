//go:build linux

package rakelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rakelimit/caddy-rakelimit/bpf"
)

// Metrics are read from the filters' per-CPU counters when Prometheus
// scrapes, not counted per packet. Labels name the limiter, its listeners,
// the family and the level; never a source address.
var (
	packetsDesc = prometheus.NewDesc("caddy_rakelimit_packets_total",
		"Packets the filter saw, by verdict: passed (under every limit), limited (over a limit at level, "+
			"let through), dropped (at level), dry_run (would have been dropped at level, delivered), "+
			"allowlisted (exempt, not counted).",
		[]string{"limiter", "listener", "family", "verdict", "level"}, nil)
	limitDesc = prometheus.NewDesc("caddy_rakelimit_limit_packets_per_second",
		"The configured limit of each level; +Inf when the level is unlimited.",
		[]string{"limiter", "level"}, nil)
	windowDesc = prometheus.NewDesc("caddy_rakelimit_window_seconds",
		"The configured smoothing window.", []string{"limiter"}, nil)
	dryRunDesc = prometheus.NewDesc("caddy_rakelimit_dry_run",
		"1 when the limiter only measures and drops nothing.", []string{"limiter"}, nil)
	streamsDesc = prometheus.NewDesc("caddy_rakelimit_limited_streams",
		"Streams the limiter dropped packets of recently (in a dry run: would have).", []string{"limiter"}, nil)
	attachErrorsDesc = prometheus.NewDesc("caddy_rakelimit_attach_errors_total",
		"Listeners the limiter should protect and could not (see the error log).", []string{"limiter"}, nil)
	collectionErrorsDesc = prometheus.NewDesc("caddy_rakelimit_collection_errors_total",
		"Failed reads of a filter's counters or streams while collecting metrics.", nil, nil)
)

// registerMetrics registers the registry's collector with a configuration's
// metrics registry; each configuration load has a fresh one.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	if err := reg.Register(limiters); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return fmt.Errorf("registering rakelimit metrics: %w", err)
		}
	}
	return nil
}

// Describe implements prometheus.Collector.
func (reg *limiterRegistry) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{packetsDesc, limitDesc, windowDesc, dryRunDesc, streamsDesc,
		attachErrorsDesc, collectionErrorsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (reg *limiterRegistry) Collect(ch chan<- prometheus.Metric) {
	reg.each(func(l *limiter) {
		if err := l.collect(ch); err != nil {
			reg.collectionErrors.Add(1)
		}
	})
	ch <- prometheus.MustNewConstMetric(collectionErrorsDesc, prometheus.CounterValue,
		float64(reg.collectionErrors.Load()))
}

var familyNames = [bpf.Families]string{"unknown", "ipv4", "ipv6"}

func (l *limiter) collect(ch chan<- prometheus.Metric) error {
	set, _, listeners := l.snapshot()
	listener := strings.Join(listeners, ",")
	levels := set.Limiter.WithDefaults().Levels()
	counter := func(v uint64, fam int, verdict, level string) {
		ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(v),
			l.name, listener, familyNames[fam], verdict, level)
	}
	st, err := l.filter.Stats()
	if err != nil {
		return err
	}
	for fam := range bpf.Families {
		counter(st.Unlimited(fam), fam, "passed", "")
		counter(st.Allowed[fam], fam, "allowlisted", "")
		for lvl := range levels {
			level := strconv.Itoa(lvl)
			counter(st.Limited[fam][lvl], fam, "limited", level)
			counter(st.Dropped[fam][lvl], fam, "dropped", level)
			counter(st.WouldDrop[fam][lvl], fam, "dry_run", level)
		}
	}
	for lvl := range levels {
		lim := float64(levelLimit(set, lvl))
		if lim == 0 {
			lim = math.Inf(1)
		}
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, lim, l.name, strconv.Itoa(lvl))
	}
	ch <- prometheus.MustNewConstMetric(windowDesc, prometheus.GaugeValue, set.Limiter.Window.Seconds(), l.name)
	dry := 0.0
	if set.DryRun {
		dry = 1
	}
	ch <- prometheus.MustNewConstMetric(dryRunDesc, prometheus.GaugeValue, dry, l.name)
	ch <- prometheus.MustNewConstMetric(attachErrorsDesc, prometheus.CounterValue, float64(l.attachErrors.Load()), l.name)
	streams, err := l.filter.Streams()
	if err != nil {
		return err
	}
	ch <- prometheus.MustNewConstMetric(streamsDesc, prometheus.GaugeValue, float64(len(streams)), l.name)
	return nil
}
