//go:build linux

package virtiobench

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// Setup is a guest's vCPUs and the queue pairs its NIC uses.
type Setup struct {
	CPUs   int `json:"cpus"`
	Queues int `json:"queues"`
}

// String is the setup as -setups writes it: CPUS/QUEUES.
func (s Setup) String() string { return fmt.Sprintf("%d/%d", s.CPUs, s.Queues) }

// Name is the setup in words.
func (s Setup) Name() string {
	return fmt.Sprintf("%d vCPU%s, %d queue%s", s.CPUs, plural(s.CPUs), s.Queues, plural(s.Queues))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// ParseSetups reads -setups: CPUS/QUEUES, comma-separated, each queue
// count from 1 to the vCPUs (the NIC has as many queue pairs as the guest
// has vCPUs), at most 8 vCPUs.
func ParseSetups(s string) ([]Setup, error) {
	var out []Setup
	for _, f := range strings.Split(s, ",") {
		c, q, ok := strings.Cut(strings.TrimSpace(f), "/")
		cpus, err1 := strconv.Atoi(c)
		queues, err2 := strconv.Atoi(q)
		if !ok || err1 != nil || err2 != nil || cpus < 1 || cpus > 8 || queues < 1 || queues > cpus {
			return nil, fmt.Errorf("-setups: %q: want CPUS/QUEUES, 1 to 8 vCPUs and 1 to CPUS queues", f)
		}
		st := Setup{CPUs: cpus, Queues: queues}
		if slices.Contains(out, st) {
			return nil, fmt.Errorf("-setups: %s twice", st)
		}
		out = append(out, st)
	}
	return out, nil
}

// Options are the benchmark's flags.
type Options struct {
	// Caddy is the static binary of ./cmd/caddy; Kernel the directory of
	// the guest's kernel (vmlinuz) and its modules (modules/*.ko), as
	// kernel.sh leaves them.
	Caddy, Kernel string
	// Accel is QEMU's accelerator: AccelKVM, AccelTCG or AccelAuto;
	// Memory the guest's, MiB.
	Accel  string
	Memory int
	// Setups are the guests and queues measured: a guest is booted for
	// each count of vCPUs, and measures its setups interleaved.
	Setups []Setup
	// Reps is the number of repetitions; For each flood's duration.
	Reps int
	For  time.Duration
	// Floods are the kinds of flood (xdpbench.FloodKinds), Rates the
	// rates (0: the sender's maximum).
	Floods []string
	Rates  []int
	// Senders are the sending goroutines, Sources the flood's addresses;
	// MaxCount bounds each flood's datagrams; Sender is how it is sent
	// (xdpbench.SenderXDP: frames into the tap; SenderSocket).
	Senders, Sources, MaxCount int
	Sender                     string
	// Floor adds xdpbench.ModeFloor to the modes measured.
	Floor bool
	// Out is the directory of results.md and results.json.
	Out string
}

// QEMU's accelerators.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// modes are the modes a run measures, in the order of its odd
// repetitions.
func (o *Options) modes() []string {
	if o.Floor {
		return append(slices.Clone(xdpbench.Modes), xdpbench.ModeFloor)
	}
	return xdpbench.Modes
}

// boots are the guests' vCPU counts, in the order of the setups.
func (o *Options) boots() []int {
	var cpus []int
	for _, s := range o.Setups {
		if !slices.Contains(cpus, s.CPUs) {
			cpus = append(cpus, s.CPUs)
		}
	}
	return cpus
}

// ParseFlags reads the options from args.
func ParseFlags(args []string, stderr io.Writer) (*Options, error) {
	fs := flag.NewFlagSet("rakebench-virtio", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &Options{}
	setups, floods, rates := "", "", ""
	fs.StringVar(&o.Caddy, "caddy", "./caddy", "the Caddy binary, static (CGO_ENABLED=0 go build -o caddy ./cmd/caddy)")
	fs.StringVar(&o.Kernel, "kernel", "", "the guest kernel's directory: vmlinuz and modules/*.ko (lab/cmd/rakebench-virtio/kernel.sh prints it)")
	fs.StringVar(&o.Accel, "accel", AccelAuto, "QEMU's accelerator: kvm, tcg (figures not meaningful per packet: the guest is emulated) "+
		"or auto (kvm where the host has kvm_intel or kvm_amd)")
	fs.IntVar(&o.Memory, "memory", 1024, "the guest's memory, MiB")
	fs.StringVar(&setups, "setups", "1/1,2/1,2/2", "the guests' vCPUs and the NIC's queue pairs in use, CPUS/QUEUES, comma-separated")
	fs.IntVar(&o.Reps, "reps", 3, "repetitions")
	fs.DurationVar(&o.For, "for", 5*time.Second, "each flood's duration")
	fs.StringVar(&floods, "floods", xdpbench.FloodInitial, "the floods: "+strings.Join(xdpbench.FloodKinds, ", "))
	fs.StringVar(&rates, "rates", "max", "flood rates in datagrams per second, comma-separated; max is the sender's maximum")
	fs.IntVar(&o.Senders, "senders", 1, "sending goroutines (each takes a host CPU from QEMU)")
	fs.IntVar(&o.Sources, "sources", 16, "the flood's source addresses (one /48)")
	fs.IntVar(&o.MaxCount, "max-count", 50_000_000, "the most datagrams a flood sends")
	fs.StringVar(&o.Sender, "sender", xdpbench.SenderXDP, "how the flood is sent: xdp (XDP frames redirected into the tap) or socket (UDP sockets)")
	fs.BoolVar(&o.Floor, "floor", true, "measure also "+xdpbench.ModeFloor+": Caddy in mode bpf behind an XDP program that only drops the flood's frames")
	fs.StringVar(&o.Out, "out", "", "directory for results.md and results.json (default: a new temporary directory)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.Setups, err = ParseSetups(setups); err != nil {
		return nil, err
	}
	for _, f := range strings.Split(floods, ",") {
		if !slices.Contains(xdpbench.FloodKinds, f) {
			return nil, fmt.Errorf("-floods: %q: want %s", f, strings.Join(xdpbench.FloodKinds, ", "))
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
	case o.Kernel == "":
		return nil, fmt.Errorf("-kernel: want the guest kernel's directory (lab/cmd/rakebench-virtio/kernel.sh prints it)")
	case !slices.Contains([]string{AccelAuto, AccelKVM, AccelTCG}, o.Accel):
		return nil, fmt.Errorf("-accel %q: want %s, %s or %s", o.Accel, AccelAuto, AccelKVM, AccelTCG)
	case o.Memory < 512:
		return nil, fmt.Errorf("-memory %d: want at least 512 MiB (the guest's root, Caddy among it, is in memory)", o.Memory)
	case !slices.Contains(xdpbench.Senders, o.Sender):
		return nil, fmt.Errorf("-sender %q: want %s", o.Sender, strings.Join(xdpbench.Senders, " or "))
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

// rateName is a rate as the report names it.
func rateName(rate int) string {
	if rate == 0 {
		return "max"
	}
	return strconv.Itoa(rate)
}
