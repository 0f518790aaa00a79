//go:build linux

package bpf

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// floorProgram is a trivial socket filter that returns the packet length:
// the cost of BPF_PROG_TEST_RUN itself, against which the filter is measured.
func floorProgram(tb testing.TB) *ebpf.Program {
	tb.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R0, asm.R1, 0, asm.Word), // skb->len
			asm.Return(),
		},
	})
	if err != nil {
		skipOrFail(tb, "loading the floor program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// BenchmarkFilter measures the filter per packet through BPF_PROG_TEST_RUN.
// ns/op is nanoseconds per packet; x-floor is the kernel-measured time per
// packet divided by that of the floor program in the same sub-benchmark.
//
//	go test ./bpf/... -run '^$' -bench BenchmarkFilter
func BenchmarkFilter(b *testing.B) {
	v4 := udp("198.51.100.7", 5000).frame()
	v6 := udp("2001:db8:1:2::7", 5000).frame()
	pass := sketch.Config{Limit: sketch.MaxLimit, Window: time.Second}
	drop := sketch.Config{Limit: 25, Window: time.Second}
	floor := floorProgram(b)
	// The operations features on: an allowlist of 64 prefixes that the
	// packets are not in (so that each is looked up), and stream tracking,
	// which is on by default.
	var allow []netip.Prefix
	for i := range 32 {
		allow = append(allow, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16),
			netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, byte(i)}), 48))
	}
	features := Options{Allow: allow, TrackShift: DefaultTrackShift}
	for _, bc := range []struct {
		name  string
		cfg   sketch.Config
		frame []byte
		opts  loadOptions
		set   *Options
	}{
		{"floor", sketch.Config{}, v4, loadOptions{}, nil},
		{"ipv4-pass", pass, v4, loadOptions{}, nil},
		{"ipv4-drop", drop, v4, loadOptions{}, nil},
		{"ipv6-pass", pass, v6, loadOptions{}, nil},
		{"ipv6-drop", drop, v6, loadOptions{}, nil},
		{"ipv4-random-sources", sketch.Config{Limit: 1000, Window: time.Second}, v4, loadOptions{benchRandomSource: true}, nil},
		{"ipv4-pass-allowlist", pass, v4, loadOptions{}, &features},
		{"ipv4-drop-allowlist", drop, v4, loadOptions{}, &features},
		{"ipv6-pass-allowlist", pass, v6, loadOptions{}, &features},
	} {
		b.Run(bc.name, func(b *testing.B) {
			prog := floor
			if bc.name != "floor" {
				f := loadTest(b, bc.cfg, bc.opts)
				if bc.set != nil {
					if err := f.SetOptions(*bc.set); err != nil {
						b.Fatal(err)
					}
				}
				prog = f.objs.Rakelimit
				// Warm up: a flood must be over its limit before timing.
				if _, _, err := prog.Benchmark(bc.frame, 100000, nil); err != nil {
					b.Fatal(err)
				}
			}
			// cilium calls the reset function only when it restarts an
			// interrupted run; reset the timer before the first too.
			b.ResetTimer()
			_, per, err := prog.Benchmark(bc.frame, b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_, base, err := floor.Benchmark(bc.frame, max(b.N, 1000000), nil)
			if err != nil {
				b.Fatal(err)
			}
			// The kernel's own per-run time leaves out time spent
			// rescheduled; report it as ns/op.
			b.ReportMetric(float64(per.Nanoseconds()), "ns/op")
			b.ReportMetric(float64(per)/float64(base), "x-floor")
		})
	}
}
