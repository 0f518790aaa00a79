//go:build linux

package xdpbench

import (
	"strings"
	"testing"
	"time"
)

// TestSummarize: the rows are medians per mode, flood and rate, and the
// ratios medians of the per-repetition ratios of xdp (and of the floor) to
// bpf.
func TestSummarize(t *testing.T) {
	s := func(mode string, rep int, softirq float64, dropped uint64, ok int) Sample {
		return Sample{Mode: mode, Flood: FloodInitial, Rep: rep, Seconds: 2, Sent: 2 * int(dropped), Dropped: dropped,
			Passed: uint64(rep) * 1000, SoftirqSeconds: softirq, CaddySeconds: 0.1, LegitOK: ok, LegitTotal: 20}
	}
	r := &Report{Options: Options{Reps: 3, For: 2 * time.Second}, Samples: []Sample{
		s("bpf", 1, 1.9, 1_000_000, 10), s("xdp", 1, 0.1, 1_000_000, 20),
		s("xdp", 2, 0.3, 2_000_000, 20), s("bpf", 2, 1.9, 1_000_000, 12),
		s("bpf", 3, 3.9, 1_000_000, 14), s("xdp", 3, 0.9, 2_000_000, 19),
		s(ModeFloor, 1, 0.1, 2_000_000, 0), s(ModeFloor, 2, 0.1, 2_000_000, 0), s(ModeFloor, 3, 0.3, 2_000_000, 0),
	}}
	r.summarize()
	if len(r.Rows) != 3 || r.Rows[0].Mode != "bpf" || r.Rows[1].Mode != "xdp" || r.Rows[2].Mode != ModeFloor {
		t.Fatalf("rows %+v, want bpf, xdp, then %s", r.Rows, ModeFloor)
	}
	// bpf: 2000, 2000, 4000 ns per drop; xdp: 200, 200, 500.
	if got := r.Rows[0].NsPerDrop; got != 2000 {
		t.Errorf("bpf ns per drop %v, want the median 2000", got)
	}
	if got := r.Rows[1].NsPerDrop; got != 200 {
		t.Errorf("xdp ns per drop %v, want the median 200", got)
	}
	if got := r.Rows[0].Legit; got != 0.6 {
		t.Errorf("bpf legit %v, want the median 0.6", got)
	}
	// Per repetition: 200/2000, 200/2000, 500/4000.
	// The floor: 100/2000, 100/2000, 200/4000.
	if len(r.Ratios) != 1 || r.Ratios[0].NsPerDrop != 0.1 || r.Ratios[0].SentPPS != 2 || r.Ratios[0].FloorNsPerDrop != 0.05 {
		t.Fatalf("ratios %+v, want ns per drop 0.1, sent 2 and the floor's 0.05 (medians of the repetitions')", r.Ratios)
	}
	md := r.Markdown()
	for _, want := range []string{"| initial | max | bpf | 1000000 | 500000 | 1000 | 95.0% | 5.0% | 2000 ns | 60.0% |", "| initial | max | 0.10 | 2.00 | 0.05 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
}

// TestParseFlags: the defaults, and each bad value refused.
func TestParseFlags(t *testing.T) {
	o, err := ParseFlags(nil, new(strings.Builder))
	if err != nil || o.Reps != 3 || len(o.Floods) != 2 || len(o.Rates) != 1 || o.Rates[0] != 0 || !o.Floor ||
		len(o.modes()) != 3 || o.modes()[2] != ModeFloor {
		t.Fatalf("defaults %+v, %v", o, err)
	}
	for _, args := range [][]string{{"-reps", "0"}, {"-floods", "big"}, {"-rates", "fast"}, {"-rates", "-5"},
		{"-for", "0s"}, {"-senders", "4", "-sources", "2"}, {"extra"}} {
		if _, err := ParseFlags(args, new(strings.Builder)); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
