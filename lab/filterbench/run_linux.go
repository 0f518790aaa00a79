//go:build linux

package filterbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
)

// The programs of a case, in the order of their samples.
const (
	progOurs = iota
	progCloudflare
	progFloor
	numProgs
)

var progNames = [numProgs]string{"this filter", "Cloudflare's", "the floor program"}

// running is a case during a run: its programs and samples.
type running struct {
	caseSpec
	ours  *kernel.Program
	cf    *cloudflareProgram
	frame []byte
	// progs are the programs timed, nil for one not run.
	progs [numProgs]*ebpf.Program
	// samples are nanoseconds per packet by program, one per round.
	samples [numProgs][]float64
	// onceSent and onceDropped count, by program, the packets from new
	// sources timed and dropped.
	onceSent, onceDropped [numProgs]int
	// par is the case on all CPUs (Options.Parallel).
	par parallelState
}

// floodBatch is the smallest batch of packets from new sources (-once)
// whose dropping none says that a limiter does not decide a flood: twice
// what randomLimit lets through in a window of one second, in a batch that
// runs in a few milliseconds. A smaller batch, rounds apart, may be under
// the limit.
const floodBatch = 2 * randomLimit

// Run measures every case of o and returns the report; it writes the
// Markdown report to o.Out when set, and progress to progress. It needs
// the privileges to load BPF programs (root, or CAP_BPF and CAP_PERFMON).
func Run(ctx context.Context, o *Options, progress io.Writer) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var spec *ebpf.CollectionSpec
	source := "none"
	if o.CloudflareObject != NoPeer {
		obj, from, err := cloudflareObject(ctx, o, progress)
		if err != nil {
			return nil, err
		}
		if spec, err = parseCloudflare(obj); err != nil {
			return nil, err
		}
		source = from
	}
	floor, err := kernel.FloorProgram()
	if err != nil {
		return nil, err
	}
	defer floor.Close()
	var runs []*running
	defer func() {
		for _, r := range runs {
			r.close()
		}
	}()
	cpus, skipped, err := parallelCPUs(o)
	if err != nil {
		return nil, err
	}
	for _, c := range selectCases(o.Cases) {
		r, err := setUp(c, spec, floor)
		if err != nil {
			return nil, fmt.Errorf("case %s: %w", c.key, err)
		}
		r.par.on = len(cpus) > 1 && slices.Contains(o.Parallel, c.key)
		runs = append(runs, r)
	}
	fmt.Fprintf(progress, "warming up %d cases\n", len(runs))
	for _, r := range runs {
		if err := r.warmUp(o); err != nil {
			return nil, fmt.Errorf("case %s: warming up: %w", r.key, err)
		}
		if !r.par.on {
			continue
		}
		if err := r.warmUpParallel(o, cpus); err != nil {
			return nil, fmt.Errorf("case %s: warming up on all CPUs: %w", r.key, err)
		}
	}
	if skipped != "" {
		fmt.Fprintf(progress, "on all CPUs: skipped: %s\n", skipped)
	}
	for round := range o.Rounds {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "round %d/%d\n", round+1, o.Rounds)
		// Every case and program in turn, starting one further each
		// round, so that none is always first or always after another.
		for i := range runs {
			r := runs[(i+round)%len(runs)]
			if err := r.measure(o, round); err != nil {
				return nil, fmt.Errorf("case %s, round %d: %w", r.key, round+1, err)
			}
			if !r.par.on {
				continue
			}
			if err := r.measureParallel(o, round, cpus); err != nil {
				return nil, fmt.Errorf("case %s, round %d on all CPUs: %w", r.key, round+1, err)
			}
		}
	}
	rep := &Report{CPU: cpuModel(), Kernel: kernelRelease(), Cloudflare: source,
		Rounds: o.Rounds, Repeat: o.Repeat, Once: o.Once, LeadIn: o.LeadIn, Clock: o.Clock,
		CPUs: len(cpus), ParallelSkipped: skipped}
	for _, r := range runs {
		if err := r.checkCounters(o); err != nil {
			return nil, fmt.Errorf("case %s: %w", r.key, err)
		}
		rep.Rows = append(rep.Rows, r.row())
		if r.par.on {
			rep.Parallel = append(rep.Parallel, r.parallelRows()...)
		}
	}
	if o.Out != "" {
		if err := os.WriteFile(o.Out, []byte(rep.Markdown()), 0o644); err != nil {
			return nil, fmt.Errorf("writing the report: %w", err)
		}
	}
	return rep, nil
}

// parallelCPUs returns the CPUs of the cases on all CPUs, none when
// o.Parallel is empty; with one CPU, none and the reason.
func parallelCPUs(o *Options) (cpus []int, skipped string, err error) {
	if len(o.Parallel) == 0 {
		return nil, "", nil
	}
	if cpus, err = usableCPUs(); err != nil {
		return nil, "", err
	}
	if len(cpus) < 2 {
		return nil, fmt.Sprintf("this process runs on one CPU (%v), so there is nothing to compare one CPU with", cpus), nil
	}
	return cpus, "", nil
}

