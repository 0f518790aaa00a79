//go:build linux

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// cell formats a figure: its median with format and, for variants other
// than plain, its ratio to plain.
func cell(s *Summary, name string, format func(float64) string) string {
	if s == nil {
		return "–"
	}
	f, ok := s.Figures[name]
	if !ok || f.Median == nil {
		return "–"
	}
	out := format(*f.Median)
	if s.Variant != Plain {
		if f.Ratio != nil {
			out += fmt.Sprintf(" (%s×)", ratioText(*f.Ratio))
		} else {
			out += " (–)"
		}
	}
	return out
}

func ratioText(r float64) string {
	switch {
	case r >= 100:
		return strconv.FormatFloat(r, 'f', 0, 64)
	case r >= 10:
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}

func pct(v float64) string  { return fmt.Sprintf("%.1f%%", v) }
func msec(v float64) string { return fmt.Sprintf("%.1f ms", v) }
func num(v float64) string  { return count(v) }
func mb(v float64) string   { return fmt.Sprintf("%.0f MB", v) }
func mbps(v float64) string { return fmt.Sprintf("%.0f", v) }
func secs(v float64) string {
	if v < 0.1 {
		return fmt.Sprintf("%.1f ms", v*1000)
	}
	return fmt.Sprintf("%.2f s", v)
}

// writeMarkdown writes the report's tables.
func writeMarkdown(w io.Writer, rep *Report) {
	m := rep.Machine
	fmt.Fprintf(w, "# End-to-end benchmark: Caddy with rakelimit against plain Caddy\n\n")
	fmt.Fprintf(w, "Generated by `lab/cmd/rakebench`; do not edit. Command: `%s`\n\n", shellJoin(rep.Command))
	fmt.Fprintf(w, "- Date: %s (%.0f s)\n", rep.Date, rep.Elapsed)
	fmt.Fprintf(w, "- Machine: %s, %d cores, %s\n", m.CPU, m.Cores, m.Kernel)
	fmt.Fprintf(w, "- Caddy: %s, built with %s", m.Caddy, m.Go)
	if m.Revision != "" {
		fmt.Fprintf(w, " from commit %s", shortRev(m.Revision))
	}
	if m.Modules != "" {
		fmt.Fprintf(w, " (%s)", m.Modules)
	}
	fmt.Fprintf(w, "\n- gtlsclient: %s\n", m.Gtlsclient)
	st := rep.Settings
	fmt.Fprintf(w, "- %d repetition(s); floods of %.1f s (at most %s datagrams each); legitimate clients at %d requests/s each, timeout %.1f s\n",
		st.Reps, st.FloodSeconds, count(float64(st.FloodMax)), st.RequestRate, st.TimeoutSeconds)
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "- Note: %s\n", n)
	}
	fmt.Fprintf(w, "\nVariants (the directive in the site block):\n\n")
	for _, v := range rep.Variants {
		d := "no directive: the reference"
		if v.Directive != "" {
			d = "`" + strings.ReplaceAll(v.Directive, "\n", " ") + "`"
		}
		fmt.Fprintf(w, "- **%s**: %s\n", v.Name, d)
	}
	fmt.Fprintf(w, "\nEach cell is the median over the repetitions; (r×) is the median of the ratio to plain in the same repetition.\n")
	fmt.Fprintf(w, "One fresh Caddy process per scenario, variant and repetition; the flood sender, the clients and Caddy share the machine.\n")

	var floods []Scenario
	var transfer bool
	for _, sc := range rep.Scenarios {
		if sc.Transfers {
			transfer = true
		} else {
			floods = append(floods, sc)
		}
	}
	if len(floods) > 0 {
		fmt.Fprintf(w, "\n## At a glance\n\n")
		writeGlance(w, rep)
		fmt.Fprintf(w, "\n## Legitimate clients during floods\n\n")
		fmt.Fprintf(w, "New connection: a new QUIC connection (new socket) per request; established: one connection opened before the flood. ")
		fmt.Fprintf(w, "Success counts every request started during the flood; latencies are of the successful ones. ")
		fmt.Fprintf(w, "gtlsclient: %d fetches per run with ngtcp2's client. ", st.GtlsFetches)
		fmt.Fprintf(w, "Flood offered: datagrams per second the sender got out over the whole flood, pauses of the pulse included (results.json has the peak rate).\n\n")
		fmt.Fprintf(w, "| scenario | variant | flood offered (datagrams/s) | new conn. success | new p50 | new p99 | established success | est. p50 | est. p99 | gtlsclient success |\n")
		fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, sc := range floods {
			for _, v := range rep.Variants {
				s := summaryOf(rep, sc.Name, v.Name)
				gt := rep.Machine.Gtlsclient // not installed, or off
				if st.GtlsFetches > 0 {
					gt = cell(s, figGtlsOK, pct)
				}
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sc.Name, v.Name,
					cell(s, figOffered, num), cell(s, figNewOK, pct), cell(s, figNewP50, msec), cell(s, figNewP99, msec),
					cell(s, figEstOK, pct), cell(s, figEstP50, msec), cell(s, figEstP99, msec), gt)
			}
		}
		fmt.Fprintf(w, "\n## Server side during floods\n\n")
		fmt.Fprintf(w, "CPU: Caddy's user and system time over the run, in %% of one core (the filter runs in the sender's context on loopback and is not in it). ")
		fmt.Fprintf(w, "Socket drops: the drops column of Caddy's UDP socket, which counts what the filter refused as well as receive-buffer overflows; ")
		fmt.Fprintf(w, "receive-buffer drops = socket drops − the module's refused datagrams (in userspace mode, which refuses datagrams the socket has received, the socket drops). ")
		fmt.Fprintf(w, "Refused in the kernel: the module's refused datagrams in %% of the flood's datagrams (the kernel filter only). ")
		fmt.Fprintf(w, "Reflected: datagrams Caddy sent back to the flood's sockets (not measured for spoofed floods, whose sources have no socket). ")
		fmt.Fprintf(w, "Stop: SIGTERM to Caddy right after the run until it exits (killed after %.0f s). ", rep.Settings.FloodStopTimeoutSeconds)
		fmt.Fprintf(w, "Module: the module's counters, by verdict and label, summed over families and listeners.\n\n")
		fmt.Fprintf(w, "| scenario | variant | Caddy CPU | peak RSS | socket drops | receive-buffer drops | refused in the kernel | reflected | stop | module |\n")
		fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
		for _, sc := range floods {
			for _, v := range rep.Variants {
				s := summaryOf(rep, sc.Name, v.Name)
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sc.Name, v.Name,
					cell(s, figCPU, pct), cell(s, figRSS, mb), cell(s, figSocketDrops, num), cell(s, figRcvbufDrops, num),
					cell(s, figKernelDrop, pct), cell(s, figReflected, num), stopCell(s, rep.Settings.FloodStopTimeoutSeconds), moduleCell(s))
			}
		}
	}
	if slices.ContainsFunc(floods, Scenario.attack) {
		writeAttacks(w, rep, floods)
	}
	if transfer {
		writeTransfers(w, rep)
	}
	fmt.Fprintf(w, "\n## Scenarios\n\n| scenario | what |\n|---|---|\n")
	for _, sc := range rep.Scenarios {
		fmt.Fprintf(w, "| %s | %s |\n", sc.Name, sc.Description)
	}
	if ev := events(rep); len(ev) > 0 {
		fmt.Fprintf(w, "\n## Failures and timeouts, by run\n\n")
		for _, e := range ev {
			fmt.Fprintf(w, "- %s\n", e)
		}
	}
}

