package filterbench

import (
	"bytes"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock that the fake runners move: each sets it to at
// least the base plus its own duration, so the latest end is the base plus
// the longest duration, whatever the order the threads ran in.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) read() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) reach(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

func TestTogether(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	for _, tt := range []struct {
		name      string
		durations []time.Duration // one per CPU
		want      time.Duration
	}{
		{"one CPU", []time.Duration{3 * time.Millisecond}, 3 * time.Millisecond},
		{"the last to end decides", []time.Duration{3 * time.Millisecond, 7 * time.Millisecond, 5 * time.Millisecond}, 7 * time.Millisecond},
		{"equal", []time.Duration{time.Second, time.Second}, time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{now: base}
			cpus := make([]int, len(tt.durations))
			for i := range cpus {
				cpus[i] = 10 + i
			}
			var ran [8]atomic.Int32
			wall, err := together(cpus, func(int) error { return nil }, func(i, cpu int) error {
				if cpu != cpus[i] {
					t.Errorf("thread %d ran on CPU %d, want %d", i, cpu, cpus[i])
				}
				ran[i].Add(1)
				clock.reach(base.Add(tt.durations[i]))
				return nil
			}, clock.read)
			if err != nil {
				t.Fatal(err)
			}
			if wall != tt.want {
				t.Errorf("wall %v, want %v", wall, tt.want)
			}
			for i := range cpus {
				if n := ran[i].Load(); n != 1 {
					t.Errorf("thread %d ran %d times, want once", i, n)
				}
			}
		})
	}
}

// TestTogetherBarrier checks that no thread runs before every thread is
// pinned, with a pin that is late by far more than a thread takes to
// start.
func TestTogetherBarrier(t *testing.T) {
	var pinned atomic.Int32
	var early atomic.Int32
	cpus := []int{0, 1}
	_, err := together(cpus, func(cpu int) error {
		if cpu == 1 {
			time.Sleep(50 * time.Millisecond)
		}
		pinned.Add(1)
		return nil
	}, func(int, int) error {
		if pinned.Load() != int32(len(cpus)) {
			early.Add(1)
		}
		return nil
	}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if n := early.Load(); n != 0 {
		t.Errorf("%d threads ran before every thread was pinned", n)
	}
}

func TestTogetherErrors(t *testing.T) {
	errPin := errors.New("pin refused")
	errRun := errors.New("run failed")
	var ran atomic.Int32
	_, err := together([]int{0, 1, 2}, func(cpu int) error {
		if cpu == 2 {
			return errPin
		}
		return nil
	}, func(int, int) error { ran.Add(1); return nil }, time.Now)
	if !errors.Is(err, errPin) {
		t.Errorf("a failed pin: %v, want %v", err, errPin)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("%d threads ran after a pin failed, want none", n)
	}
	_, err = together([]int{0, 1}, func(int) error { return nil }, func(i, _ int) error {
		if i == 1 {
			return errRun
		}
		return nil
	}, time.Now)
	if !errors.Is(err, errRun) {
		t.Errorf("a failed run: %v, want %v", err, errRun)
	}
	if _, err := together(nil, nil, nil, time.Now); err == nil {
		t.Error("no CPU: no error")
	}
}

func TestPacketsPerSecond(t *testing.T) {
	for _, tt := range []struct {
		name          string
		runs, threads int
		wall          time.Duration
		want          float64
	}{
		{"one thread", 200_000, 1, 50 * time.Millisecond, 4e6},
		{"two threads, same wall: twice", 200_000, 2, 50 * time.Millisecond, 8e6},
		{"two threads taking turns: the same", 200_000, 2, 100 * time.Millisecond, 4e6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := packetsPerSecond(tt.runs, tt.threads, tt.wall); math.Abs(got-tt.want) > 1e-6*tt.want {
				t.Errorf("packetsPerSecond = %v, want %v", got, tt.want)
			}
		})
	}
	if got := packetsPerSecond(1, 1, 0); !math.IsNaN(got) {
		t.Errorf("no time: %v, want NaN", got)
	}
	for _, tt := range []struct {
		row  ParallelRow
		want string
	}{
		{ParallelRow{One: 4e6, All: 7.4e6}, "1.85"},
		{ParallelRow{One: 2e6, All: 1.2e6}, "0.60"},
		{ParallelRow{One: math.NaN(), All: 1}, "—"},
		{ParallelRow{One: 0, All: 1}, "—"},
	} {
		if got := ratio(tt.row.Ratio()); got != tt.want {
			t.Errorf("ratio of %+v = %q, want %q", tt.row, got, tt.want)
		}
	}
	if got := pps(6.1234e6); got != "6.12 Mpps" {
		t.Errorf("pps = %q", got)
	}
}