// cloudflareObject reads Cloudflare's object from o.CloudflareObject, or
// fetches it, and says where it came from.
func cloudflareObject(ctx context.Context, o *Options, progress io.Writer) ([]byte, string, error) {
	path, source := o.CloudflareObject, ""
	if path == "" {
		fmt.Fprintf(progress, "fetching %s@%s (kept in %s)\n", CloudflareModule, o.CloudflareVersion, o.CacheDir)
		var err error
		if path, err = FetchCloudflare(ctx, o.CacheDir, o.CloudflareVersion); err != nil {
			return nil, "", fmt.Errorf("fetching Cloudflare's object (give one with -cloudflare): %w", err)
		}
		source = CloudflareModule + "@" + o.CloudflareVersion
	}
	obj, err := ReadObject(path)
	if err != nil {
		return nil, "", err
	}
	if source == "" {
		source = CloudflareModule + " from " + path
	}
	return obj, source, nil
}

// setUp loads a case's programs.
func setUp(c caseSpec, spec *ebpf.CollectionSpec, floor *ebpf.Program) (_ *running, err error) {
	r := &running{caseSpec: c, frame: c.frame()}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.ours, err = kernel.LoadBench(c.ours, kernel.BenchOptions{RandomSource: c.randomSource}); err != nil {
		return nil, fmt.Errorf("loading this filter: %w", err)
	}
	if c.learn || c.prove {
		src, _ := c.addresses()
		if err := r.ours.LearnServerID(serverID, src); err != nil {
			return nil, err
		}
		if err := r.ours.LearnPeer(src); err != nil {
			return nil, err
		}
		if c.prove {
			if err := r.ours.ProveForBench(src); err != nil {
				return nil, err
			}
		}
	}
	r.progs[progOurs] = r.ours.Program()
	if c.cloudflareLimit != 0 && spec != nil {
		if r.cf, err = loadCloudflare(spec, c.ipv6, c.cloudflareLimit); err != nil {
			return nil, err
		}
		r.progs[progCloudflare] = r.cf.prog
	}
	r.progs[progFloor] = floor
	return r, nil
}

func (r *running) close() {
	if r.ours != nil {
		r.ours.Close()
	}
	if r.cf != nil {
		r.cf.Close()
	}
}

// warmUp runs o.Warmup packets through each limiter, so that a flood is over
// its limit before it is timed.
func (r *running) warmUp(o *Options) error {
	if o.Warmup == 0 {
		return nil
	}
	for p, prog := range r.progs[:progFloor] {
		if prog == nil {
			continue
		}
		if r.once {
			// A new source on every packet: each of distinct frames
			// once, fewer (a system call each), enough to push the
			// shared nodes over their limit.
			rng := rand.New(rand.NewPCG(uint64(len(r.key)), math.MaxUint32))
			if _, _, err := runOnce(prog, randomFrames(r.frame, r.ipv6, r.randomPort, min(o.Warmup, floodBatch), rng), o.Clock); err != nil {
				return fmt.Errorf("%s: %w", progNames[p], err)
			}
			continue
		}
		if _, _, err := prog.Benchmark(r.frame, o.Warmup, nil); err != nil {
			return fmt.Errorf("%s: %w", progNames[p], err)
		}
	}
	return nil
}

// measure takes one round's sample of every program of the case, in an
// order that moves with the round.
func (r *running) measure(o *Options, round int) error {
	var frames, leadIn [][]byte
	if r.once {
		// New sources every round: no source is seen twice. The lead-in's
		// are drawn after the timed frames, which stay those of a run
		// without one.
		rng := rand.New(rand.NewPCG(uint64(round), uint64(len(r.key))<<32|uint64(r.ipv6Bit())))
		frames = randomFrames(r.frame, r.ipv6, r.randomPort, o.Once, rng)
		leadIn = randomFrames(r.frame, r.ipv6, r.randomPort, o.LeadIn, rng)
	}
	var ns [numProgs]float64
	for i := range numProgs {
		p := (i + round) % numProgs
		prog := r.progs[p]
		if prog == nil {
			continue
		}
		if r.once {
			// The floor program keeps no state to lead in.
			if p != progFloor && len(leadIn) > 0 {
				if _, _, err := runOnce(prog, leadIn, o.Clock); err != nil {
					return fmt.Errorf("%s: lead-in: %w", progNames[p], err)
				}
			}
			t, drops, err := runOnce(prog, frames, o.Clock)
			if err != nil {
				return fmt.Errorf("%s: %w", progNames[p], err)
			}
			r.onceSent[p] += len(frames)
			r.onceDropped[p] += drops
			ns[p] = float64(t.Nanoseconds()) / float64(len(frames))
			continue
		}
		ret, t, err := runRepeated(prog, r.frame, o.Repeat, o.Clock)
		if err != nil {
			return fmt.Errorf("%s: %w", progNames[p], err)
		}
		if err := r.check(p, ret); err != nil {
			return err
		}
		ns[p] = float64(t.Nanoseconds()) / float64(o.Repeat)
	}
	for p := range numProgs {
		if r.progs[p] == nil {
			continue
		}
		v := ns[p]
		if r.once && p != progFloor {
			v -= ns[progFloor]
		}
		r.samples[p] = append(r.samples[p], v)
	}
	return nil
}

