//go:build linux

package virtiobench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// Sample is one measurement: a mode under one flood at one rate, in one
// repetition and setup, on a fresh Caddy in the guest. Its xdpbench part
// counts as the veth's benchmark does, in the guest: SoftirqSeconds is the
// guest's softirq time, CaddySeconds Caddy's CPU time there, SenderSeconds
// this process's (the sender and the legit client), Seconds the flood's
// window on the host's clock.
type Sample struct {
	xdpbench.Sample
	Setup Setup `json:"setup"`
	// Attach is how an XDP program ran on the guest's NIC in the window,
	// as ip link says: xdp (native, in the driver), xdpgeneric, or none.
	Attach string `json:"attach"`
	// Guest is the guest's CPU time in the window, every vCPU's together,
	// and PerCPU each vCPU's.
	Guest  Times   `json:"guest"`
	PerCPU []Times `json:"per_cpu"`
	// Received is what the guest's NIC received (the driver's rx_packets),
	// NICDropped what its driver dropped (rx_dropped).
	Received   uint64 `json:"received"`
	NICDropped uint64 `json:"nic_dropped"`
	// TapSent is what QEMU read from the tap (its tx_packets); Sent less
	// TapSent is what the tap's full queue refused (its own drop counter
	// counts one frame per refused batch of XDP frames, so it is not kept).
	TapSent uint64 `json:"tap_sent"`
	// GuestSeconds is the window on the guest's clock: the time of its
	// /proc/stat over its vCPUs.
	GuestSeconds float64 `json:"guest_seconds"`
}

// perDrop is seconds of CPU per datagram dropped, in nanoseconds.
func (s Sample) perDrop(seconds float64) float64 {
	if s.Dropped == 0 {
		return 0
	}
	return seconds * 1e9 / float64(s.Dropped)
}

// KernelNsPerDrop is the guest kernel's CPU (softirq, system and hard
// interrupts, every vCPU's) per datagram dropped.
func (s Sample) KernelNsPerDrop() float64 { return s.perDrop(s.Guest.Kernel()) }

// BusyNsPerDrop is the guest's busy CPU (the kernel's and user space's:
// Caddy's) per datagram dropped.
func (s Sample) BusyNsPerDrop() float64 { return s.perDrop(s.Guest.Busy()) }

// DropsPerCPUSecond is the datagrams dropped per second of the guest's busy
// CPU: what one fully busy vCPU drops at this mix of work.
func (s Sample) DropsPerCPUSecond() float64 {
	if s.Guest.Busy() == 0 {
		return 0
	}
	return float64(s.Dropped) / s.Guest.Busy()
}

// ReceivedPPS is what the guest's NIC received per second.
func (s Sample) ReceivedPPS() float64 { return float64(s.Received) / s.Seconds }

// line is a sample's progress line.
func (s Sample) line() string {
	return fmt.Sprintf("%s, %s flood at %s, mode %s (%s), repetition %d: sent %.0f/s, received %.0f/s, dropped %.0f/s, "+
		"guest kernel %.2f s, busy %.2f s, %.0f ns kernel CPU per drop, legit %d/%d", s.Setup.Name(), s.Flood, rateName(s.Rate),
		s.Mode, s.Attach, s.Rep, s.SentPPS(), s.ReceivedPPS(), s.DroppedPPS(), s.Guest.Kernel(), s.Guest.Busy(),
		s.KernelNsPerDrop(), s.LegitOK, s.LegitTotal)
}

// Report is a run's samples and their summary.
type Report struct {
	// Host names the host's CPU and kernel; Accel is QEMU's accelerator;
	// Guests describe the guests booted.
	Host    string         `json:"host"`
	Accel   string         `json:"accel"`
	Guests  []Info         `json:"guests"`
	Options Options        `json:"options"`
	Samples []Sample       `json:"samples"`
	Setups  []SetupSummary `json:"setups"`
	Scaling []Scaling      `json:"scaling"`
}

