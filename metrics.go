package rakelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
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
	xdpDesc = prometheus.NewDesc("caddy_rakelimit_xdp_listeners",
		"Mode xdp: the listeners whose traffic the XDP program decides on each interface it runs on, with how it runs "+
			"there: native (in the driver) or generic (after the kernel allocates the packet). What arrives on other "+
			"interfaces (loopback) the socket filter decides.",
		[]string{"limiter", "interface", "attach"}, nil)
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
			"connection ID bound to its source), short_by_peer (from a proven peer), opening_by_id (an Initial, 0-RTT "+
			"or Handshake carrying a server ID bound to its source), handshake_from_peer (from a proven peer), "+
			"opening_from_peer (an Initial from a proven peer: a returning user), from_answered (a short header or "+
			"Handshake from an address the server answered, on its credit: established), opening_from_answered (an "+
			"Initial from such an address, on its credit: a stranger's), over_credit (from an answered address "+
			"out of credit: unverified, or a stranger's Initial).",
		[]string{"limiter", "listener", "family", "how"}, nil)
	learnedDesc = prometheus.NewDesc("caddy_rakelimit_learned_total",
		"What the limiter learned: server_ids (connection IDs the server chose, bound to the address it sent "+
			"them to) and peers (addresses it sends a connection's packets to), each counted when taught to the "+
			"filter (when first sent, and again as a refresh while in use); credits (granted to addresses by the "+
			"server's datagrams to them); proofs (addresses that proved themselves by sending back a server ID bound "+
			"to them); unpaced_attempts (attempts at a proof the proof pacer had no room for).",
		[]string{"limiter", "kind"}, nil)
	heldDesc = prometheus.NewDesc("caddy_rakelimit_learned_held",
		"What the learned sets hold now: server_ids, proven_peers, answered_peers (each set holds 262,144 slots, "+
			"sized for 131,072).",
		[]string{"limiter", "set"}, nil)
	establishedTotalDesc = prometheus.NewDesc("caddy_rakelimit_established_total_per_second",
		"The cap in force on the socket's packets of established connections (the established class's last "+
			"level); +Inf when lifted. Adaptive (1) it follows quic-go's receive queue, else it is the configured "+
			"level limit.",
		[]string{"limiter", "adaptive"}, nil)
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

// collector is the Prometheus collector of every running limiter: it builds
// the metrics from each limiter's report. One collector serves every
// configuration's registry, so that its count of failed reads goes on
// across reloads.
type collector struct {
	registry *engine.Registry
	// failed counts the reports that could not be read.
	failed atomic.Uint64
}

func newCollector(reg *engine.Registry) *collector { return &collector{registry: reg} }

// register registers the collector with a configuration's metrics registry;
// each configuration load has a fresh one.
func (c *collector) register(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return fmt.Errorf("registering rakelimit metrics: %w", err)
		}
	}
	return nil
}

// Describe implements prometheus.Collector.
func (*collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{packetsDesc, invalidDesc, limitDesc, negotiationDesc, modeDesc, xdpDesc, windowDesc, dryRunDesc,
		streamsDesc, untrackedDesc, attachErrorsDesc, openingTotalDesc, queueFillDesc, verifiedDesc, learnedDesc, verifyingDesc,
		heldDesc, establishedTotalDesc,
		prefilterDroppedDesc, prefilterDesc, collectionErrorsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A limiter whose report cannot
// be read sends no metric, and counts as a collection error.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.registry.Limiters() {
		r, err := l.Report()
		if err != nil {
			c.failed.Add(1)
			continue
		}
		collect(r, ch)
	}
	ch <- prometheus.MustNewConstMetric(collectionErrorsDesc, prometheus.CounterValue, float64(c.failed.Load()))
}

