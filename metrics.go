package rakelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace/prefilter"
)

// Metrics are read from the filters' per-CPU counters when Prometheus
// scrapes, not counted per packet. Labels name the limiter, its listeners,
// the family, the class and the level; never a source address.
var (
	packetsDesc = prometheus.NewDesc("caddy_rakelimit_packets_total",
		"Datagrams the filter saw, by class (opening: connection-opening packets; established: packets of "+
			"established connections; all: every datagram when the filter does not classify; negotiation: a QUIC "+
			"version quic-go lacks; invalid) and verdict: passed (under every limit), limited (over a limit at "+
			"level, let through), dropped (at level, or over the version negotiation cap), dry_run (would have "+
			"been dropped, delivered), invalid (dropped as invalid), allowlisted (exempt, not counted).",
		[]string{"limiter", "listener", "family", "class", "verdict", "level"}, nil)
	invalidDesc = prometheus.NewDesc("caddy_rakelimit_invalid_packets_total",
		"Invalid datagrams by reason, dropped or, in a dry run, delivered (verdict dry_run).",
		[]string{"limiter", "listener", "family", "reason", "verdict"}, nil)
	limitDesc = prometheus.NewDesc("caddy_rakelimit_limit_packets_per_second",
		"The configured limit of each class and level; +Inf when the level is unlimited.",
		[]string{"limiter", "class", "level"}, nil)
	negotiationDesc = prometheus.NewDesc("caddy_rakelimit_version_negotiation_per_second",
		"Datagrams with a QUIC version quic-go lacks let through per second, for the whole socket.",
		[]string{"limiter"}, nil)
	modeDesc = prometheus.NewDesc("caddy_rakelimit_mode",
		"1 for the mode each listener's limiter runs in: "+engine.ModesRunning()+".",
		[]string{"limiter", "listener", "mode"}, nil)
	windowDesc = prometheus.NewDesc("caddy_rakelimit_window_seconds",
		"The configured smoothing window.", []string{"limiter"}, nil)
	dryRunDesc = prometheus.NewDesc("caddy_rakelimit_dry_run",
		"1 when the limiter only measures and drops nothing.", []string{"limiter"}, nil)
	streamsDesc = prometheus.NewDesc("caddy_rakelimit_limited_streams",
		"Streams the limiter dropped packets of recently, and sources of invalid datagrams (in a dry run: would have).",
		[]string{"limiter"}, nil)
	untrackedDesc = prometheus.NewDesc("caddy_rakelimit_untracked_drops_total",
		"Drops (estimated from the sampled ones) of streams not tracked, so neither logged nor listed, because new streams came faster than 200 a second: a flood with a new source on every packet.",
		[]string{"limiter"}, nil)
	attachErrorsDesc = prometheus.NewDesc("caddy_rakelimit_attach_errors_total",
		"Listeners the limiter should protect and could not (see the error log).", []string{"limiter"}, nil)
	openingTotalDesc = prometheus.NewDesc("caddy_rakelimit_opening_total_per_second",
		"The cap in force on the socket's connection-opening packets (the opening class's last level); +Inf when "+
			"lifted. Adaptive (1) it follows quic-go's receive queue, else it is the configured level limit.",
		[]string{"limiter", "adaptive"}, nil)
	queueFillDesc = prometheus.NewDesc("caddy_rakelimit_receive_queue_fill_ratio",
		"How full the sockets' receive queues were in the adaptive total's last period, 0 to 1.",
		[]string{"limiter"}, nil)
	verifiedDesc = prometheus.NewDesc("caddy_rakelimit_verified_packets_total",
		"Datagrams verified against what the server sent, by how: short_by_id (a short header carrying a server "+
			"connection ID), short_by_peer (from an address the server answers), opening_by_id (an Initial, 0-RTT or "+
			"Handshake carrying a server ID), handshake_from_peer, opening_from_peer (an Initial from an address the "+
			"server answers: first at the opening total).",
		[]string{"limiter", "listener", "family", "how"}, nil)
	learnedDesc = prometheus.NewDesc("caddy_rakelimit_learned_total",
		"What the limiter learned from the datagrams quic-go sent: server_ids (connection IDs the server chose) "+
			"and peers (addresses it answers), each counted when taught to the filter: when first sent, and again "+
			"as a refresh while it stays in use.",
		[]string{"limiter", "kind"}, nil)
	verifyingDesc = prometheus.NewDesc("caddy_rakelimit_verifying",
		"1 when the limiter verifies connection IDs and peers; 0 when it is off (configured, or the server's "+
			"connection IDs are not quic-go's 4 bytes).",
		[]string{"limiter"}, nil)
	prefilterDroppedDesc = prometheus.NewDesc("caddy_rakelimit_prefilter_dropped_estimated_total",
		"Userspace mode: datagrams the kernel pre-filter (classic BPF, no capability needed) dropped before quic-go "+
			"received them, ESTIMATED (classic BPF cannot count): class invalid by reason, from the one in 1024 the "+
			"pre-filter lets through for the userspace limiter to count; a limiter class (opening, established, unverified, or all) with reason "+
			"limited_stream, from each limited stream's arrival rate and the drop probability set for it; class "+
			"negotiation with reason over_cap, unknown versions over the Version Negotiation cap, from their rate. The "+
			"socket's drop counter counts them exactly, together with receive queue overflows.",
		[]string{"limiter", "class", "reason"}, nil)
	prefilterDesc = prometheus.NewDesc("caddy_rakelimit_prefilter",
		"Userspace mode: the kernel pre-filter in force: sockets (that carry it), instructions (of at most 4096), "+
			"streams (limited streams it drops packets of), updates (programs attached), attach_errors.",
		[]string{"limiter", "what"}, nil)
	collectionErrorsDesc = prometheus.NewDesc("caddy_rakelimit_collection_errors_total",
		"Failed reads of a filter's counters or streams while collecting metrics.", nil, nil)
)