// SetupSummary is the summary of one setup.
type SetupSummary struct {
	Setup Setup `json:"setup"`
	// Rows and Ratios count as the veth's benchmark does (xdpbench): the
	// receiving CPU is the guest's softirq time and Caddy's.
	Rows   []xdpbench.Row   `json:"rows"`
	Ratios []xdpbench.Ratio `json:"ratios"`
	// Guest and GuestRatios are the guest's own figures.
	Guest       []GuestRow   `json:"guest"`
	GuestRatios []GuestRatio `json:"guest_ratios"`
}

// GuestRow is the medians of one mode under one flood at one rate, in one
// setup.
type GuestRow struct {
	Flood string `json:"flood"`
	Rate  int    `json:"rate"`
	Mode  string `json:"mode"`
	// Attach is the XDP attach ip link showed, in every sample ("a, b"
	// when they differ).
	Attach      string  `json:"attach"`
	SentPPS     float64 `json:"sent_pps"`
	ReceivedPPS float64 `json:"received_pps"`
	DroppedPPS  float64 `json:"dropped_pps"`
	// KernelPct and BusyPct are the guest's CPU, shares of one vCPU.
	KernelPct         float64 `json:"kernel_pct"`
	BusyPct           float64 `json:"busy_pct"`
	KernelNsPerDrop   float64 `json:"kernel_ns_per_drop"`
	BusyNsPerDrop     float64 `json:"busy_ns_per_drop"`
	DropsPerCPUSecond float64 `json:"drops_per_cpu_second"`
	Legit             float64 `json:"legit"`
}

// GuestRatio compares the modes under one flood at one rate, in one setup:
// medians of the per-repetition ratios.
type GuestRatio struct {
	Flood string `json:"flood"`
	Rate  int    `json:"rate"`
	// XDP, Floor: the guest kernel's CPU per drop of mode xdp and of the
	// floor, each over the socket filter's; XDPOverFloor: xdp over the
	// floor; the Busy ones the same of the guest's busy CPU; Dropped the
	// drops per second of mode xdp over the socket filter's.
	XDP          float64 `json:"xdp"`
	Floor        float64 `json:"floor,omitempty"`
	XDPOverFloor float64 `json:"xdp_over_floor,omitempty"`
	XDPBusy      float64 `json:"xdp_busy"`
	FloorBusy    float64 `json:"floor_busy,omitempty"`
	Dropped      float64 `json:"dropped"`
	// LegitXDP is mode xdp's legit client's success (median).
	LegitXDP float64 `json:"legit_xdp"`
	// Met says whether the outcome sought was met (Outcome); only under
	// KVM (Judged): under the emulator, CPU per packet is not a CPU's.
	Met    bool `json:"met"`
	Judged bool `json:"judged"`
}

// Outcome is what the XDP mode was meant to reach at the highest rate the
// host sends: CPU per dropped datagram at most 1/5 of the socket
// filter's, or within 1.5x of the floor; the legit client at 99% or more.
func (q GuestRatio) Outcome() bool {
	return (q.XDP <= 0.2 || (q.XDPOverFloor > 0 && q.XDPOverFloor <= 1.5)) && q.LegitXDP >= 0.99
}

// Scaling is how the drops of one mode, flood and rate grow with the
// queues in use, with the vCPUs fixed: medians.
type Scaling struct {
	CPUs  int    `json:"cpus"`
	Flood string `json:"flood"`
	Rate  int    `json:"rate"`
	Mode  string `json:"mode"`
	// From and To are the queues; FromPPS and ToPPS the drops per second
	// with them, FromBusy and ToBusy the guest's busy CPU (vCPUs); Ratio
	// the median of the per-repetition ratios of the drops.
	From     int     `json:"from"`
	To       int     `json:"to"`
	FromPPS  float64 `json:"from_pps"`
	ToPPS    float64 `json:"to_pps"`
	FromBusy float64 `json:"from_busy"`
	ToBusy   float64 `json:"to_busy"`
	Ratio    float64 `json:"ratio"`
}

// key names a sample but for its mode.
type key struct {
	setup Setup
	flood string
	rate  int
	rep   int
}

// index finds samples by key and mode.
type index map[key]map[string]Sample