func TestParseFlagsParallel(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"default", nil, DefaultParallel},
		{"the default narrowed to -cases", []string{"-cases", "ipv4-under,ipv4-over"}, []string{"ipv4-over"}},
		{"the default, none of -cases", []string{"-cases", "ipv4-under"}, []string{}},
		{"given", []string{"-parallel", "ipv4-under,established-over"}, []string{"ipv4-under", "established-over"}},
		{"given among -cases", []string{"-cases", "ipv4-under", "-parallel", "ipv4-under"}, []string{"ipv4-under"}},
		{"none", []string{"-parallel", "none"}, nil},
		{"empty", []string{"-parallel", ""}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseFlags(tt.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if len(o.Parallel) != len(tt.want) || len(tt.want) > 0 && !slices.Equal(o.Parallel, tt.want) {
				t.Errorf("Parallel %q, want %q", o.Parallel, tt.want)
			}
		})
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-parallel", "nope"}, `-parallel "nope": unknown case`},
		{[]string{"-parallel", "ipv4-over,ipv4-random"}, `-parallel "ipv4-random": runs distinct frames once each`},
		{[]string{"-cases", "ipv4-under", "-parallel", "ipv4-over"}, `-parallel "ipv4-over": not among -cases`},
	} {
		_, err := ParseFlags(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseFlags(%q) = %v, want a one-line error containing %q", tt.args, err, tt.want)
		}
	}
	// Every default is a case that repeats one frame.
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

func parallelReport() *Report {
	r := testReport()
	r.CPUs = 2
	r.Parallel = []ParallelRow{
		{Key: "ipv4-over", Case: "one source, flooding over it", Program: "this filter", One: 4e6, All: 7.4e6},
		{Key: "ipv4-over", Case: "one source, flooding over it", Program: "Cloudflare's", One: 5e6, All: math.NaN()},
	}
	return r
}

func TestParallelMarkdown(t *testing.T) {
	md := parallelReport().Markdown()
	for _, want := range []string{
		"## On all CPUs (2)",
		"one thread pinned to each of the 2 CPUs",
		"| case | program | one CPU | all 2 CPUs | ratio |",
		"| one source, flooding over it | this filter | 4.00 Mpps | 7.40 Mpps | 1.85 |",
		"| one source, flooding over it | Cloudflare's | 5.00 Mpps | — | — |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the Markdown lacks %q:\n%s", want, md)
		}
	}
	// The main table comes first, and both tables are whole.
	if strings.Index(md, "| case | this filter |") > strings.Index(md, "| case | program |") {
		t.Errorf("the table on all CPUs before the main table:\n%s", md)
	}
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "|") && strings.Count(l, "|") != len(header)+1 {
			t.Errorf("table line with %d separators, want %d: %q", strings.Count(l, "|"), len(header)+1, l)
		}
	}
	// Without the table, no section; skipped, the reason.
	if md := testReport().Markdown(); strings.Contains(md, "On all CPUs") {
		t.Errorf("a section on all CPUs without figures:\n%s", md)
	}
	r := testReport()
	r.ParallelSkipped = "this process runs on one CPU ([0]), so there is nothing to compare one CPU with"
	if md := r.Markdown(); !strings.Contains(md, "## On all CPUs\n\nSkipped: this process runs on one CPU") {
		t.Errorf("the Markdown lacks the reason it skipped the table:\n%s", md)
	}
}

func TestParallelText(t *testing.T) {
	var b bytes.Buffer
	if err := parallelReport().WriteText(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	// The CPU, the header, 3 rows, the new sources' drops, a blank line,
	// the method, the header and 2 rows.
	if len(lines) != 11 || lines[6] != "" || !strings.HasPrefix(lines[7], "On all CPUs (2): ") {
		t.Fatalf("%d lines, want 11 with the table on all CPUs after a blank line:\n%s", len(lines), b.String())
	}
	col := strings.Index(lines[8], "program")
	for _, l := range lines[9:] {
		if col >= len(l) || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("row not aligned at column %d: %q", col, l)
		}
	}
	if !strings.Contains(lines[9], "1.85") {
		t.Errorf("row %q lacks the ratio 1.85", lines[9])
	}
	r := testReport()
	r.ParallelSkipped = "one CPU"
	b.Reset()
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(b.String(), "\nOn all CPUs: skipped: one CPU\n") {
		t.Errorf("the text lacks the reason it skipped the table:\n%s", b.String())
	}
}