// writeAttacks writes the table of the attacks on verification: what of
// each flood reached quic-go, and who was still served.
func writeAttacks(w io.Writer, rep *Report, floods []Scenario) {
	fmt.Fprintf(w, "\n## Attacks on verification\n\n")
	fmt.Fprintf(w, "Sent: the flood's datagrams (a warm-up's first flights included). ")
	fmt.Fprintf(w, "Refused by the module: its refused verdicts (in the kernel or in userspace) in %% of those sent; the server-side table breaks its verdicts down. ")
	fmt.Fprintf(w, "Delivered to quic-go: those sent less those Caddy's socket dropped and, in userspace mode, less those the module refused after receiving them. ")
	fmt.Fprintf(w, "Dropped in the kernel: the socket's drops (the filter's refusals, the userspace pre-filter's, full receive buffers) in %% of those sent. ")
	fmt.Fprintf(w, "CPU × idle: Caddy's CPU over its CPU in the idle scenario with the same variant and repetition (– when idle did not run). ")
	fmt.Fprintf(w, "Attacker's connection: the attacker's own connection, opened before the flood, a request every 200 ms during it. ")
	fmt.Fprintf(w, "Returning: a client that connected before the flood and opens a new connection from the same address %d times a second during it.\n\n", returningRate)
	fmt.Fprintf(w, "| scenario | variant | sent | refused by the module | delivered to quic-go | dropped in the kernel | Caddy CPU | CPU × idle | new conn. success | established success | attacker's connection | returning |\n")
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, sc := range floods {
		if !sc.attack() {
			continue
		}
		for _, v := range rep.Variants {
			s := summaryOf(rep, sc.Name, v.Name)
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sc.Name, v.Name,
				cell(s, figSent, num), medianCell(s, figModuleRefused, pct), cell(s, figFloodDelivery, pct), cell(s, figKernelDropped, pct), cell(s, figCPU, pct),
				medianCell(s, figCPUIdle, func(v float64) string { return ratioText(v) + "×" }), cell(s, figNewOK, pct), cell(s, figEstOK, pct),
				medianCell(s, figAttackerOK, pct), medianCell(s, figReturningOK, pct))
		}
	}
}

