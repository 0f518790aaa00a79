//go:build linux

package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Figure is one figure of a scenario and variant: its median over the
// repetitions and the median over the repetitions of its ratio to plain's in
// the same repetition. Nil: not measured (no successful request, say).
type Figure struct {
	Median *float64 `json:"median"`
	Ratio  *float64 `json:"ratio,omitempty"`
}

// Summary is a scenario and variant over the repetitions.
type Summary struct {
	Scenario string            `json:"scenario"`
	Variant  string            `json:"variant"`
	Reps     int               `json:"reps"`
	Figures  map[string]Figure `json:"figures"`
	// TransferTimeouts counts, by transfer, the repetitions in which it
	// stalled or ran out of time; StopTimeouts those in which Caddy had
	// to be killed.
	TransferTimeouts map[string]int `json:"transfer_timeouts,omitempty"`
	StopTimeouts     int            `json:"stop_timeouts,omitempty"`
}

// Figure names. Per-transfer and per-module figures are built with
// transferFigure and moduleFigure.
const (
	figOffered     = "flood.offered_pps"
	figReflected   = "flood.reflected"
	figKernelDrop  = "flood.kernel_refused_pct"
	figNewOK       = "new.success_pct"
	figNewP50      = "new.p50_ms"
	figNewP99      = "new.p99_ms"
	figEstOK       = "established.success_pct"
	figEstP50      = "established.p50_ms"
	figEstP99      = "established.p99_ms"
	figGtlsOK      = "gtlsclient.success_pct"
	figGtlsP50     = "gtlsclient.p50_ms"
	figCPU         = "server.cpu_pct"
	figCPUSeconds  = "server.cpu_seconds"
	figRSS         = "server.peak_rss_mb"
	figSocketDrops = "server.socket_drops"
	figRcvbufDrops = "server.rcvbuf_drops"
	figRefused     = "module.refused"
	figDelivered   = "module.delivered"
	figStop        = "stop_seconds"

	// The attack scenarios' figures (the flood's apply to every flood).
	figSent          = "flood.sent"
	figWarmup        = "flood.warmup_sent"
	figFloodDelivery = "flood.delivered_pct"
	figModuleRefused = "flood.module_refused_pct"
	figKernelDropped = "flood.kernel_dropped_pct"
	figAttackerOK    = "attacker.success_pct"
	figAttackerP50   = "attacker.p50_ms"
	figReturningOK   = "returning.success_pct"
	figReturningP50  = "returning.p50_ms"
	// figCPUIdle is Caddy's CPU over its CPU in the idle scenario with
	// the same variant and repetition, when idle ran.
	figCPUIdle = "server.cpu_idle_ratio"

	// The attacks on proofs' figures. Proofs and unpaced attempts are the
	// rise of the learned counter's kinds over the measured window (0
	// when it did not rise; not measured without the module's counters).
	figProofs           = "trust.proofs"
	figUnpaced          = "trust.unpaced_attempts"
	figPeerVerified     = "trust.proven_peer_datagrams"
	figBots             = "bots.count"
	figBotsProofs       = "bots.proofs"
	figProbePaths       = "probes.paths"
	figProbeDatagrams   = "probes.datagrams"
	figProbeAnswers     = "probes.answers"
	figProbeValidated   = "probes.validated"
	figReturningEstOK   = "returning_established.success_pct"
	figReturningEstP50  = "returning_established.p50_ms"
	figStrangerOK       = "stranger.success_pct"
	figStrangerP50      = "stranger.p50_ms"
	figOpeningPassedMax = "opening.passed_max_pps"
	figOpeningTotalMin  = "opening.total_min_pps"
	figOpeningOverTotal = "opening.passed_over_total_max"
	figOpeningFromPeer  = "opening.from_peer_median_pps"
)

// idleScenario is the scenario CPU is compared with (figCPUIdle).
const idleScenario = "idle"

func transferFigure(name, what string) string { return "transfer." + name + "." + what }

// moduleFigure names a module group's total (label empty) or one label
// value's part of it.
func moduleFigure(group, label, value string) string {
	if label == "" {
		return "module:" + group
	}
	return "module:" + group + ":" + label + "=" + value
}