func (r *running) ipv6Bit() int {
	if r.ipv6 {
		return 1
	}
	return 0
}

// check compares a program's verdict on the last packet of a run with the
// case's expectation.
func (r *running) check(p int, ret uint32) error {
	want := anyVerdict
	switch p {
	case progOurs:
		want = r.wantOurs
	case progCloudflare:
		want = r.wantCloudflare
	}
	got := pass
	if ret == 0 {
		got = drop
	}
	if want != anyVerdict && got != want {
		return fmt.Errorf("%s decided %v, want %v: the case does not time the path it names", progNames[p], got, want)
	}
	return nil
}

// checkCounters checks, for a case where a program must pass every packet,
// that it dropped none; for a case of new sources in batches of at least
// floodBatch, that each limiter dropped some (each source is under its
// limit, the nodes every packet shares over theirs: a limiter that drops
// none is not deciding a flood);
// and that this filter never failed to reach its state.
func (r *running) checkCounters(o *Options) error {
	for _, p := range []int{progOurs, progCloudflare} {
		if r.once && r.progs[p] != nil && o.Once >= floodBatch && r.onceDropped[p] == 0 {
			return fmt.Errorf("%s dropped none of %d packets from new sources: the case does not time a flood", progNames[p], r.onceSent[p])
		}
	}
	st, err := r.ours.Stats()
	if err != nil {
		return err
	}
	if st.Errors != 0 {
		return fmt.Errorf("this filter could not reach its state %d times", st.Errors)
	}
	if r.wantOurs == pass {
		var dropped uint64
		for c := range st.Dropped {
			for f := range st.Dropped[c] {
				for _, n := range st.Dropped[c][f] {
					dropped += n
				}
			}
		}
		if dropped != 0 {
			return fmt.Errorf("this filter dropped %d packets of a case under its limits", dropped)
		}
	}
	if r.cf != nil && r.wantCloudflare == pass {
		n, err := r.cf.drops()
		if err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("cloudflare's filter dropped %d packets of a case under its limit", n)
		}
	}
	return nil
}

// row returns the case's medians.
func (r *running) row() Row {
	row := Row{Key: r.key, Case: r.name, Ours: math.NaN(), Cloudflare: math.NaN(), Floor: math.NaN(),
		NewSources: r.once, OursDropped: math.NaN(), CloudflareDropped: math.NaN()}
	for p, dst := range [numProgs]*float64{&row.Ours, &row.Cloudflare, &row.Floor} {
		if r.progs[p] != nil {
			*dst = median(r.samples[p])
		}
	}
	for p, dst := range [...]*float64{progOurs: &row.OursDropped, progCloudflare: &row.CloudflareDropped} {
		if r.onceSent[p] > 0 {
			*dst = float64(r.onceDropped[p]) / float64(r.onceSent[p])
		}
	}
	return row
}

// runRepeated runs prog on frame n times in one BPF_PROG_TEST_RUN and
// returns the verdict of the last run and the time of all n.
func runRepeated(prog *ebpf.Program, frame []byte, n int, clock string) (uint32, time.Duration, error) {
	start := time.Now()
	// cilium restarts an interrupted run from the beginning, calling
	// reset first.
	ret, per, err := prog.Benchmark(frame, n, func() { start = time.Now() })
	wall := time.Since(start)
	if err != nil {
		return 0, 0, err
	}
	if clock == ClockWall {
		return ret, wall, nil
	}
	return ret, per * time.Duration(n), nil
}

// runOnce runs prog once on each frame, one BPF_PROG_TEST_RUN each, and
// returns the total time and how many it dropped.
func runOnce(prog *ebpf.Program, frames [][]byte, clock string) (time.Duration, int, error) {
	var kernel time.Duration
	drops := 0
	start := time.Now()
	for _, f := range frames {
		ret, per, err := prog.Benchmark(f, 1, nil)
		if err != nil {
			return 0, 0, err
		}
		kernel += per
		if ret == 0 {
			drops++
		}
	}
	if clock == ClockWall {
		return time.Since(start), drops, nil
	}
	return kernel, drops, nil
}

// cpuModel returns the CPU model of /proc/cpuinfo.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	return CPUModel(f)
}

// kernelRelease returns uname's release.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return strings.TrimRight(string(u.Release[:]), "\x00")
}
