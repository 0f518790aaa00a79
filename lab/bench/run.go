//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rakelimit/caddy-rakelimit/lab/dashboard"
)

// requestRate is each legitimate client's requests per second.
const requestRate = 25

// gtlsFetches is the number of gtlsclient fetches per scenario.
const gtlsFetches = 3

// reflectionGrace is how long a flood's sockets keep listening for replies
// after the last datagram.
const reflectionGrace = 250 * time.Millisecond

// Report is everything a run measured; results.json holds it.
type Report struct {
	Date      string      `json:"date"`
	Command   []string    `json:"command"`
	Machine   Machine     `json:"machine"`
	Settings  Settings    `json:"settings"`
	Variants  []Variant   `json:"variants"`
	Scenarios []Scenario  `json:"scenarios"`
	Runs      []RunResult `json:"runs"`
	Summary   []Summary   `json:"summary"`
	Elapsed   float64     `json:"elapsed_seconds"`
	Notes     []string    `json:"notes,omitempty"`
	sizes     transferSizes
}

// Machine describes where the run happened and what ran.
type Machine struct {
	CPU        string `json:"cpu"`
	Cores      int    `json:"cores"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	Caddy      string `json:"caddy"`
	Modules    string `json:"modules,omitempty"`
	Revision   string `json:"revision,omitempty"`
	Gtlsclient string `json:"gtlsclient"`
}

// Settings are the run's parameters after scaling.
type Settings struct {
	Reps                    int           `json:"reps"`
	Scale                   float64       `json:"scale"`
	TransferScale           float64       `json:"transfer_scale"`
	FloodSeconds            float64       `json:"flood_seconds"`
	FloodMax                uint64        `json:"flood_max"`
	RequestRate             int           `json:"request_rate"`
	TimeoutSeconds          float64       `json:"request_timeout_seconds"`
	GtlsFetches             int           `json:"gtlsclient_fetches"`
	Sizes                   transferSizes `json:"transfer_bytes"`
	StallSeconds            float64       `json:"transfer_stall_seconds"`
	TransferTimeoutSeconds  float64       `json:"transfer_timeout_seconds"`
	StopTimeoutSeconds      float64       `json:"stop_timeout_seconds"`
	FloodStopTimeoutSeconds float64       `json:"flood_stop_timeout_seconds"`
}

// RunResult is one scenario with one variant in one repetition.
type RunResult struct {
	Scenario string `json:"scenario"`
	Variant  string `json:"variant"`
	Rep      int    `json:"rep"`
	// Seconds is the measured window: from the flood's start to the last
	// request's end (or the transfers').
	Seconds     float64      `json:"seconds"`
	Flood       *FloodResult `json:"flood,omitempty"`
	NewConn     *LegitStats  `json:"new_connection,omitempty"`
	Established *LegitStats  `json:"established,omitempty"`
	Gtls        *LegitStats  `json:"gtlsclient,omitempty"`
	// Attacker is the attacker's own connection (FloodSpec.Attacker);
	// Returning the returning client (Scenario.Returning).
	Attacker  *LegitStats `json:"attacker,omitempty"`
	Returning *LegitStats `json:"returning,omitempty"`
	// ReturningEstablished is the returning client's requests over the
	// connection it kept (Scenario.ReturningKeeps).
	ReturningEstablished *LegitStats `json:"returning_established,omitempty"`
	// Stranger is the stranger client (Scenario.Stranger).
	Stranger *LegitStats `json:"stranger,omitempty"`
	// Bots is what proving the bots did (FloodSpec.Prove), Probes what
	// the attacker's path probes did (FloodSpec.PathProbes), Opening the
	// opening class second by second (Scenario.Timeline).
	Bots      *BotsResult      `json:"bots,omitempty"`
	Probes    *ProbeResult     `json:"probes,omitempty"`
	Opening   *OpeningTimeline `json:"opening,omitempty"`
	Server    ServerStats      `json:"server"`
	Transfers []TransferResult `json:"transfers,omitempty"`
	// StopSeconds is the time from SIGTERM to Caddy's exit; StopTimedOut
	// is set when it had to be killed.
	StopSeconds  float64 `json:"stop_seconds"`
	StopTimedOut bool    `json:"stop_timed_out"`
}

// ServerStats is Caddy's side of a scenario.
type ServerStats struct {
	// CPUPct is Caddy's CPU time over the window, in % of one core;
	// CPUSeconds the time itself.
	CPUPct       float64 `json:"cpu_pct"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	PeakRSSBytes uint64  `json:"peak_rss_bytes"`
	// SocketDrops is the rise of the drops column of Caddy's UDP socket:
	// datagrams the filter refused plus those a full receive buffer lost.
	SocketDrops uint64 `json:"socket_drops"`
	// ModuleRefused and ModuleDelivered total the module's verdicts.
	ModuleRefused   float64 `json:"module_refused"`
	ModuleDelivered float64 `json:"module_delivered"`
	// RcvbufDrops is SocketDrops - ModuleRefused, or SocketDrops when the
	// module runs in userspace, where it refuses datagrams after the
	// socket has received them.
	RcvbufDrops float64 `json:"rcvbuf_drops"`
	// Userspace is set when the module decided in userspace.
	Userspace bool          `json:"userspace,omitempty"`
	Module    []ModuleGroup `json:"module,omitempty"`
	Series    []Series      `json:"series,omitempty"`
}

