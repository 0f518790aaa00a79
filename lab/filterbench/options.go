package filterbench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Clocks a run may take its times from.
const (
	// ClockKernel is BPF_PROG_TEST_RUN's own time per run, which leaves
	// out the system call and any time the test was rescheduled.
	ClockKernel = "kernel"
	// ClockWall is the wall clock around each BPF_PROG_TEST_RUN call.
	ClockWall = "wall"
)

// NoPeer is the CloudflareObject that times this filter and the floor
// alone: Cloudflare's object cannot always be had (the Go module proxy
// refuses its module).
const NoPeer = "none"

// Options configure a run.
type Options struct {
	// Rounds is how many interleaved rounds run; every figure is the
	// median over them.
	Rounds int
	// Repeat is how many times a round runs a one-source case's frame.
	Repeat int
	// Once is how many distinct frames a round runs, each once, in a case
	// with a new source on every packet.
	Once int
	// LeadIn is how many distinct frames from other new sources each
	// program runs, untimed, just before every timed batch of a case with
	// a new source on every packet, so that the batch meets the limiter as
	// a sustained flood keeps it: the nodes every packet shares at their
	// limits. Without, their counts decay over the gap between rounds
	// (seconds, with every case), and the first packets of each batch pass
	// into the room that opened, as if the flood had paused. 0 runs none.
	LeadIn int
	// Warmup is how many packets each program gets before the first round,
	// so that a flood is over its limit before it is timed.
	Warmup int
	// Clock is ClockKernel or ClockWall.
	Clock string
	// Cases are the keys of the cases to run (CaseKeys); empty, all.
	Cases []string
	// Parallel are the keys of the cases also timed on all CPUs, each a
	// case that repeats one frame; those not among Cases are not run.
	// Empty, none.
	Parallel []string
	// CloudflareObject is a path to Cloudflare's object, a Go file
	// embedding it or a directory holding either (ReadObject); empty,
	// FetchCloudflare fetches CloudflareVersion into CacheDir.
	// NoPeer times this filter and the floor alone, without Cloudflare's
	// column.
	CloudflareObject string
	// CacheDir keeps the fetched object.
	CacheDir string
	// CloudflareVersion is the module version fetched.
	CloudflareVersion string
	// Out, when set, is where the Markdown report is written.
	Out string
}

// DefaultOptions are the options of `make bench-filter`.
func DefaultOptions() Options {
	return Options{
		Rounds:            15,
		Repeat:            200_000,
		Once:              5_000,
		LeadIn:            defaultLeadIn,
		Warmup:            100_000,
		Clock:             ClockKernel,
		Parallel:          slices.Clone(DefaultParallel),
		CacheDir:          defaultCacheDir(),
		CloudflareVersion: CloudflareVersion,
	}
}

// defaultLeadIn is Options.LeadIn's default: twice what randomLimit lets
// through in a window of one second, more than the room any gap between
// rounds can open.
const defaultLeadIn = 2 * randomLimit

// defaultCacheDir is the user's cache directory's rakelimit-filterbench,
// or one in the temporary directory without a cache directory.
func defaultCacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "rakelimit-filterbench")
}

// Validate reports the first bad option, naming its flag and value.
func (o *Options) Validate() error {
	for _, c := range []struct {
		name     string
		v, least int
	}{{"rounds", o.Rounds, 1}, {"repeat", o.Repeat, 1}, {"once", o.Once, 1}, {"lead-in", o.LeadIn, 0}, {"warmup", o.Warmup, 0}} {
		if c.v < c.least {
			return fmt.Errorf("-%s %d: want at least %d", c.name, c.v, c.least)
		}
	}
	if o.Repeat > 1<<31 {
		return fmt.Errorf("-repeat %d: want at most %d", o.Repeat, 1<<31)
	}
	if o.LeadIn > 1<<24 {
		return fmt.Errorf("-lead-in %d: want at most %d", o.LeadIn, 1<<24)
	}
	if o.Warmup > 1<<31 {
		return fmt.Errorf("-warmup %d: want at most %d", o.Warmup, 1<<31)
	}
	if o.Clock != ClockKernel && o.Clock != ClockWall {
		return fmt.Errorf("-clock %q: want %s or %s", o.Clock, ClockKernel, ClockWall)
	}
	known := CaseKeys()
	for _, k := range o.Cases {
		if !slices.Contains(known, k) {
			return fmt.Errorf("-cases %q: unknown case; the cases are %s", k, strings.Join(known, ","))
		}
	}
	if err := o.validateParallel(); err != nil {
		return err
	}
	if o.CloudflareObject == "" && o.CacheDir == "" {
		return errors.New("-cache \"\": want a directory for Cloudflare's object, or give -cloudflare")
	}
	return nil
}

// ParseFlags parses the command line of lab/cmd/rakebench-filter into options
// (DefaultOptions for what it leaves out) and validates them. Usage goes
// to usage.
func ParseFlags(args []string, usage io.Writer) (*Options, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("rakebench-filter", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds; figures are medians over them")
	fs.IntVar(&o.Repeat, "repeat", o.Repeat, "runs of a one-source case's frame per round")
	fs.IntVar(&o.Once, "once", o.Once, "distinct frames, each run once, per round of a new-source case")
	fs.IntVar(&o.LeadIn, "lead-in", o.LeadIn, "distinct frames from other new sources run untimed before each timed batch of a new-source case, so that it meets a sustained flood's state (0: none)")
	fs.IntVar(&o.Warmup, "warmup", o.Warmup, "packets per program before the first round")
	fs.StringVar(&o.Clock, "clock", o.Clock, "kernel (BPF_PROG_TEST_RUN's own time) or wall")
	cases := fs.String("cases", "", "comma-separated case keys (default all): "+strings.Join(CaseKeys(), ","))
	parallel := fs.String("parallel", strings.Join(o.Parallel, ","), "comma-separated keys of cases that repeat one frame, also timed on one CPU and on all CPUs together (none: no such table)")
	fs.StringVar(&o.CloudflareObject, "cloudflare", "", "Cloudflare's object: an .o, a bpf2go .go embedding it, or a directory (default: fetch); none: this filter and the floor alone")
	fs.StringVar(&o.CacheDir, "cache", o.CacheDir, "directory keeping the fetched object")
	fs.StringVar(&o.CloudflareVersion, "cloudflare-version", o.CloudflareVersion, "version of "+CloudflareModule+" to fetch")
	fs.StringVar(&o.Out, "out", "", "write the report as Markdown to this file (e.g. lab/docs/bench/filter.md)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *cases != "" {
		o.Cases = strings.Split(*cases, ",")
	}
	parallelSet := false
	fs.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "parallel" })
	switch {
	case *parallel == "" || *parallel == "none":
		o.Parallel = nil
	case parallelSet:
		o.Parallel = strings.Split(*parallel, ",")
		for _, k := range o.Parallel {
			if len(o.Cases) > 0 && !slices.Contains(o.Cases, k) && slices.Contains(CaseKeys(), k) {
				return nil, fmt.Errorf("-parallel %q: not among -cases", k)
			}
		}
	case len(o.Cases) > 0:
		// The default, narrowed to the cases chosen.
		o.Parallel = slices.DeleteFunc(o.Parallel, func(k string) bool { return !slices.Contains(o.Cases, k) })
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &o, nil
}