// collector is the Prometheus collector of every running limiter, one per
// configuration's registry.
type collector struct{ pool *pool }

// registerMetrics registers the pool's collector with a configuration's
// metrics registry; each configuration load has a fresh one.
func (p *pool) registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	if err := reg.Register(&collector{pool: p}); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return fmt.Errorf("registering rakelimit metrics: %w", err)
		}
	}
	return nil
}

// Describe implements prometheus.Collector.
func (*collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{packetsDesc, invalidDesc, limitDesc, negotiationDesc, modeDesc, windowDesc, dryRunDesc,
		streamsDesc, untrackedDesc, attachErrorsDesc, openingTotalDesc, queueFillDesc, verifiedDesc, learnedDesc, verifyingDesc,
		prefilterDroppedDesc, prefilterDesc, collectionErrorsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.pool.each(func(l *engine.Limiter) {
		if err := collect(l, ch); err != nil {
			c.pool.collectionErrors.Add(1)
		}
	})
	ch <- prometheus.MustNewConstMetric(collectionErrorsDesc, prometheus.CounterValue, float64(c.pool.collectionErrors.Load()))
}

var familyNames = [decide.Families]string{"unknown", "ipv4", "ipv6"}

// collect sends the metrics of one limiter.
func collect(l *engine.Limiter, ch chan<- prometheus.Metric) error {
	put, listeners := l.Snapshot()
	set, name := put.Config, l.Name()
	listener := strings.Join(listeners, ",")
	levels := set.Limiter.WithDefaults().Levels()
	counter := func(v uint64, fam int, class, verdict, level string) {
		ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(v),
			name, listener, familyNames[fam], class, verdict, level)
	}
	eng := l.Engine()
	st, err := eng.Stats()
	if err != nil {
		return err
	}
	for _, ln := range listeners {
		ch <- prometheus.MustNewConstMetric(modeDesc, prometheus.GaugeValue, 1, name, ln, eng.Mode())
	}
	for fam := range decide.Families {
		for _, class := range engine.LimiterClasses {
			name := engine.ClassName(set, class)
			counter(st.Unlimited(int(class), fam), fam, name, "passed", "")
			for lvl := range levels {
				level := strconv.Itoa(lvl)
				counter(st.Limited[class][fam][lvl], fam, name, "limited", level)
				counter(st.Dropped[class][fam][lvl], fam, name, "dropped", level)
				counter(st.WouldDrop[class][fam][lvl], fam, name, "dry_run", level)
			}
		}
		negotiation := quicclass.Negotiation.String()
		counter(st.Negotiation[fam][0], fam, negotiation, "passed", "")
		counter(st.Negotiation[fam][1], fam, negotiation, "dropped", "")
		counter(st.Negotiation[fam][2], fam, negotiation, "dry_run", "")
		var invalid, wouldDrop uint64
		for r := quicclass.Reason(1); r < quicclass.NumReasons; r++ {
			invalid += st.Invalid[0][fam][r]
			wouldDrop += st.Invalid[1][fam][r]
			ch <- prometheus.MustNewConstMetric(invalidDesc, prometheus.CounterValue, float64(st.Invalid[0][fam][r]),
				name, listener, familyNames[fam], r.String(), "dropped")
			ch <- prometheus.MustNewConstMetric(invalidDesc, prometheus.CounterValue, float64(st.Invalid[1][fam][r]),
				name, listener, familyNames[fam], r.String(), "dry_run")
		}
		counter(invalid, fam, quicclass.Invalid.String(), "invalid", "")
		counter(wouldDrop, fam, quicclass.Invalid.String(), "dry_run", "")
		counter(st.Allowed[fam], fam, "", "allowlisted", "")
		for how := quicclass.Verification(1); how < quicclass.NumVerifications; how++ {
			ch <- prometheus.MustNewConstMetric(verifiedDesc, prometheus.CounterValue, float64(st.Verified[fam][how]),
				name, listener, familyNames[fam], how.String())
		}
	}
	for _, class := range engine.LimiterClasses {
		for lvl := range levels {
			lim := float64(engine.LevelLimit(set, int(class), lvl))
			if lim == 0 {
				lim = math.Inf(1)
			}
			ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, lim, name, engine.ClassName(set, class), strconv.Itoa(lvl))
		}
	}
	ch <- prometheus.MustNewConstMetric(negotiationDesc, prometheus.GaugeValue, float64(set.Negotiation), name)
	ch <- prometheus.MustNewConstMetric(windowDesc, prometheus.GaugeValue, set.Limiter.Window.Seconds(), name)
	dry := 0.0
	if set.DryRun {
		dry = 1
	}
	ch <- prometheus.MustNewConstMetric(dryRunDesc, prometheus.GaugeValue, dry, name)
	total := l.OpeningTotal()
	capPPS := float64(total.Cap)
	if total.Cap == 0 {
		capPPS = math.Inf(1)
	}
	ch <- prometheus.MustNewConstMetric(openingTotalDesc, prometheus.GaugeValue, capPPS, name, strconv.FormatBool(total.Adaptive))
	if total.Adaptive {
		ch <- prometheus.MustNewConstMetric(queueFillDesc, prometheus.GaugeValue, total.Last.Fill, name)
	}
	learned := l.Learned()
	ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.CounterValue, float64(learned.IDs), name, "server_ids")
	ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.CounterValue, float64(learned.Peers), name, "peers")
	verifying := 0.0
	if set.VerifyIDs && !l.VerificationOff() {
		verifying = 1
	}
	ch <- prometheus.MustNewConstMetric(verifyingDesc, prometheus.GaugeValue, verifying, name)
	ch <- prometheus.MustNewConstMetric(attachErrorsDesc, prometheus.CounterValue, float64(l.AttachErrors()), name)
	if pf, ok := eng.(engine.Prefiltered); ok {
		collectPrefilter(name, set, pf.Prefilter(), ch)
	}
	streams, err := eng.Streams()
	if err != nil {
		return err
	}
	ch <- prometheus.MustNewConstMetric(streamsDesc, prometheus.GaugeValue, float64(len(streams)), name)
	untracked, err := eng.Untracked()
	if err != nil {
		return err
	}
	ch <- prometheus.MustNewConstMetric(untrackedDesc, prometheus.CounterValue, float64(untracked), name)
	return nil
}