func newIndex(samples []Sample) index {
	ix := index{}
	for _, s := range samples {
		k := key{s.Setup, s.Flood, s.Rate, s.Rep}
		if ix[k] == nil {
			ix[k] = map[string]Sample{}
		}
		ix[k][s.Mode] = s
	}
	return ix
}

// ratio is the median over the repetitions of f(a)/f(b), where a and b are
// the samples that pick returns for a repetition's samples; 0 without
// any.
func (ix index) ratio(match func(key) bool, pick func(k key) (a, b Sample, ok bool), f func(Sample) float64) float64 {
	var v []float64
	for k := range ix {
		if !match(k) {
			continue
		}
		if a, b, ok := pick(k); ok && f(a) > 0 && f(b) > 0 {
			v = append(v, f(a)/f(b))
		}
	}
	return testutil.Median(v)
}

// modesOf picks modes a and b of a repetition.
func (ix index) modesOf(a, b string) func(k key) (Sample, Sample, bool) {
	return func(k key) (Sample, Sample, bool) {
		sa, okA := ix[k][a]
		sb, okB := ix[k][b]
		return sa, sb, okA && okB
	}
}

// summarize computes the setups' summaries and the scaling from the
// samples.
func (r *Report) summarize() {
	r.Setups, r.Scaling = nil, nil
	ix := newIndex(r.Samples)
	var setups []Setup
	var floods []key
	var modes []string
	for _, s := range r.Samples {
		if !slices.Contains(setups, s.Setup) {
			setups = append(setups, s.Setup)
		}
		if k := (key{flood: s.Flood, rate: s.Rate}); !slices.Contains(floods, k) {
			floods = append(floods, k)
		}
		if !slices.Contains(modes, s.Mode) {
			modes = append(modes, s.Mode)
		}
	}
	slices.SortStableFunc(modes, func(a, b string) int { return modeOrder(a) - modeOrder(b) })
	for _, st := range setups {
		var own []xdpbench.Sample
		sum := SetupSummary{Setup: st}
		for _, s := range r.Samples {
			if s.Setup == st {
				own = append(own, s.Sample)
			}
		}
		sum.Rows, sum.Ratios = xdpbench.Summarize(own)
		for _, fk := range floods {
			for _, mode := range modes {
				if row, ok := r.guestRow(st, fk, mode); ok {
					sum.Guest = append(sum.Guest, row)
				}
			}
			same := func(k key) bool { return k.setup == st && k.flood == fk.flood && k.rate == fk.rate }
			q := GuestRatio{Flood: fk.flood, Rate: fk.rate,
				XDP:          ix.ratio(same, ix.modesOf(engine.ModeXDP, engine.ModeBPF), Sample.KernelNsPerDrop),
				Floor:        ix.ratio(same, ix.modesOf(xdpbench.ModeFloor, engine.ModeBPF), Sample.KernelNsPerDrop),
				XDPOverFloor: ix.ratio(same, ix.modesOf(engine.ModeXDP, xdpbench.ModeFloor), Sample.KernelNsPerDrop),
				XDPBusy:      ix.ratio(same, ix.modesOf(engine.ModeXDP, engine.ModeBPF), Sample.BusyNsPerDrop),
				FloorBusy:    ix.ratio(same, ix.modesOf(xdpbench.ModeFloor, engine.ModeBPF), Sample.BusyNsPerDrop),
				Dropped:      ix.ratio(same, ix.modesOf(engine.ModeXDP, engine.ModeBPF), Sample.DroppedPPS),
			}
			if q.XDP == 0 {
				continue
			}
			if row, ok := r.guestRow(st, fk, engine.ModeXDP); ok {
				q.LegitXDP = row.Legit
			}
			q.Judged = r.Accel == AccelKVM
			q.Met = q.Judged && q.Outcome()
			sum.GuestRatios = append(sum.GuestRatios, q)
		}
		r.Setups = append(r.Setups, sum)
	}
	// Scaling: each setup against the one of the same vCPUs with the
	// fewest queues.
	for _, to := range setups {
		from := to
		for _, s := range setups {
			if s.CPUs == to.CPUs && s.Queues < from.Queues {
				from = s
			}
		}
		if from == to {
			continue
		}
		for _, fk := range floods {
			for _, mode := range modes {
				a, okA := r.guestRow(from, fk, mode)
				b, okB := r.guestRow(to, fk, mode)
				if !okA || !okB {
					continue
				}
				match := func(k key) bool { return k.setup == to && k.flood == fk.flood && k.rate == fk.rate }
				pick := func(k key) (Sample, Sample, bool) {
					sb, okB := ix[k][mode]
					sa, okA := ix[key{from, k.flood, k.rate, k.rep}][mode]
					return sb, sa, okA && okB
				}
				r.Scaling = append(r.Scaling, Scaling{CPUs: to.CPUs, Flood: fk.flood, Rate: fk.rate, Mode: mode,
					From: from.Queues, To: to.Queues, FromPPS: a.DroppedPPS, ToPPS: b.DroppedPPS,
					FromBusy: a.BusyPct / 100, ToBusy: b.BusyPct / 100, Ratio: ix.ratio(match, pick, Sample.DroppedPPS)})
			}
		}
	}
}