// medianCell formats a figure's median alone, without its ratio to plain.
func medianCell(s *Summary, name string, format func(float64) string) string {
	if s == nil {
		return "–"
	}
	if f, ok := s.Figures[name]; ok && f.Median != nil {
		return format(*f.Median)
	}
	return "–"
}

func writeTransfers(w io.Writer, rep *Report) {
	sz := rep.Settings.Sizes
	fmt.Fprintf(w, "\n## Transfers, no flood\n\n")
	fmt.Fprintf(w, "Download: %s in one request; upload: %s POSTed to a backend that reads it all; 20 downloads of %s each, concurrently, over one connection and over 20 connections from 20 different /24s. ",
		sizeText(sz.Download), sizeText(sz.Upload), sizeText(sz.Each))
	fmt.Fprintf(w, "A transfer with no progress for %.0f s or not done after %.0f s is a timeout; its Mbit/s is over the bytes it got. ",
		rep.Settings.StallSeconds, rep.Settings.TransferTimeoutSeconds)
	fmt.Fprintf(w, "Stop: SIGTERM to Caddy after the transfers until it exits (killed after %.0f s).\n\n", rep.Settings.StopTimeoutSeconds)
	fmt.Fprintf(w, "| transfer | variant | Mbit/s | time | got | timeouts |\n|---|---|--:|--:|--:|--:|\n")
	for _, name := range TransferNames() {
		for _, v := range rep.Variants {
			s := summaryOf(rep, "transfers", v.Name)
			to := "0"
			if s != nil {
				to = fmt.Sprintf("%d of %d", s.TransferTimeouts[name], s.Reps)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", name, v.Name, cell(s, transferFigure(name, "mbps"), mbps),
				cell(s, transferFigure(name, "seconds"), secs), cell(s, transferFigure(name, "got_mb"), mb), to)
		}
	}
	for _, v := range rep.Variants {
		s := summaryOf(rep, "transfers", v.Name)
		to := "0"
		if s != nil {
			to = fmt.Sprintf("%d of %d", s.StopTimeouts, s.Reps)
		}
		fmt.Fprintf(w, "| Caddy's stop | %s | | %s | | %s |\n", v.Name, stopCell(s, rep.Settings.StopTimeoutSeconds), to)
	}
	fmt.Fprintf(w, "\n| scenario | variant | Caddy CPU | CPU time | peak RSS | module |\n|---|---|--:|--:|--:|---|\n")
	for _, v := range rep.Variants {
		s := summaryOf(rep, "transfers", v.Name)
		fmt.Fprintf(w, "| transfers | %s | %s | %s | %s | %s |\n", v.Name, cell(s, figCPU, pct), cell(s, figCPUSeconds, secs),
			cell(s, figRSS, mb), moduleCell(s))
	}
}

// stopCell is the median stop time, or "killed" with the share of
// repetitions in which Caddy did not stop within limit.
func stopCell(s *Summary, limit float64) string {
	if s != nil && s.StopTimeouts*2 > s.Reps {
		return fmt.Sprintf("> %.0f s, killed (%d of %d)", limit, s.StopTimeouts, s.Reps)
	}
	out := cell(s, figStop, secs)
	if s != nil && s.StopTimeouts > 0 {
		out += fmt.Sprintf(", killed %d of %d", s.StopTimeouts, s.Reps)
	}
	return out
}

// shortRev abbreviates a commit hash to 12 digits.
func shortRev(rev string) string { return rev[:min(len(rev), 12)] }

