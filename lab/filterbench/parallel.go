package filterbench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultParallel are the cases timed on all CPUs by default: the two
// whose every packet touches the same cells, a new source on every run
// dropped at the socket's total (this filter's benchmark entry) and one
// source dropped at the first node over its limit.
var DefaultParallel = []string{"ipv4-random-switch", "ipv4-over"}

// repeatedKeys returns the keys of the cases that repeat one frame, the
// only ones -parallel takes.
func repeatedKeys() []string {
	var keys []string
	for _, c := range cases() {
		if !c.once {
			keys = append(keys, c.key)
		}
	}
	return keys
}

// validateParallel reports the first bad key of -parallel: unknown, or a
// case that runs distinct frames once each. A key left out by Cases is
// not run (ParseFlags refuses one given on the command line).
func (o *Options) validateParallel() error {
	known := CaseKeys()
	repeated := repeatedKeys()
	for _, k := range o.Parallel {
		switch {
		case !slices.Contains(known, k):
			return fmt.Errorf("-parallel %q: unknown case; the cases are %s", k, strings.Join(known, ","))
		case !slices.Contains(repeated, k):
			return fmt.Errorf("-parallel %q: runs distinct frames once each; the cases that repeat one frame are %s", k, strings.Join(repeated, ","))
		}
	}
	return nil
}

// together runs run once on each of cpus, each on its own OS thread that
// pin has pinned to that CPU, all released at once behind a barrier when
// every thread is pinned. It returns the wall time, by now, from that
// common start (taken by the last thread to reach the barrier) to the last
// thread's end. When a pin fails, no run starts, and together returns the
// errors.
//
// The threads wait at the barrier spinning on their own CPU, not asleep:
// waking a sleeping thread takes longer than a short run, and would count
// in the time of one CPU more than in that of all. A thread stays locked
// to its goroutine, which exits: Go then ends the thread, so that no thread
// of the runtime keeps an affinity of one CPU.
func together(cpus []int, pin func(cpu int) error, run func(i, cpu int) error, now func() time.Time) (time.Duration, error) {
	if len(cpus) == 0 {
		return 0, errors.New("no CPU to run on")
	}
	var (
		done             sync.WaitGroup
		arrived          atomic.Int64
		released, failed atomic.Bool
		start            time.Time // written before released is set
		errs             = make([]error, len(cpus))
		ends             = make([]time.Time, len(cpus))
	)
	done.Add(len(cpus))
	for i, cpu := range cpus {
		go func() {
			defer done.Done()
			// Never unlocked: see the doc comment.
			runtime.LockOSThread()
			if errs[i] = pin(cpu); errs[i] != nil {
				failed.Store(true)
			}
			if arrived.Add(1) == int64(len(cpus)) {
				start = now()
				released.Store(true)
			}
			for !released.Load() {
				// Spin: see the doc comment. Go preempts the
				// loop when it must.
			}
			if failed.Load() {
				return
			}
			errs[i] = run(i, cpu)
			ends[i] = now()
		}()
	}
	done.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	last := start
	for _, e := range ends {
		if e.After(last) {
			last = e
		}
	}
	return last.Sub(start), nil
}

// packetsPerSecond is the rate of threads threads running runs packets
// each in wall: NaN without time.
func packetsPerSecond(runs, threads int, wall time.Duration) float64 {
	if wall <= 0 {
		return math.NaN()
	}
	return float64(runs) * float64(threads) / wall.Seconds()
}

// ParallelRow is one program's figures on one case on all CPUs: packets
// per second, each the median over the rounds.
type ParallelRow struct {
	// Key names the case (-parallel), Case describes it.
	Key, Case string
	// Program is the program timed ("this filter", "Cloudflare's", "the
	// floor program").
	Program string
	// One is one thread pinned to one CPU; All one thread pinned to each
	// CPU, started together, their total runs over the wall time from the
	// common start to the last thread's end.
	One, All float64
}

// Ratio is All over One: the number of CPUs where the program scales
// perfectly, 1 where they only take turns. NaN without both.
func (r ParallelRow) Ratio() float64 {
	if math.IsNaN(r.One) || math.IsNaN(r.All) || r.One <= 0 {
		return math.NaN()
	}
	return r.All / r.One
}

// pps formats packets per second in millions, two decimals, or a dash for
// none.
func pps(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.2f Mpps", x/1e6)
}

// parallelHeader is the columns of the table on all CPUs.
func (r *Report) parallelHeader() []string {
	return []string{"case", "program", "one CPU", fmt.Sprintf("all %d CPUs", r.CPUs), "ratio"}
}

func (r ParallelRow) cells() []string {
	return []string{r.Case, r.Program, pps(r.One), pps(r.All), ratio(r.Ratio())}
}

// parallelMethod says in one sentence how the figures on all CPUs were
// taken.
func (r *Report) parallelMethod() string {
	return fmt.Sprintf("packets per second of one frame repeated %s times per thread, on one thread pinned to one CPU "+
		"and on one thread pinned to each of the %d CPUs, started together (total runs over the wall time from the common start "+
		"to the last thread's end); medians of %d interleaved rounds; the ratio is all CPUs over one",
		thousands(r.Repeat), r.CPUs, r.Rounds)
}

// writeParallelText writes the table on all CPUs, or the line saying why
// there is none, after the main table; w is the main table's tabwriter
// (the blank line starts new columns).
func (r *Report) writeParallelText(w io.Writer) {
	switch {
	case r.ParallelSkipped != "":
		fmt.Fprintf(w, "\nOn all CPUs: skipped: %s\n", r.ParallelSkipped)
		return
	case len(r.Parallel) == 0:
		return
	}
	fmt.Fprintf(w, "\nOn all CPUs (%d): %s\n", r.CPUs, r.parallelMethod())
	fmt.Fprintln(w, strings.Join(r.parallelHeader(), "\t"))
	for _, row := range r.Parallel {
		fmt.Fprintln(w, strings.Join(row.cells(), "\t"))
	}
}

// parallelMarkdown returns the section on all CPUs, empty without one.
func (r *Report) parallelMarkdown() string {
	var b strings.Builder
	switch {
	case r.ParallelSkipped != "":
		fmt.Fprintf(&b, "\n## On all CPUs\n\nSkipped: %s.\n", strings.TrimSuffix(r.ParallelSkipped, "."))
	case len(r.Parallel) > 0:
		fmt.Fprintf(&b, "\n## On all CPUs (%d)\n\n", r.CPUs)
		b.WriteString(strings.ToUpper(r.parallelMethod()[:1]) + r.parallelMethod()[1:] +
			": a program whose packets share no cache line across CPUs reaches the number of CPUs. " +
			"The programs keep their maps between the runs on one CPU and on all, as in the table above. " +
			"The floor program shares nothing: its ratio far from the number of CPUs says that other work shared them.\n\n")
		h := r.parallelHeader()
		b.WriteString("| " + strings.Join(h, " | ") + " |\n")
		b.WriteString("|---|---|---:|---:|---:|\n")
		for _, row := range r.Parallel {
			b.WriteString("| " + strings.Join(row.cells(), " | ") + " |\n")
		}
	}
	return b.String()
}
