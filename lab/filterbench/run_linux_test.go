//go:build linux

package filterbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// cloudflareForTest returns a path to Cloudflare's object: the one named by
// RAKELIMIT_CLOUDFLARE_OBJECT (an object, a bpf2go Go file, or a
// directory), else the one fetched into the default cache directory, else
// NoPeer: the Go module proxy refuses Cloudflare's module, so a machine
// without a copy times this filter and the floor alone, and the test
// checks that Cloudflare's column is then empty.
func cloudflareForTest(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RAKELIMIT_CLOUDFLARE_OBJECT"); p != "" {
		return p
	}
	p, err := FetchCloudflare(context.Background(), DefaultOptions().CacheDir, CloudflareVersion)
	if err != nil {
		t.Logf("without Cloudflare's object (set RAKELIMIT_CLOUDFLARE_OBJECT to a copy): %v", err)
		return NoPeer
	}
	return p
}

// TestRun runs every case once, tiny, with both programs: every figure is
// there, Cloudflare's where the case has it, and every check of the
// verdicts passed (Run fails otherwise).
func TestRun(t *testing.T) {
	testutil.RequireRoot(t)
	o := DefaultOptions()
	o.CloudflareObject = cloudflareForTest(t)
	// Batches of new sources big enough to check that both limiters
	// decide a flood.
	o.Rounds, o.Repeat, o.Once, o.Warmup = 2, 2000, floodBatch, 5000
	o.Out = filepath.Join(t.TempDir(), "filter.md")
	rep, err := Run(context.Background(), &o, io.Discard)
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != len(CaseKeys()) {
		t.Fatalf("%d rows, want %d", len(rep.Rows), len(CaseKeys()))
	}
	for i, row := range rep.Rows {
		c := cases()[i]
		if row.Key != c.key {
			t.Errorf("row %d is %s, want %s", i, row.Key, c.key)
		}
		// A case of new sources has the floor's time taken off, which
		// an interrupt can make larger than the filter's; a repeated
		// case's time is positive.
		if math.IsNaN(row.Ours) || !(row.Floor > 0) || !c.once && !(row.Ours > 0) {
			t.Errorf("%s: this filter %v ns, floor %v ns", row.Key, row.Ours, row.Floor)
		}
		peer := c.cloudflareLimit != 0 && o.CloudflareObject != NoPeer
		if hasCF := !math.IsNaN(row.Cloudflare); hasCF != peer {
			t.Errorf("%s: Cloudflare's %v ns, want a figure: %v", row.Key, row.Cloudflare, peer)
		}
		if peer && !c.once && !(row.Ratio() > 0) {
			t.Errorf("%s: ratio %v", row.Key, row.Ratio())
		}
	}
	if rep.CPU == "" || rep.CPU == "unknown" {
		t.Errorf("CPU model %q", rep.CPU)
	}
	md, err := os.ReadFile(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| one source, under the limit |") || !strings.Contains(string(md), rep.CPU) {
		t.Errorf("the Markdown lacks the first case or the CPU:\n%s", md)
	}
}

// TestRunWallClock runs the three cases with the wall clock.
func TestRunWallClock(t *testing.T) {
	testutil.RequireRoot(t)
	o := DefaultOptions()
	o.CloudflareObject = cloudflareForTest(t)
	o.Rounds, o.Repeat, o.Once, o.Warmup = 1, 2000, 50, 5000
	o.Clock, o.Cases = ClockWall, []string{"ipv4-under", "ipv4-over", "ipv4-random"}
	rep, err := Run(context.Background(), &o, io.Discard)
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 3 || rep.Clock != ClockWall {
		t.Fatalf("rows %+v, clock %s", rep.Rows, rep.Clock)
	}
	// A time less the floor's, from the wall clock of a busy machine,
	// may come out below zero; a repeated case's may not.
	peer := o.CloudflareObject != NoPeer
	for _, row := range rep.Rows {
		finite := !math.IsNaN(row.Ours) && !math.IsInf(row.Ours, 0) &&
			(!peer || !math.IsNaN(row.Cloudflare) && !math.IsInf(row.Cloudflare, 0))
		if !finite || row.Key != "ipv4-random" && (!(row.Ours > 0) || peer && !(row.Cloudflare > 0)) {
			t.Errorf("%s: this filter %v ns, Cloudflare's %v ns", row.Key, row.Ours, row.Cloudflare)
		}
	}
}