// figures flattens a run into named numbers; NaN for what was not measured.
func figures(r RunResult) map[string]float64 {
	f := map[string]float64{}
	if r.Flood != nil {
		f[figOffered] = r.Flood.OfferedPPS
		if r.Flood.Spoofed == "" {
			f[figReflected] = float64(r.Flood.Reflected)
		}
		if pct, ok := kernelRefusedPct(r); ok {
			f[figKernelDrop] = pct
		}
		f[figSent] = float64(r.Flood.Sent)
		if r.Flood.WarmupSent > 0 {
			f[figWarmup] = float64(r.Flood.WarmupSent)
		}
		if pct, ok := deliveredPct(r); ok {
			f[figFloodDelivery] = pct
			f[figKernelDropped] = 100 * float64(r.Server.SocketDrops) / float64(r.Flood.Sent)
			if s := r.Server; s.ModuleRefused+s.ModuleDelivered > 0 {
				f[figModuleRefused] = 100 * s.ModuleRefused / float64(r.Flood.Sent)
			}
		}
	}
	legit := func(s *LegitStats, ok, p50, p99 string) {
		if s == nil {
			return
		}
		f[ok] = s.SuccessPct
		f[p50] = orNaN(s.P50Ms)
		if p99 != "" {
			f[p99] = orNaN(s.P99Ms)
		}
	}
	legit(r.NewConn, figNewOK, figNewP50, figNewP99)
	legit(r.Established, figEstOK, figEstP50, figEstP99)
	legit(r.Gtls, figGtlsOK, figGtlsP50, "")
	legit(r.Attacker, figAttackerOK, figAttackerP50, "")
	legit(r.Returning, figReturningOK, figReturningP50, "")
	legit(r.ReturningEstablished, figReturningEstOK, figReturningEstP50, "")
	legit(r.Stranger, figStrangerOK, figStrangerP50, "")
	if s := r.Server; s.ModuleRefused+s.ModuleDelivered > 0 {
		f[figProofs], _ = learnedOf(s.Series, proofsKind)
		f[figUnpaced], _ = learnedOf(s.Series, unpacedKind)
		f[figPeerVerified] = verifiedOf(s.Series, provenHows...)
	}
	if b := r.Bots; b != nil {
		f[figBots] = float64(b.Bots)
		f[figBotsProofs] = orNaN(b.Proofs)
	}
	if p := r.Probes; p != nil {
		f[figProbePaths] = float64(p.Paths)
		f[figProbeDatagrams] = float64(p.Datagrams)
		f[figProbeAnswers] = float64(p.Answers)
		f[figProbeValidated] = float64(p.Validated)
	}
	if passed, total, over, peers, ok := r.Opening.figures(); ok {
		f[figOpeningPassedMax], f[figOpeningTotalMin], f[figOpeningOverTotal], f[figOpeningFromPeer] = passed, total, over, peers
	}
	f[figCPU] = r.Server.CPUPct
	f[figCPUSeconds] = r.Server.CPUSeconds
	f[figRSS] = float64(r.Server.PeakRSSBytes) / 1e6
	f[figSocketDrops] = float64(r.Server.SocketDrops)
	f[figRcvbufDrops] = r.Server.RcvbufDrops
	f[figRefused] = r.Server.ModuleRefused
	f[figDelivered] = r.Server.ModuleDelivered
	for _, g := range r.Server.Module {
		f[moduleFigure(g.Name, "", "")] = g.Total
		for label, vals := range g.By {
			for v, n := range vals {
				f[moduleFigure(g.Name, label, v)] = n
			}
		}
	}
	for _, t := range r.Transfers {
		f[transferFigure(t.Name, "mbps")] = t.Mbps
		f[transferFigure(t.Name, "seconds")] = t.Seconds
		f[transferFigure(t.Name, "got_mb")] = float64(t.Got) / 1e6
	}
	// A killed Caddy's stop time is the limit, not a measurement.
	f[figStop] = r.StopSeconds
	if r.StopTimedOut {
		f[figStop] = math.NaN()
	}
	return f
}