// modeOrder sorts the modes as xdpbench does: the socket filter, the XDP
// program, the floor, then any other.
func modeOrder(mode string) int {
	if i := slices.Index(append(slices.Clone(xdpbench.Modes), xdpbench.ModeFloor), mode); i >= 0 {
		return i
	}
	return 99
}

// guestRow is the medians of the samples of st, the flood and rate of fk,
// and mode.
func (r *Report) guestRow(st Setup, fk key, mode string) (GuestRow, bool) {
	var sent, recv, dropped, kernel, busy, kns, bns, dps, legit []float64
	var attach []string
	for _, s := range r.Samples {
		if s.Setup != st || s.Flood != fk.flood || s.Rate != fk.rate || s.Mode != mode || s.Seconds <= 0 || s.GuestSeconds <= 0 {
			continue
		}
		sent, recv, dropped = append(sent, s.SentPPS()), append(recv, s.ReceivedPPS()), append(dropped, s.DroppedPPS())
		kernel, busy = append(kernel, 100*s.Guest.Kernel()/s.GuestSeconds), append(busy, 100*s.Guest.Busy()/s.GuestSeconds)
		kns, bns, dps = append(kns, s.KernelNsPerDrop()), append(bns, s.BusyNsPerDrop()), append(dps, s.DropsPerCPUSecond())
		legit = append(legit, s.LegitShare())
		if !slices.Contains(attach, s.Attach) {
			attach = append(attach, s.Attach)
		}
	}
	if len(sent) == 0 {
		return GuestRow{}, false
	}
	m := testutil.Median[float64]
	return GuestRow{Flood: fk.flood, Rate: fk.rate, Mode: mode, Attach: strings.Join(attach, ", "), SentPPS: m(sent),
		ReceivedPPS: m(recv), DroppedPPS: m(dropped), KernelPct: m(kernel), BusyPct: m(busy), KernelNsPerDrop: m(kns),
		BusyNsPerDrop: m(bns), DropsPerCPUSecond: m(dps), Legit: m(legit)}, true
}