// TestRunLeadIn times one batch of new sources on a limiter that has seen
// none (no warm-up): without a lead-in, the batch fills the room under the
// shared nodes' limits, a thousand packets that pass; after one, it meets
// the nodes at their limits, as a sustained flood keeps them, and is almost
// all dropped. Each row says what share it dropped.
func TestRunLeadIn(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tt := range []struct {
		name   string
		leadIn int
		// The share of the timed batch this filter dropped is within
		// [least, most].
		least, most float64
	}{
		{"none", 0, 0, 0.6},
		{"default", defaultLeadIn, 0.75, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			o.CloudflareObject = cloudflareForTest(t)
			o.Rounds, o.Once, o.Warmup, o.LeadIn = 1, floodBatch, 0, tt.leadIn
			o.Cases, o.Parallel = []string{"ipv4-random"}, nil
			rep, err := Run(context.Background(), &o, io.Discard)
			testutil.RequireBPF(t, err)
			if err != nil {
				t.Fatal(err)
			}
			row := rep.Rows[0]
			if !row.NewSources || rep.LeadIn != tt.leadIn {
				t.Fatalf("row %+v, lead-in %d", row, rep.LeadIn)
			}
			t.Logf("this filter dropped %.3f of the batch, Cloudflare's %.3f", row.OursDropped, row.CloudflareDropped)
			if !(row.OursDropped >= tt.least && row.OursDropped <= tt.most) {
				t.Errorf("this filter dropped %.3f of the batch, want within [%v, %v]", row.OursDropped, tt.least, tt.most)
			}
			if peer := o.CloudflareObject != NoPeer; peer != !math.IsNaN(row.CloudflareDropped) ||
				peer && !(row.CloudflareDropped > 0 && row.CloudflareDropped <= 1) {
				t.Errorf("Cloudflare's dropped %v of the batch (run: %v)", row.CloudflareDropped, peer)
			}
		})
	}
}

// TestTogetherFloor runs the floor program on one thread pinned to each
// CPU, together: every thread is pinned to its CPU alone when it runs, and
// every run returns the floor's verdict, the packet's length (the frame's
// past its Ethernet header, which BPF_PROG_TEST_RUN takes off).
func TestTogetherFloor(t *testing.T) {
	testutil.RequireRoot(t)
	floor, err := kernel.FloorProgram()
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatal(err)
	}
	defer floor.Close()
	cpus, err := usableCPUs()
	if err != nil {
		t.Fatal(err)
	}
	c := selectCases([]string{"ipv4-over"})[0]
	fr := c.frame()
	rets := make([]uint32, len(cpus))
	wall, err := together(cpus, pinThread, func(i, cpu int) error {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			return err
		}
		if set.Count() != 1 || !set.IsSet(cpu) {
			t.Errorf("thread %d: %d CPUs in its affinity, want CPU %d alone", i, set.Count(), cpu)
		}
		ret, _, err := floor.Benchmark(fr, 1000, nil)
		rets[i] = ret
		return err
	}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if wall <= 0 {
		t.Errorf("wall %v", wall)
	}
	for i, ret := range rets {
		if int(ret) != len(fr)-testutil.EthHdrLen {
			t.Errorf("thread %d: the floor returned %d, want %d", i, ret, len(fr)-testutil.EthHdrLen)
		}
	}
	// The test's own thread kept its affinity.
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	if set.Count() != len(cpus) {
		t.Errorf("this thread may run on %d CPUs after the run, want %d", set.Count(), len(cpus))
	}
}

// TestRunParallel runs the default cases on all CPUs, tiny, with this
// filter and the floor alone: a row per program and case with both rates
// and a ratio, or, with one CPU, the reason there is none.
func TestRunParallel(t *testing.T) {
	testutil.RequireRoot(t)
	o := DefaultOptions()
	o.CloudflareObject = NoPeer
	o.Rounds, o.Repeat, o.Warmup = 2, 2000, 5000
	o.Cases = slices.Concat(DefaultParallel, []string{"ipv4-under"})
	rep, err := Run(context.Background(), &o, io.Discard)
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := usableCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < 2 {
		if len(rep.Parallel) != 0 || rep.ParallelSkipped == "" {
			t.Errorf("one CPU: %d rows on all CPUs, skipped %q; want none and a reason", len(rep.Parallel), rep.ParallelSkipped)
		}
		return
	}
	if rep.CPUs != len(cpus) || rep.ParallelSkipped != "" {
		t.Errorf("CPUs %d, skipped %q; want %d and none", rep.CPUs, rep.ParallelSkipped, len(cpus))
	}
	var got []string
	for _, row := range rep.Parallel {
		got = append(got, row.Key+"/"+row.Program)
		if !(row.One > 0) || !(row.All > 0) || !(row.Ratio() > 0) {
			t.Errorf("%s, %s: one CPU %v, all %v, ratio %v", row.Key, row.Program, row.One, row.All, row.Ratio())
		}
	}
	want := []string{"ipv4-over/this filter", "ipv4-over/the floor program",
		"ipv4-random-switch/this filter", "ipv4-random-switch/the floor program"}
	if !slices.Equal(got, want) {
		t.Errorf("rows on all CPUs %q, want %q (the table's order, not ipv4-under)", got, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), fmt.Sprintf("On all CPUs (%d)", len(cpus))) {
		t.Errorf("the text lacks the table on all CPUs:\n%s", b.String())
	}
}