// collectPrefilter sends the metrics of a userspace limiter's kernel
// pre-filter.
func collectPrefilter(name string, set decide.Config, st prefilter.Stats, ch chan<- prometheus.Metric) {
	for _, r := range prefilter.Stateless {
		ch <- prometheus.MustNewConstMetric(prefilterDroppedDesc, prometheus.CounterValue, float64(st.InvalidDropped[r]),
			name, quicclass.Invalid.String(), r.String())
	}
	for _, class := range engine.LimiterClasses {
		ch <- prometheus.MustNewConstMetric(prefilterDroppedDesc, prometheus.CounterValue, float64(st.StreamDropped[class]),
			name, engine.ClassName(set, class), "limited_stream")
	}
	ch <- prometheus.MustNewConstMetric(prefilterDroppedDesc, prometheus.CounterValue, float64(st.NegotiationDropped),
		name, quicclass.Negotiation.String(), "over_cap")
	ch <- prometheus.MustNewConstMetric(prefilterDroppedDesc, prometheus.CounterValue, float64(st.ShedDropped),
		name, engine.ClassName(set, quicclass.Opening), "shed")
	for what, v := range map[string]float64{"sockets": float64(st.Sockets), "instructions": float64(st.Instructions),
		"shed_probability": st.Shed,
		"streams":          float64(st.Rules), "updates": float64(st.Updates), "attach_errors": float64(st.AttachErrors)} {
		ch <- prometheus.MustNewConstMetric(prefilterDesc, prometheus.GaugeValue, v, name, what)
	}
}
