//go:build linux

package xdpbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// Modes are the modes compared, the socket filter first; a run with
// Options.Floor measures ModeFloor after them.
var Modes = []string{engine.ModeBPF, engine.ModeXDP}

// Options are the benchmark's flags.
type Options struct {
	// Caddy is the binary of ./cmd/caddy.
	Caddy string
	// Reps is the number of repetitions; For each flood's duration.
	Reps int
	For  time.Duration
	// Floods are the kinds of flood, Rates the rates (0: the sender's
	// maximum).
	Floods []string
	Rates  []int
	// Senders are the sending goroutines, Sources the flood's addresses.
	Senders, Sources int
	// MaxCount bounds each flood's datagrams.
	MaxCount int
	// Sender is how the flood is sent: SenderXDP or SenderSocket.
	Sender string
	// Out is the directory of results.md and results.json.
	Out string
	// Floor adds ModeFloor to the modes measured.
	Floor bool
}

// modes are the modes a run measures, in the order of its odd
// repetitions.
func (o *Options) modes() []string {
	if o.Floor {
		return append(slices.Clone(Modes), ModeFloor)
	}
	return Modes
}

// ParseFlags reads the options from args.
func ParseFlags(args []string, stderr io.Writer) (*Options, error) {
	fs := flag.NewFlagSet("rakebench-xdp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &Options{}
	floods, rates := "", ""
	fs.StringVar(&o.Caddy, "caddy", "./caddy", "the Caddy binary, built from ./cmd/caddy (go build -o caddy ./cmd/caddy)")
	fs.IntVar(&o.Reps, "reps", 3, "repetitions")
	fs.DurationVar(&o.For, "for", 5*time.Second, "each flood's duration")
	fs.StringVar(&floods, "floods", FloodInitial+","+FloodSmall, "the floods: "+strings.Join(FloodKinds, ", "))
	fs.StringVar(&rates, "rates", "max", "flood rates in datagrams per second, comma-separated; max is the sender's maximum")
	fs.IntVar(&o.Senders, "senders", runtime.NumCPU(), "sending goroutines")
	fs.IntVar(&o.Sources, "sources", 16, "the flood's source addresses (one /48)")
	fs.IntVar(&o.MaxCount, "max-count", 100_000_000, "the most datagrams a flood sends")
	fs.StringVar(&o.Sender, "sender", SenderXDP, "how the flood is sent: xdp (XDP frames into the veth, as a NIC's driver hands them over) "+
		"or socket (UDP sockets: the veth receives socket buffers, which understates what XDP saves)")
	fs.BoolVar(&o.Floor, "floor", true, "measure also "+ModeFloor+": Caddy in mode bpf behind an XDP program that drops the flood's frames and does nothing else, "+
		"the least any XDP program costs on this path")
	fs.StringVar(&o.Out, "out", "", "directory for results.md and results.json (default: a new temporary directory)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, f := range strings.Split(floods, ",") {
		if !contains(FloodKinds, f) {
			return nil, fmt.Errorf("-floods: %q: want %s", f, strings.Join(FloodKinds, ", "))
		}
		o.Floods = append(o.Floods, f)
	}
	for _, r := range strings.Split(rates, ",") {
		if r == "max" {
			o.Rates = append(o.Rates, 0)
			continue
		}
		n, err := strconv.Atoi(r)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-rates: %q: want a positive number of datagrams per second, or max", r)
		}
		o.Rates = append(o.Rates, n)
	}
	switch {
	case !contains(Senders, o.Sender):
		return nil, fmt.Errorf("-sender %q: want %s", o.Sender, strings.Join(Senders, " or "))
	case o.Reps < 1:
		return nil, fmt.Errorf("-reps %d: want at least 1", o.Reps)
	case o.For <= 0 || o.For > 10*time.Minute:
		return nil, fmt.Errorf("-for %v: want a duration up to 10m", o.For)
	case o.Senders < 1 || o.Sources < o.Senders || o.Sources > 1000:
		return nil, fmt.Errorf("-senders %d -sources %d: want a sender at least, a source for each, 1,000 sources at most", o.Senders, o.Sources)
	case o.MaxCount < 1:
		return nil, fmt.Errorf("-max-count %d: want at least 1", o.MaxCount)
	}
	return o, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runner runs the samples of one run.
type runner struct {
	o   *Options
	lab *lab
}

// Run makes the network, measures every repetition, flood, rate and mode,
// interleaved (the modes' order alternates from one repetition to the
// next), removes the network, and writes the report.
func Run(ctx context.Context, o *Options, progress io.Writer) (*Report, error) {
	if _, err := os.Stat(o.Caddy); err != nil {
		return nil, fmt.Errorf("-caddy %s: %w (build it with go build -o caddy ./cmd/caddy)", o.Caddy, err)
	}
	if o.Out == "" {
		dir, err := os.MkdirTemp("", "rakebench-xdp-results-")
		if err != nil {
			return nil, err
		}
		o.Out = dir
	}
	l, err := newLab(o.Sources)
	if err != nil {
		return nil, err
	}
	defer l.close()
	if o.Sender == SenderXDP {
		if err := l.server.Enter(func() error { return enableGRO(vethName) }); err != nil {
			return nil, err
		}
	}
	// The kernel's program statistics, on for the run: the floor's drops
	// and the frames Caddy's XDP program ran on.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enabling BPF program statistics: %w", err)
	}
	defer stats.Close()
	r := &runner{o: o, lab: l}
	rep := &Report{Machine: Machine(), Options: *o}
	total := o.Reps * len(o.Floods) * len(o.Rates) * len(o.modes())
	for i := range o.Reps {
		for _, kind := range o.Floods {
			for _, rate := range o.Rates {
				modes := o.modes()
				if i%2 == 1 {
					modes = slices.Clone(modes)
					slices.Reverse(modes)
				}
				for _, mode := range modes {
					if err := ctx.Err(); err != nil {
						return nil, err
					}
					fl := Flood{Kind: kind, Rate: rate, Senders: o.Senders, Sources: o.Sources, Count: o.MaxCount, For: o.For}
					s, err := r.sample(ctx, mode, fl, i+1)
					if err != nil {
						return nil, fmt.Errorf("repetition %d, flood %s, rate %s, mode %s: %w", i+1, kind, rateName(rate), mode, err)
					}
					rep.Samples = append(rep.Samples, s)
					fmt.Fprintf(progress, "rakebench-xdp: %d/%d: %s\n", len(rep.Samples), total, s.line())
				}
			}
		}
	}
	rep.summarize()
	if err := rep.write(o.Out); err != nil {
		return rep, err
	}
	fmt.Fprintf(progress, "rakebench-xdp: results in %s\n", o.Out)
	return rep, nil
}

// rateName is a rate as the report names it.
func rateName(rate int) string {
	if rate == 0 {
		return "max"
	}
	return strconv.Itoa(rate)
}

// Machine names this machine's CPU, its count and the kernel.
func Machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "unknown kernel"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = "Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d CPUs, %s", cpu, runtime.NumCPU(), kernel)
}

// ErrNotRoot is the error of a run without the privileges it needs.
var ErrNotRoot = errors.New("rakebench-xdp needs root: it makes network namespaces and runs Caddy's BPF programs")
