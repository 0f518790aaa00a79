//go:build linux

package kernel

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// floorProgram loads FloorProgram for a test or benchmark.
func floorProgram(tb testing.TB) *ebpf.Program {
	tb.Helper()
	prog, err := FloorProgram()
	if err != nil {
		testutil.SkipOrFail(tb, "%v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// xdpFloorProgram loads XDPFloorProgram for a benchmark.
func xdpFloorProgram(tb testing.TB) *ebpf.Program {
	tb.Helper()
	prog, err := XDPFloorProgram()
	if err != nil {
		testutil.SkipOrFail(tb, "%v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// BenchmarkFilter measures the filter per packet through BPF_PROG_TEST_RUN.
// ns/op is nanoseconds per packet; x-floor is the kernel-measured time per
// packet divided by that of the floor program in the same sub-benchmark.
// Each case runs the socket filter, and, as xdp-<case>, the XDP program on
// the same frames, listening on their port (against a floor XDP program);
// xdp-other-port is a frame to another port, which it passes untouched.
//
//	go test ./internal/kernel -run '^$' -bench BenchmarkFilter
func BenchmarkFilter(b *testing.B) {
	v4 := udp("198.51.100.7", 5000).Bytes()
	v6 := udp("2001:db8:1:2::7", 5000).Bytes()
	withData := func(p testutil.Frame, data []byte) []byte { p.Data = data; return p.Bytes() }
	initial := withData(udp("198.51.100.7", 50000), quicclass.LongHeader(quicclass.Version1, 0, 8, 8, 1200))
	short := withData(udp("198.51.100.7", 50000), quicclass.ShortHeader(1200))
	junk := withData(udp("198.51.100.7", 50000), make([]byte, 100))
	// Every datagram alike (the filter before it knew QUIC), and by class.
	pass, drop := testutil.Limits(1_000_000), testutil.Limits(25)
	quicPass, quicDrop := testutil.QUICLimits(1_000_000, 1_000_000), testutil.QUICLimits(25, 25)
	floor, xdpFloor := floorProgram(b), xdpFloorProgram(b)
	// The operations features on: an allowlist of 64 prefixes that the
	// packets are not in (so that each is looked up), and stream tracking,
	// which is on by default.
	var allow []netip.Prefix
	for i := range 32 {
		allow = append(allow, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16),
			netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, byte(i)}), 48))
	}
	withAllow := func(c decide.Config) decide.Config { c.Allow = allow; return c }
	// Verifying: short headers to a server ID the filter learned bound to
	// their source (the established path of a real connection), to an
	// unknown one from a proven peer (a client that moved to an ID it was
	// given encrypted), and to an unknown one from a stranger (the
	// unverified class, junk).
	sid := decide.ServerID{0x5e, 0x17, 0xa2, 0x09}
	verified := withData(udp("198.51.100.7", 50000), quicclass.ShortPacket(sid, 1200))
	stranger := withData(udp("198.51.100.7", 50000), quicclass.ShortPacket(decide.ServerID{1, 2, 3, 4}, 100))
	verify := func(c decide.Config) decide.Config { c.VerifyIDs = true; return c }
	type benchCase struct {
		name  string
		cfg   decide.Config
		frame []byte
		opts  loadOptions
	}
	cases := []benchCase{
		{"floor", decide.Config{}, v4, loadOptions{}},
		{"ipv4-pass", pass, v4, loadOptions{}},
		{"ipv4-drop", drop, v4, loadOptions{}},
		{"ipv6-pass", pass, v6, loadOptions{}},
		{"ipv6-drop", drop, v6, loadOptions{}},
		{"opening-pass", quicPass, initial, loadOptions{}},
		{"opening-drop", quicDrop, initial, loadOptions{}},
		{"established-pass", quicPass, short, loadOptions{}},
		{"established-drop", quicDrop, short, loadOptions{}},
		{"invalid-drop", quicPass, junk, loadOptions{}},
		{"ipv4-random-sources", testutil.Limits(1000), v4, loadOptions{benchRandomSource: true}},
		{"opening-random-sources", testutil.QUICLimits(1000, 250_000), initial, loadOptions{benchRandomSource: true}},
		{"ipv4-pass-allowlist", withAllow(pass), v4, loadOptions{}},
		{"ipv4-drop-allowlist", withAllow(drop), v4, loadOptions{}},
		{"ipv6-pass-allowlist", withAllow(pass), v6, loadOptions{}},
		{"verified-pass", verify(quicPass), verified, loadOptions{}},
		{"verified-drop", verify(quicDrop), verified, loadOptions{}},
		{"verified-peer-pass", verify(quicPass), stranger, loadOptions{}},
		{"unverified-drop", verify(quicPass), stranger, loadOptions{}},
		{"unverified-random-sources", verify(quicPass), stranger, loadOptions{benchRandomSource: true}},
	}
	for _, bc := range slices.Clone(cases) {
		bc.name = "xdp-" + bc.name
		cases = append(cases, bc)
	}
	otherPort := udp("198.51.100.7", 50000)
	otherPort.DstPort, otherPort.Data = 8080, quicclass.ShortHeader(1200)
	cases = append(cases, benchCase{"xdp-other-port", quicPass, otherPort.Bytes(), loadOptions{}})
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			xdp := strings.HasPrefix(bc.name, "xdp-")
			base := floor
			if xdp {
				base = xdpFloor
			}
			prog := base
			if !strings.HasSuffix(bc.name, "floor") {
				if xdp {
					bc.opts.xdp = true
				}
				f := loadTest(b, bc.cfg, bc.opts)
				src := netip.MustParseAddr("198.51.100.7")
				if err := f.LearnServerID(sid, src); err != nil {
					b.Fatal(err)
				}
				if strings.TrimPrefix(bc.name, "xdp-") == "verified-peer-pass" {
					if err := f.LearnPeer(src, true); err != nil {
						b.Fatal(err)
					}
				}
				prog = f.objs.Rakelimit
				if xdp {
					// The frames' listener: port 443, any address.
					if err := f.SetListeners([]netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:443"),
						netip.MustParseAddrPort("[::]:443")}); err != nil {
						b.Fatal(err)
					}
					prog = f.objs.RakelimitXdp
				}
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
			_, floorPer, err := base.Benchmark(bc.frame, max(b.N, 1000000), nil)
			if err != nil {
				b.Fatal(err)
			}
			// The kernel's own per-run time leaves out time spent
			// rescheduled; report it as ns/op.
			b.ReportMetric(float64(per.Nanoseconds()), "ns/op")
			b.ReportMetric(float64(per)/float64(floorPer), "x-floor")
		})
	}
}
