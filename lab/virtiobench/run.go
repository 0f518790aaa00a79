//go:build linux

package virtiobench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// ErrNotRoot is the error of a run without the privileges it needs.
var ErrNotRoot = errors.New("rakebench-virtio needs root: it makes a network namespace and a tap, and runs QEMU there")

// Run builds the guest's root, and for each count of vCPUs of the setups
// boots a guest and measures its setups, every repetition, flood, rate
// and mode, interleaved (the order alternates from one repetition to the
// next); it powers the guest off, removes its tap and namespace, and
// writes the report.
func Run(ctx context.Context, o *Options, progress io.Writer) (*Report, error) {
	if _, err := os.Stat(filepath.Join(o.Kernel, "vmlinuz")); err != nil {
		return nil, fmt.Errorf("-kernel %s: %w (lab/cmd/rakebench-virtio/kernel.sh fetches one)", o.Kernel, err)
	}
	if o.Out == "" {
		dir, err := os.MkdirTemp("", "rakebench-virtio-results-")
		if err != nil {
			return nil, err
		}
		o.Out = dir
	}
	work, err := os.MkdirTemp("", "rakebench-virtio-")
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(work)
		}
	}()
	fmt.Fprintf(progress, "rakebench-virtio: building the guest's root\n")
	initrd, err := buildInitramfs(work, o.Caddy, o.Kernel)
	if err != nil {
		return nil, err
	}
	accel := resolveAccel(o.Accel)
	rep := &Report{Host: xdpbench.Machine(), Accel: accel, Options: *o}
	total := len(o.Setups) * o.Reps * len(o.Floods) * len(o.Rates) * len(o.modes())
	for _, cpus := range o.boots() {
		console := filepath.Join(work, fmt.Sprintf("console-%dcpu.log", cpus))
		fmt.Fprintf(progress, "rakebench-virtio: booting a guest of %d vCPU%s with %s\n", cpus, plural(cpus), accel)
		if err := measure(ctx, o, rep, accel, initrd, console, cpus, total, progress); err != nil {
			keep = true
			return nil, fmt.Errorf("%w (the guest's console: %s)", err, console)
		}
	}
	rep.summarize()
	if err := rep.write(o.Out); err != nil {
		return rep, err
	}
	fmt.Fprintf(progress, "rakebench-virtio: results in %s\n", o.Out)
	return rep, nil
}

// measure boots a guest of cpus vCPUs, measures its setups into rep, and
// removes it.
func measure(ctx context.Context, o *Options, rep *Report, accel, initrd, console string, cpus, total int, progress io.Writer) error {
	g, err := bootGuest(ctx, o, accel, initrd, console, cpus)
	if err != nil {
		return err
	}
	defer g.close()
	var in Info
	if err := g.call(ctx, http.MethodGet, "/info", nil, &in); err != nil {
		return err
	}
	rep.Guests = append(rep.Guests, in)
	fmt.Fprintf(progress, "rakebench-virtio: guest Linux %s, %d vCPUs (%s), NIC %s, %d of %d queue pairs\n", in.Kernel, in.CPUs,
		in.CPUModel, in.Driver, in.QueuePairs, in.MaxQueuePairs)
	// Each repetition runs every setup of these vCPUs, flood, rate and
	// mode; odd repetitions in the reverse order.
	type run struct {
		setup Setup
		flood xdpbench.Flood
		mode  string
	}
	var order []run
	for _, st := range o.Setups {
		if st.CPUs != cpus {
			continue
		}
		for _, kind := range o.Floods {
			for _, rate := range o.Rates {
				for _, mode := range o.modes() {
					order = append(order, run{st, xdpbench.Flood{Kind: kind, Rate: rate, Senders: o.Senders, Sources: o.Sources,
						Count: o.MaxCount, For: o.For}, mode})
				}
			}
		}
	}
	for i := range o.Reps {
		runs := order
		if i%2 == 1 {
			runs = slices.Clone(order)
			slices.Reverse(runs)
		}
		for _, r := range runs {
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := sample(ctx, o, g, r.setup, r.mode, r.flood, i+1)
			if err != nil {
				return fmt.Errorf("%s, repetition %d, flood %s, rate %s, mode %s: %w", r.setup.Name(), i+1, r.flood.Kind,
					rateName(r.flood.Rate), r.mode, err)
			}
			rep.Samples = append(rep.Samples, s)
			fmt.Fprintf(progress, "rakebench-virtio: %d/%d: %s\n", len(rep.Samples), total, s.line())
		}
	}
	return nil
}

