//go:build linux

package filterbench

import (
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
