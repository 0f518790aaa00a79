//go:build linux

package virtiobench

import (
	"strings"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// fakeSample is a sample of 2 s on a guest of 2 vCPUs whose kernel spent
// kernel seconds and user space 0.2 s dropping dropped datagrams.
func fakeSample(setup Setup, mode string, rep int, kernel float64, dropped uint64) Sample {
	guest := Times{Softirq: kernel * 0.75, System: kernel * 0.25, User: 0.2}
	guest.Idle = 4 - guest.Busy()
	half := Times{Softirq: guest.Softirq / 2, System: guest.System / 2, User: 0.1, Idle: guest.Idle / 2}
	return Sample{Sample: xdpbench.Sample{Mode: mode, Flood: xdpbench.FloodInitial, Rep: rep, Seconds: 2, Sent: 4_000_000,
		Dropped: dropped, SoftirqSeconds: guest.Softirq, CaddySeconds: 0.2, LegitOK: 20, LegitTotal: 20},
		Setup: setup, Attach: "xdp", Guest: guest, PerCPU: []Times{half, half}, Received: dropped + 1000, GuestSeconds: 2}
}

// TestSummarize: per setup, the guest's medians and the medians of the
// per-repetition ratios (and xdpbench's view of the same samples); the
// outcome judged only under KVM; the drops of more queues against fewer.
func TestSummarize(t *testing.T) {
	one, two := Setup{2, 1}, Setup{2, 2}
	var samples []Sample
	for _, st := range []Setup{one, two} {
		scale := uint64(st.Queues)
		for rep, k := range []struct{ bpf, xdp, floor float64 }{{1, 0.2, 0.1}, {1, 0.2, 0.1}, {2, 0.6, 0.2}} {
			samples = append(samples, fakeSample(st, engine.ModeBPF, rep+1, k.bpf, scale*1_000_000),
				fakeSample(st, engine.ModeXDP, rep+1, k.xdp, scale*2_000_000),
				fakeSample(st, xdpbench.ModeFloor, rep+1, k.floor, scale*2_000_000))
		}
	}
	samples[1].LegitOK = 19 // one repetition of mode xdp under 99%
	for _, accel := range []string{AccelKVM, AccelTCG} {
		r := &Report{Accel: accel, Options: Options{Reps: 3}, Samples: samples}
		r.summarize()
		if len(r.Setups) != 2 || r.Setups[0].Setup != one || len(r.Setups[0].Guest) != 3 || r.Setups[0].Guest[0].Mode != engine.ModeBPF ||
			r.Setups[0].Guest[2].Mode != xdpbench.ModeFloor {
			t.Fatalf("%s: setups %+v", accel, r.Setups)
		}
		// Setup 2/1, mode bpf: 1000, 1000 and 2000 ns of kernel CPU per
		// drop; busy 1.2 s of 2 s over 1M drops.
		row := r.Setups[0].Guest[0]
		if !near(row.KernelNsPerDrop, 1000) || !near(row.BusyNsPerDrop, 1200) || !near(row.DroppedPPS, 500_000) ||
			!near(row.KernelPct, 50) || !near(row.BusyPct, 60) || !near(row.DropsPerCPUSecond, 1e6/1.2) || row.Attach != "xdp" {
			t.Errorf("%s: bpf's row %+v", accel, row)
		}
		// Per repetition, xdp / bpf 0.1, 0.1, 0.15; floor / bpf 0.05;
		// xdp / floor 2, 2, 3; dropped 2.
		q := r.Setups[0].GuestRatios[0]
		if !near(q.XDP, 0.1) || !near(q.Floor, 0.05) || !near(q.XDPOverFloor, 2) || !near(q.Dropped, 2) || !near(q.LegitXDP, 1) {
			t.Errorf("%s: ratios %+v", accel, q)
		}
		if q.Judged != (accel == AccelKVM) || q.Met != (accel == AccelKVM) {
			t.Errorf("%s: judged %v, met %v", accel, q.Judged, q.Met)
		}
		if len(r.Setups[0].Rows) != 3 || len(r.Setups[0].Ratios) != 1 {
			t.Errorf("%s: xdpbench's view %+v", accel, r.Setups[0])
		}
		if len(r.Scaling) != 3 || r.Scaling[1].Mode != engine.ModeXDP || r.Scaling[1].From != 1 || r.Scaling[1].To != 2 ||
			!near(r.Scaling[1].Ratio, 2) || !near(r.Scaling[1].ToPPS, 2_000_000) {
			t.Errorf("%s: scaling %+v", accel, r.Scaling)
		}
		md := r.Markdown()
		outcome := "| initial | max | 0.10 | 0.05 | 2.00 | 2.00 | 0.17 | 0.13 | met |"
		if accel == AccelTCG {
			outcome = "| not judged (emulated) |"
		}
		for _, want := range []string{"## 2 vCPUs, 1 queue\n", "## 2 vCPUs, 2 queues\n",
			"| initial | max | bpf | xdp | 2000000 | 500500 | 500000 | 50.0% | 60.0% | 1000 ns | 1200 ns | 833333 | 100.0% |",
			outcome, "| 2 | initial | max | xdp | 1 | 1000000 | 2 | 2000000 | 2.00 | 0.20, 0.20 |"} {
			if !strings.Contains(md, want) {
				t.Errorf("%s: results.md lacks %q:\n%s", accel, want, md)
			}
		}
	}
	// The outcome: 1/5 of the socket filter, or 1.5x the floor; the legit
	// client at 99%.
	for _, c := range []struct {
		q    GuestRatio
		want bool
	}{
		{GuestRatio{XDP: 0.2, XDPOverFloor: 3, LegitXDP: 0.99}, true},
		{GuestRatio{XDP: 0.4, XDPOverFloor: 1.5, LegitXDP: 1}, true},
		{GuestRatio{XDP: 0.4, XDPOverFloor: 1.6, LegitXDP: 1}, false},
		{GuestRatio{XDP: 0.4, LegitXDP: 1}, false},
		{GuestRatio{XDP: 0.1, XDPOverFloor: 1, LegitXDP: 0.98}, false},
	} {
		if got := c.q.Outcome(); got != c.want {
			t.Errorf("%+v: outcome %v, want %v", c.q, got, c.want)
		}
	}
}