// kernelRefusedPct is the share of a flood's datagrams that the module
// refused in the kernel: its refused verdicts over the datagrams sent, in %.
// Not measured (false) without a flood, with no module counters (plain
// Caddy) or when the module decides in userspace.
func kernelRefusedPct(r RunResult) (float64, bool) {
	s := r.Server
	if r.Flood == nil || r.Flood.Sent == 0 || s.Userspace || s.ModuleRefused+s.ModuleDelivered == 0 {
		return 0, false
	}
	return 100 * s.ModuleRefused / float64(r.Flood.Sent), true
}

// deliveredPct is the share of a flood's datagrams that reached quic-go, in
// %: those sent less those Caddy's socket dropped (in the kernel: what the
// filter or the userspace mode's pre-filter refused, and what a full receive
// buffer lost) and, in userspace mode, less those the module refused after
// the socket received them. The clients' few datagrams are counted as the
// flood's. Not measured (false) without a flood.
func deliveredPct(r RunResult) (float64, bool) {
	if r.Flood == nil || r.Flood.Sent == 0 {
		return 0, false
	}
	lost := float64(r.Server.SocketDrops)
	if r.Server.Userspace {
		lost += r.Server.ModuleRefused
	}
	sent := float64(r.Flood.Sent)
	return 100 * max(0, sent-lost) / sent, true
}

// summarizeRuns computes the medians and ratios of every scenario and
// variant, in the order of scenarios and variants.
func summarizeRuns(runs []RunResult, variants []Variant, scenarios []Scenario) []Summary {
	type key struct {
		scenario, variant string
		rep               int
	}
	byKey := map[key]map[string]float64{}
	for _, r := range runs {
		byKey[key{r.Scenario, r.Variant, r.Rep}] = figures(r)
	}
	for k, f := range byKey {
		if idle, ok := byKey[key{idleScenario, k.variant, k.rep}]; ok && k.scenario != idleScenario {
			f[figCPUIdle] = ratio(f[figCPU], idle[figCPU])
		}
	}
	var out []Summary
	for _, sc := range scenarios {
		for _, v := range variants {
			s := Summary{Scenario: sc.Name, Variant: v.Name, Figures: map[string]Figure{}}
			var reps []int
			names := map[string]bool{}
			for _, r := range runs {
				if r.Scenario != sc.Name || r.Variant != v.Name {
					continue
				}
				reps = append(reps, r.Rep)
				for _, t := range r.Transfers {
					if t.TimedOut {
						if s.TransferTimeouts == nil {
							s.TransferTimeouts = map[string]int{}
						}
						s.TransferTimeouts[t.Name]++
					}
				}
				if r.StopTimedOut {
					s.StopTimeouts++
				}
				for n := range byKey[key{sc.Name, v.Name, r.Rep}] {
					names[n] = true
				}
			}
			if len(reps) == 0 {
				continue
			}
			s.Reps = len(reps)
			for n := range names {
				var vals, ratios []float64
				for _, rep := range reps {
					val, ok := byKey[key{sc.Name, v.Name, rep}][n]
					if !ok {
						val = math.NaN()
					}
					vals = append(vals, val)
					if v.Name != Plain {
						ref, ok := byKey[key{sc.Name, Plain, rep}][n]
						if !ok {
							ref = math.NaN()
						}
						ratios = append(ratios, ratio(val, ref))
					}
				}
				fig := Figure{Median: finite(median(vals))}
				if v.Name != Plain {
					fig.Ratio = finite(median(ratios))
				}
				s.Figures[n] = fig
			}
			out = append(out, s)
		}
	}
	return out
}

// writeOutputs writes results.json, results.md and the charts to dir, and
// the bench section of readme when set.
func writeOutputs(rep *Report, dir, readme string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding results.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results.json: %w", err)
	}
	var md strings.Builder
	writeMarkdown(&md, rep)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return fmt.Errorf("writing results.md: %w", err)
	}
	for _, ch := range charts(rep) {
		if err := os.WriteFile(filepath.Join(dir, ch.file), []byte(ch.svg()), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", ch.file, err)
		}
	}
	if readme != "" {
		return updateReadme(readme, dir, rep)
	}
	return nil
}

// summaryOf returns the summary of a scenario and variant.
func summaryOf(rep *Report, scenario, variant string) *Summary {
	for i := range rep.Summary {
		if s := &rep.Summary[i]; s.Scenario == scenario && s.Variant == variant {
			return s
		}
	}
	return nil
}