// sample measures mode under flood with setup in repetition rep, on a
// fresh Caddy in the guest.
func sample(ctx context.Context, o *Options, g *guest, setup Setup, mode string, flood xdpbench.Flood, rep int) (Sample, error) {
	s := Sample{Sample: xdpbench.Sample{Mode: mode, Flood: flood.Kind, Rate: flood.Rate, Rep: rep}, Setup: setup}
	var st Started
	if err := g.call(ctx, http.MethodPost, "/start", url.Values{"mode": {mode}, "queues": {strconv.Itoa(setup.Queues)}}, &st); err != nil {
		return s, err
	}
	defer func() {
		// Even when the run is cancelled, while the guest runs.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		g.call(ctx, http.MethodPost, "/stop", url.Values{}, nil)
	}()
	s.XDP = st.XDP
	// Caddy issues its tls internal certificate after it starts.
	ready := time.Now().Add(2 * time.Minute)
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := g.legit(callCtx)
		cancel()
		if ok {
			break
		}
		if ctx.Err() != nil {
			return s, ctx.Err()
		}
		if time.Now().After(ready) {
			return s, fmt.Errorf("the legit client gets no page before the flood: %v; Caddy's log: %s", err, g.caddyLog(ctx))
		}
		time.Sleep(500 * time.Millisecond)
	}
	before, tapBefore, self0, err := read(ctx, g)
	if err != nil {
		return s, err
	}
	// The legit client, while the flood lasts.
	stopLegit := xdpbench.Legit(ctx, g.legit)
	var sent int
	var elapsed time.Duration
	var ferr error
	if o.Sender == xdpbench.SenderXDP {
		sent, elapsed, ferr = flood.SendFrames(g.ns, tapName, guestMACAddr(), floodTarget())
	} else {
		sent, elapsed, ferr = flood.Send(g.ns, floodTarget())
	}
	after, tapAfter, self1, err := read(ctx, g)
	s.LegitOK, s.LegitTotal = stopLegit()
	if ferr != nil {
		return s, ferr
	}
	if err != nil {
		return s, err
	}
	s.Seconds, s.Sent = elapsed.Seconds(), sent
	s.Dropped, s.Passed = after.Dropped-before.Dropped, after.Passed-before.Passed
	s.XDPRuns, s.SocketDrops = after.XDPRuns-before.XDPRuns, after.SocketDrops-before.SocketDrops
	s.Guest = after.Stat[0].sub(before.Stat[0]).seconds()
	for i := 1; i < len(after.Stat) && i < len(before.Stat); i++ {
		s.PerCPU = append(s.PerCPU, after.Stat[i].sub(before.Stat[i]).seconds())
	}
	s.SoftirqSeconds = s.Guest.Softirq
	s.CaddySeconds = float64(after.Caddy-before.Caddy) / clockTicks
	s.SenderSeconds = (self1 - self0).Seconds()
	s.Received, s.NICDropped = after.NIC.RxPackets-before.NIC.RxPackets, after.NIC.RxDropped-before.NIC.RxDropped
	s.TapSent = tapAfter.TxPackets - tapBefore.TxPackets
	s.GuestSeconds = s.Guest.Total() / float64(max(len(s.PerCPU), 1))
	s.Attach = before.Attach
	if after.Attach != before.Attach {
		s.Attach = before.Attach + " then " + after.Attach
	}
	return s, nil
}

// read reads the guest (through its agent), the tap's counters and this
// process's CPU time.
func read(ctx context.Context, g *guest) (*Reading, LinkStats, time.Duration, error) {
	var rd Reading
	callCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := g.call(callCtx, http.MethodGet, "/read", nil, &rd); err != nil {
		return nil, LinkStats{}, 0, err
	}
	if len(rd.Stat) == 0 {
		return nil, LinkStats{}, 0, errors.New("the agent read no /proc/stat")
	}
	tap, err := g.tapStats()
	if err != nil {
		return nil, LinkStats{}, 0, err
	}
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return nil, LinkStats{}, 0, fmt.Errorf("getrusage: %w", err)
	}
	return &rd, tap, time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