// collect sends the metrics of one limiter's report.
func collect(r report.Limiter, ch chan<- prometheus.Metric) {
	name, cfg := r.Name, r.Config
	listener := strings.Join(r.Listeners, ",")
	levels := len(cfg.LevelLimits)
	for _, ln := range r.Listeners {
		ch <- prometheus.MustNewConstMetric(modeDesc, prometheus.GaugeValue, 1, name, ln, r.Mode)
	}
	for _, x := range r.XDP {
		ch <- prometheus.MustNewConstMetric(xdpDesc, prometheus.GaugeValue, float64(len(x.Listeners)), name, x.Name, x.Attach)
	}
	for _, family := range report.Families {
		fc := r.Counters[family]
		counter := func(v uint64, class, verdict, level string) {
			ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(v),
				name, listener, family, class, verdict, level)
		}
		for _, cl := range cfg.Limits() {
			cc := fc.Classes[cl.Class]
			counter(cc.Passed, cl.Class, "passed", "")
			for lvl := range levels {
				level := strconv.Itoa(lvl)
				counter(cc.Limited[level], cl.Class, "limited", level)
				counter(cc.Dropped[level], cl.Class, "dropped", level)
				counter(cc.DryRun[level], cl.Class, "dry_run", level)
			}
		}
		for _, verdict := range []string{"passed", "dropped", "dry_run"} {
			counter(fc.Negotiation[verdict], report.ClassNegotiation, verdict, "")
		}
		var invalid, wouldDrop uint64
		for reason, n := range fc.Invalid {
			invalid += n
			ch <- prometheus.MustNewConstMetric(invalidDesc, prometheus.CounterValue, float64(n),
				name, listener, family, reason, "dropped")
		}
		for reason, n := range fc.InvalidDryRun {
			wouldDrop += n
			ch <- prometheus.MustNewConstMetric(invalidDesc, prometheus.CounterValue, float64(n),
				name, listener, family, reason, "dry_run")
		}
		counter(invalid, report.ClassInvalid, "invalid", "")
		counter(wouldDrop, report.ClassInvalid, "dry_run", "")
		counter(fc.Allowlisted, "", "allowlisted", "")
		for how, n := range fc.Verified {
			ch <- prometheus.MustNewConstMetric(verifiedDesc, prometheus.CounterValue, float64(n),
				name, listener, family, how)
		}
	}
	for _, cl := range cfg.Limits() {
		for lvl, lim := range cl.Levels {
			ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, orInf(lim), name, cl.Class, strconv.Itoa(lvl))
		}
	}
	ch <- prometheus.MustNewConstMetric(negotiationDesc, prometheus.GaugeValue, float64(cfg.VersionNegotiation), name)
	ch <- prometheus.MustNewConstMetric(windowDesc, prometheus.GaugeValue, cfg.Window.Seconds(), name)
	ch <- prometheus.MustNewConstMetric(dryRunDesc, prometheus.GaugeValue, one(cfg.DryRun), name)
	total := r.OpeningTotal
	ch <- prometheus.MustNewConstMetric(openingTotalDesc, prometheus.GaugeValue, orInf(total.CapPPS), name,
		strconv.FormatBool(total.Adaptive))
	if total.Adaptive {
		ch <- prometheus.MustNewConstMetric(queueFillDesc, prometheus.GaugeValue, total.QueueFill, name)
	}
	ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.CounterValue, float64(r.Verification.ServerIDs), name, "server_ids")
	ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.CounterValue, float64(r.Verification.Peers), name, "peers")
	ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.CounterValue, float64(r.Verification.Credits), name, "credits")
	ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.CounterValue, float64(r.Verification.Proofs), name, "proofs")
	ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.CounterValue, float64(r.Verification.UnpacedAttempts), name,
		"unpaced_attempts")
	for set, n := range r.Verification.Held {
		ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(n), name, set)
	}
	ch <- prometheus.MustNewConstMetric(establishedTotalDesc, prometheus.GaugeValue, orInf(r.EstablishedTotal.CapPPS), name,
		strconv.FormatBool(r.EstablishedTotal.Adaptive))
	ch <- prometheus.MustNewConstMetric(verifyingDesc, prometheus.GaugeValue, one(r.Verification.On), name)
	ch <- prometheus.MustNewConstMetric(attachErrorsDesc, prometheus.CounterValue, float64(r.AttachErrors), name)
	if r.Prefilter != nil {
		collectPrefilter(name, cfg, r.Prefilter, ch)
	}
	ch <- prometheus.MustNewConstMetric(streamsDesc, prometheus.GaugeValue, float64(r.LimitedStreamsTotal), name)
	ch <- prometheus.MustNewConstMetric(untrackedDesc, prometheus.CounterValue, float64(r.UntrackedDrops), name)
}

// collectPrefilter sends the metrics of a userspace limiter's kernel
// pre-filter.
func collectPrefilter(name string, cfg report.Config, p *report.Prefilter, ch chan<- prometheus.Metric) {
	dropped := func(v uint64, class, reason string) {
		ch <- prometheus.MustNewConstMetric(prefilterDroppedDesc, prometheus.CounterValue, float64(v), name, class, reason)
	}
	for reason, n := range p.InvalidDroppedEstimated {
		dropped(n, report.ClassInvalid, reason)
	}
	for class, n := range p.StreamDroppedEstimated {
		dropped(n, class, "limited_stream")
	}
	dropped(p.NegotiationDroppedEstimated, report.ClassNegotiation, "over_cap")
	dropped(p.ShedDroppedEstimated, cfg.OpeningClass(), "shed")
	for what, v := range map[string]float64{"sockets": float64(p.Sockets), "instructions": float64(p.Instructions),
		"shed_probability": p.Shed, "streams": float64(p.Streams), "updates": float64(p.Updates),
		"attach_errors": float64(p.AttachErrors)} {
		ch <- prometheus.MustNewConstMetric(prefilterDesc, prometheus.GaugeValue, v, name, what)
	}
}

// orInf is a limit in packets per second, +Inf for 0 (unlimited).
func orInf(pps uint32) float64 {
	if pps == 0 {
		return math.Inf(1)
	}
	return float64(pps)
}

// one is 1 for true, 0 for false.
func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