func sizeText(n int64) string {
	switch {
	case n >= 1e6 && n%1e6 == 0:
		return fmt.Sprintf("%d MB", n/1e6)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%d kB", n/1000)
}

// moduleCell describes the module's counters from the medians of the
// summary's module figures.
func moduleCell(s *Summary) string {
	if s == nil {
		return "–"
	}
	groups := map[string]*ModuleGroup{}
	for name, f := range s.Figures {
		rest, ok := strings.CutPrefix(name, "module:")
		if !ok || f.Median == nil {
			continue
		}
		group, lv, hasLabel := strings.Cut(rest, ":")
		g := groups[group]
		if g == nil {
			g = &ModuleGroup{Name: group, By: map[string]map[string]float64{}}
			groups[group] = g
		}
		if !hasLabel {
			g.Total = *f.Median
			continue
		}
		label, value, _ := strings.Cut(lv, "=")
		if g.By[label] == nil {
			g.By[label] = map[string]float64{}
		}
		g.By[label][value] = *f.Median
	}
	var list []ModuleGroup
	for _, name := range slices.SortedFunc(maps.Keys(groups), func(a, b string) int {
		return compareFloat(groups[b].Total, groups[a].Total)
	}) {
		list = append(list, *groups[name])
	}
	return strings.ReplaceAll(describeGroups(list), "|", "\\|")
}

// events lists the runs' failures: timeouts, transfer errors, request
// errors by kind.
func events(rep *Report) []string {
	var out []string
	for _, r := range rep.Runs {
		at := fmt.Sprintf("rep %d %s/%s", r.Rep, r.Scenario, r.Variant)
		for _, t := range r.Transfers {
			if t.Error != "" {
				out = append(out, fmt.Sprintf("%s: %s: %s (got %s of %s)", at, t.Name, t.Error, sizeText(t.Got), sizeText(t.Expected)))
			}
		}
		if r.StopTimedOut {
			limit := rep.Settings.FloodStopTimeoutSeconds
			if len(r.Transfers) > 0 {
				limit = rep.Settings.StopTimeoutSeconds
			}
			out = append(out, fmt.Sprintf("%s: Caddy did not stop within %.0f s of SIGTERM and was killed", at, limit))
		}
		for _, c := range []struct {
			name string
			s    *LegitStats
		}{{"new connection", r.NewConn}, {"established", r.Established}, {"gtlsclient", r.Gtls},
			{"attacker's connection", r.Attacker}, {"returning", r.Returning}} {
			if c.s == nil || len(c.s.Errors) == 0 {
				continue
			}
			var errs []string
			for _, k := range slices.Sorted(maps.Keys(c.s.Errors)) {
				errs = append(errs, fmt.Sprintf("%d × %s", c.s.Errors[k], k))
			}
			out = append(out, fmt.Sprintf("%s: %s: %d of %d failed: %s", at, c.name, c.s.Attempted-c.s.OK, c.s.Attempted, strings.Join(errs, "; ")))
		}
	}
	return out
}

// Markers of the bench section of the README.
const (
	readmeBegin = "<!-- bench:begin -->"
	readmeEnd   = "<!-- bench:end -->"
)

// updateReadme replaces the bench section of readme with the charts of dir
// and where they came from.
func updateReadme(readme, dir string, rep *Report) error {
	b, err := os.ReadFile(readme)
	if err != nil {
		return fmt.Errorf("-readme: %w", err)
	}
	text := string(b)
	i, j := strings.Index(text, readmeBegin), strings.Index(text, readmeEnd)
	if i < 0 || j < i {
		return fmt.Errorf("-readme %s: no %s ... %s section", readme, readmeBegin, readmeEnd)
	}
	rel, err := filepath.Rel(filepath.Dir(readme), dir)
	if err != nil {
		return fmt.Errorf("-readme: %w", err)
	}
	rel = filepath.ToSlash(rel)
	var s strings.Builder
	s.WriteString(readmeBegin + "\n")
	m := rep.Machine
	fmt.Fprintf(&s, "From `%s` on %s: %s, %d cores, %s; %s",
		shellJoin(rep.Command), rep.Date[:10], m.CPU, m.Cores, m.Kernel, m.Caddy)
	if m.Revision != "" {
		fmt.Fprintf(&s, ", commit %s", shortRev(m.Revision))
	}
	fmt.Fprintf(&s, "; medians of %d repetitions. Tables: [%s/results.md](%s/results.md).\n\n", rep.Settings.Reps, rel, rel)
	for _, ch := range charts(rep) {
		fmt.Fprintf(&s, "![%s](%s/%s)\n", ch.title, rel, ch.file)
	}
	s.WriteString(readmeEnd)
	out := text[:i] + s.String() + text[j+len(readmeEnd):]
	if err := os.WriteFile(readme, []byte(out), 0o644); err != nil {
		return fmt.Errorf("-readme: writing %s: %w", readme, err)
	}
	return nil
}

// shellJoin joins a command's arguments as a shell reads them back: an
// argument with spaces or shell characters in single quotes.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"$`\\|&;<>(){}*?[]#~") {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
