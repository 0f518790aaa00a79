//go:build linux

package filterbench

import (
	"fmt"
	"math"
	"time"

	"golang.org/x/sys/unix"
)

// usableCPUs returns, in order, the CPUs this process may run on (its
// affinity, the online CPUs that a cpuset leaves it): the ones a thread
// can be pinned to.
func usableCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("reading the CPUs this process may run on: %w", err)
	}
	var cpus []int
	for cpu := 0; len(cpus) < set.Count(); cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, nil
}

// pinThread pins the calling OS thread to cpu. BPF_PROG_TEST_RUN runs a
// program on the CPU of the thread that calls it.
func pinThread(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pinning a thread to CPU %d: %w", cpu, err)
	}
	return nil
}

// parallelState is what a case timed on all CPUs keeps.
type parallelState struct {
	// on says that the case is timed on all CPUs.
	on bool
	// one and all are packets per second by program, one per round, on
	// one CPU and on all.
	one, all [numProgs][]float64
}

// runOn runs program p on the case's frame n times on one thread pinned to
// each of cpus, started together, checks the verdict of every thread's
// last run, and returns the packets per second of them all.
func (r *running) runOn(p int, cpus []int, n int) (float64, error) {
	prog := r.progs[p]
	rets := make([]uint32, len(cpus))
	wall, err := together(cpus, pinThread, func(i, _ int) error {
		ret, _, err := prog.Benchmark(r.frame, n, nil)
		rets[i] = ret
		return err
	}, time.Now)
	if err != nil {
		return math.NaN(), fmt.Errorf("%s on CPUs %v: %w", progNames[p], cpus, err)
	}
	for _, ret := range rets {
		if err := r.check(p, ret); err != nil {
			return math.NaN(), fmt.Errorf("on CPUs %v: %w", cpus, err)
		}
	}
	return packetsPerSecond(n, len(cpus), wall), nil
}

// warmUpParallel runs o.Warmup packets through every program of the case
// on one CPU and on all, so that the state the programs keep is warm both
// ways (the maps are shared with the case's other rows).
func (r *running) warmUpParallel(o *Options, cpus []int) error {
	if o.Warmup == 0 {
		return nil
	}
	for p, prog := range r.progs {
		if prog == nil {
			continue
		}
		for _, set := range [][]int{cpus, cpus[:1]} {
			if _, err := r.runOn(p, set, o.Warmup); err != nil {
				return err
			}
		}
	}
	return nil
}

// measureParallel takes one round's sample of every program of the case on
// one CPU (a different one each round) and on all, in an order that moves
// with the round.
func (r *running) measureParallel(o *Options, round int, cpus []int) error {
	one := []int{cpus[round%len(cpus)]}
	for i := range numProgs {
		p := (i + round) % numProgs
		if r.progs[p] == nil {
			continue
		}
		first, second := &r.par.one[p], &r.par.all[p]
		sets := [2][]int{one, cpus}
		if round%2 == 1 {
			first, second = second, first
			sets[0], sets[1] = sets[1], sets[0]
		}
		for j, dst := range [2]*[]float64{first, second} {
			x, err := r.runOn(p, sets[j], o.Repeat)
			if err != nil {
				return err
			}
			*dst = append(*dst, x)
		}
	}
	return nil
}

// parallelRows returns the case's medians on all CPUs, one row per
// program timed.
func (r *running) parallelRows() []ParallelRow {
	var rows []ParallelRow
	for p := range numProgs {
		if r.progs[p] == nil {
			continue
		}
		rows = append(rows, ParallelRow{Key: r.key, Case: r.name, Program: progNames[p],
			One: median(r.par.one[p]), All: median(r.par.all[p])})
	}
	return rows
}