// ratioCell is a ratio for a table: "-" when not measured.
func ratioCell(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// Markdown is the report as results.md.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The socket filter against the XDP program on virtio-net\n\n")
	fmt.Fprintf(&b, "Host: %s; QEMU with %s", r.Host, r.Accel)
	if r.Accel == AccelTCG {
		fmt.Fprintf(&b, " (the emulator: the guest's CPU is emulated, so its CPU per packet says nothing of a real CPU's; "+
			"these figures only show that the harness works)")
	}
	for i, g := range r.Guests {
		if i == 0 {
			fmt.Fprintf(&b, ". Guests: ")
		} else {
			fmt.Fprintf(&b, "; ")
		}
		fmt.Fprintf(&b, "Linux %s, %d vCPU%s (%s), NIC %s with %d queue pair%s", g.Kernel, g.CPUs, plural(g.CPUs), g.CPUModel,
			g.Driver, g.MaxQueuePairs, plural(g.MaxQueuePairs))
	}
	sender := "XDP frames redirected into the tap (BPF_PROG_TEST_RUN, live frames)"
	if r.Options.Sender == xdpbench.SenderSocket {
		sender = "UDP sockets (sendmmsg) through the tap"
	}
	fmt.Fprintf(&b, ". %d repetitions of %v floods from the host, %s, %d sender%s; modes interleaved; medians.\n",
		r.Options.Reps, r.Options.For, sender, r.Options.Senders, plural(r.Options.Senders))
	for _, st := range r.Setups {
		fmt.Fprintf(&b, "\n## %s\n\n", st.Setup.Name())
		fmt.Fprintf(&b, "| flood | rate | mode | XDP on the NIC | sent/s | received/s | dropped/s | guest kernel CPU | guest busy CPU "+
			"| kernel CPU per drop | busy CPU per drop | drops per busy CPU-second | legit requests |\n")
		fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, row := range st.Guest {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f | %.0f | %.0f | %.1f%% | %.1f%% | %.0f ns | %.0f ns | %.0f | %.1f%% |\n",
				row.Flood, rateName(row.Rate), row.Mode, row.Attach, row.SentPPS, row.ReceivedPPS, row.DroppedPPS, row.KernelPct,
				row.BusyPct, row.KernelNsPerDrop, row.BusyNsPerDrop, row.DropsPerCPUSecond, 100*row.Legit)
		}
		if len(st.GuestRatios) > 0 {
			fmt.Fprintf(&b, "\nPer dropped datagram, medians of the per-repetition ratios (kernel CPU; busy CPU in the last two):\n\n")
			fmt.Fprintf(&b, "| flood | rate | xdp / bpf | %[1]s / bpf | xdp / %[1]s | dropped/s xdp / bpf | xdp / bpf, busy | %[1]s / bpf, busy | outcome |\n", xdpbench.ModeFloor)
			fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|\n")
			for _, q := range st.GuestRatios {
				met := "not met"
				switch {
				case !q.Judged:
					met = "not judged (emulated)"
				case q.Met:
					met = "met"
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", q.Flood, rateName(q.Rate), ratioCell(q.XDP),
					ratioCell(q.Floor), ratioCell(q.XDPOverFloor), ratioCell(q.Dropped), ratioCell(q.XDPBusy), ratioCell(q.FloorBusy), met)
			}
		}
		fmt.Fprintf(&b, "\nAs the veth's benchmark counts (xdpbench: the guest's softirq time and Caddy's CPU):\n\n")
		xdpbench.WriteTables(&b, st.Rows, st.Ratios)
	}
	if len(r.Scaling) > 0 {
		fmt.Fprintf(&b, "\n## Queues\n\n| vCPUs | flood | rate | mode | queues | dropped/s | queues | dropped/s | ratio | busy vCPUs |\n")
		fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Scaling {
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %d | %.0f | %d | %.0f | %.2f | %.2f, %.2f |\n", s.CPUs, s.Flood, rateName(s.Rate), s.Mode,
				s.From, s.FromPPS, s.To, s.ToPPS, s.Ratio, s.FromBusy, s.ToBusy)
		}
	}
	fmt.Fprintf(&b, "\nSent: what the sender handed the tap; received: what the guest's NIC received (its driver's rx_packets), "+
		"after the tap's queue dropped what QEMU's reader did not take in time; dropped: what the limiter dropped "+
		"(for %s, the frames its program saw). Guest kernel CPU: softirq (the NIC's receive path, the XDP program and the "+
		"socket filter among it), system and hard interrupt time of every vCPU, from the guest's /proc/stat; busy adds user "+
		"time (Caddy's); shares of one vCPU over the window on the guest's clock. Outcome: CPU per dropped datagram with XDP at most 1/5 of the socket filter's, "+
		"or within 1.5x of the floor, and the legit client (a new QUIC connection every 100 ms) at 99%% or more in mode xdp.\n",
		xdpbench.ModeFloor)
	return b.String()
}

// write writes results.md and results.json into dir.
func (r *Report) write(dir string) error {
	return xdpbench.WriteResults(dir, r, r.Markdown())
}