// bench is the state of one run.
type bench struct {
	o        *Options
	progress io.Writer
	dir      string
	bin      string
	gtls     string // gtlsclient's path, empty when not used
	site     site
	sizes    transferSizes
	backend  *uploadBackend
	// dash is the dashboard -dashboard renders, nil without it; recorded
	// is its scenario run's scrapes, once made.
	dash     *dashboard.Compiled
	recorded *recording
	// flights are the client first flights of warm-ups, made once.
	flights [][]byte
}

// repOrder returns the order in which repetition r runs the variants: as
// listed in odd repetitions, reversed in even ones, so that no variant
// always runs first (a warmer or colder machine, the clients' process
// older by one run) and a pair of repetitions cancels the order's bias.
func repOrder(vs []Variant, r int) []Variant {
	if r%2 == 1 {
		return vs
	}
	rev := slices.Clone(vs)
	slices.Reverse(rev)
	return rev
}

// Run runs the benchmark and writes its outputs; progress lines go to
// progress. Every Caddy it starts is stopped before it returns, also when
// ctx ends.
func Run(ctx context.Context, o *Options, progress io.Writer) (*Report, error) {
	began := time.Now()
	b := &bench{o: o, progress: progress, sizes: sizesFor(o.TransferScale)}
	dir, err := os.MkdirTemp("", "rakebench-")
	if err != nil {
		return nil, fmt.Errorf("creating a temporary directory: %w", err)
	}
	if o.Keep {
		fmt.Fprintf(progress, "rakebench: keeping %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b.dir = dir
	rep := &Report{Date: began.UTC().Format(time.RFC3339), Command: o.Args, Variants: o.Variants, Scenarios: o.Scenarios}
	if err := b.setup(ctx, rep); err != nil {
		return nil, err
	}
	defer b.backend.close()
	total := o.Reps * len(o.Scenarios) * len(o.Variants)
	i := 0
	runsBegan := time.Now()
	for r := 1; r <= o.Reps; r++ {
		for _, sc := range o.Scenarios {
			for _, v := range repOrder(o.Variants, r) {
				i++
				fmt.Fprintf(progress, "rakebench: [%d/%d] rep %d %s/%s (%s)\n", i, total, r, sc.Name, v.Name,
					timeLeft(time.Since(runsBegan), i-1, total))
				res, err := b.runOne(ctx, sc, v, r)
				if err != nil {
					if ctx.Err() != nil {
						return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
					}
					return nil, fmt.Errorf("scenario %s, variant %s, rep %d: %w", sc.Name, v.Name, r, err)
				}
				fmt.Fprintf(progress, "rakebench: [%d/%d]   %s\n", i, total, oneLine(res))
				rep.Runs = append(rep.Runs, res)
			}
		}
	}
	rep.Summary = summarizeRuns(rep.Runs, o.Variants, o.Scenarios)
	rep.Elapsed = time.Since(began).Seconds()
	if b.recorded != nil {
		rep.Notes = append(rep.Notes, dashboardNote(b.recorded))
	}
	if err := writeOutputs(rep, o.Out, o.Readme); err != nil {
		return nil, err
	}
	if b.recorded != nil {
		path, err := writeDashboard(b.dash, b.recorded, rep.Date, o.Out)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "rakebench: wrote %s\n", path)
	}
	fmt.Fprintf(progress, "rakebench: done in %.0f s; wrote %s\n", rep.Elapsed, filepath.Join(o.Out, "results.md"))
	return rep, nil
}

// Rerender reads the results.json of an earlier run and writes its
// results.md, charts and README section again with this version's report
// code: the figures are the run's, recomputed medians and ratios included.
func Rerender(o *Options, progress io.Writer) (*Report, error) {
	b, err := os.ReadFile(o.From)
	if err != nil {
		return nil, fmt.Errorf("-from: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("-from %s: %w", o.From, err)
	}
	if len(rep.Runs) == 0 || len(rep.Variants) == 0 || rep.Variants[0].Name != Plain {
		return nil, fmt.Errorf("-from %s: no runs, or no plain variant first", o.From)
	}
	rep.Summary = summarizeRuns(rep.Runs, rep.Variants, rep.Scenarios)
	if err := writeOutputs(&rep, o.Out, o.Readme); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "rakebench: rendered %s from %s (run of %s)\n", filepath.Join(o.Out, "results.md"), o.From, rep.Date)
	return &rep, nil
}

// oneLine summarizes a run for the progress output.
func oneLine(r RunResult) string {
	var parts []string
	if r.Flood != nil {
		if r.Flood.Spoofed != "" {
			parts = append(parts, fmt.Sprintf("flood %s dgram/s spoofed from %s addresses in %s", count(r.Flood.OfferedPPS), count(float64(r.Flood.Addresses)), r.Flood.Spoofed))
		} else {
			parts = append(parts, fmt.Sprintf("flood %s dgram/s from %d sockets, reflected %s", count(r.Flood.OfferedPPS), r.Flood.Sockets, count(float64(r.Flood.Reflected))))
		}
		if r.Flood.WarmupSent > 0 {
			parts = append(parts, fmt.Sprintf("warm-up %s first flights", count(float64(r.Flood.WarmupSent))))
		}
		if r.Flood.ServerID != "" {
			parts = append(parts, "server ID "+r.Flood.ServerID)
		}
	}
	legit := func(name string, s *LegitStats) {
		if s != nil {
			p99 := "-"
			if s.P99Ms != nil {
				p99 = fmt.Sprintf("%.0fms", *s.P99Ms)
			}
			parts = append(parts, fmt.Sprintf("%s %d/%d p99 %s", name, s.OK, s.Attempted, p99))
		}
	}
	legit("new", r.NewConn)
	legit("established", r.Established)
	legit("gtlsclient", r.Gtls)
	legit("attacker", r.Attacker)
	legit("returning", r.Returning)
	legit("returning-established", r.ReturningEstablished)
	legit("stranger", r.Stranger)
	if b := r.Bots; b != nil {
		proofs := "-"
		if b.Proofs != nil {
			proofs = count(*b.Proofs)
		}
		parts = append(parts, fmt.Sprintf("%d bots proved in %.1fs (proofs %s)", b.Bots, b.Seconds, proofs))
	}
	if p := r.Probes; p != nil {
		parts = append(parts, fmt.Sprintf("path probes %d (%d datagrams, %d answers, %d validated, %d errors)", p.Paths, p.Datagrams, p.Answers, p.Validated, p.Errors))
	}
	if s := r.Server; s.ModuleRefused+s.ModuleDelivered > 0 {
		proofs, _ := learnedOf(s.Series, proofsKind)
		unpaced, _ := learnedOf(s.Series, unpacedKind)
		parts = append(parts, fmt.Sprintf("proofs %s, unpaced attempts %s", count(proofs), count(unpaced)))
	}
	if passed, total, over, _, ok := r.Opening.figures(); ok {
		parts = append(parts, fmt.Sprintf("opening passed at most %s/s, total at least %s/s, ratio at most %.2f", count(passed), count(total), over))
	}
	for _, t := range r.Transfers {
		s := fmt.Sprintf("%s %.0f Mbit/s", t.Name, t.Mbps)
		if t.TimedOut {
			s += fmt.Sprintf(" TIMEOUT (%s of %s)", count(float64(t.Got)), count(float64(t.Expected)))
		} else if t.Error != "" {
			s += " error: " + t.Error
		}
		parts = append(parts, s)
	}
	parts = append(parts, fmt.Sprintf("cpu %.0f%%, rss %.0f MB, socket drops %s", r.Server.CPUPct, float64(r.Server.PeakRSSBytes)/1e6, count(float64(r.Server.SocketDrops))))
	if r.Server.ModuleRefused > 0 || r.Server.ModuleDelivered > 0 {
		parts = append(parts, fmt.Sprintf("module refused %s, delivered %s", count(r.Server.ModuleRefused), count(r.Server.ModuleDelivered)))
	}
	if pct, ok := kernelRefusedPct(r); ok {
		parts = append(parts, fmt.Sprintf("refused in the kernel %.1f%% of the flood", pct))
	}
	if pct, ok := deliveredPct(r); ok {
		parts = append(parts, fmt.Sprintf("delivered to quic-go %.1f%% of the flood", pct))
	}
	stop := fmt.Sprintf("stop %.3fs", r.StopSeconds)
	if r.StopTimedOut {
		stop = "stop TIMEOUT"
	}
	return strings.Join(append(parts, stop), "; ")
}
