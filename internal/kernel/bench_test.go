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
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
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

// benchFrames are the QUIC frames and limits the benchmarks share.
type benchFrames struct {
	// src is the frames' source, sid a server ID the benchmarks teach the
	// filter bound to it.
	src netip.Addr
	sid decide.ServerID
	// initial, short and junk: an Initial, a short header and 100 bytes
	// of zeros. Verifying: short headers to sid (the
	// established path of a real connection) and to an unknown ID
	// (stranger: from a proven peer, a client that moved to an ID it was
	// given encrypted; from anyone else, the unverified class, junk).
	initial, short, junk, verified, stranger []byte
	// quicPass and quicDrop are limits every datagram is under, and over.
	quicPass, quicDrop decide.Config
}

func newBenchFrames() benchFrames {
	src, sid := netip.MustParseAddr("198.51.100.7"), decide.ServerID{0x5e, 0x17, 0xa2, 0x09}
	withData := func(data []byte) []byte {
		p := udp(src.String(), 50000)
		p.Data = data
		return p.Bytes()
	}
	return benchFrames{
		src:      src,
		sid:      sid,
		initial:  withData(quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)),
		short:    withData(quicclasstest.ShortHeader(1200)),
		junk:     withData(make([]byte, 100)),
		verified: withData(quicclasstest.ShortPacket(sid, 1200)),
		stranger: withData(quicclasstest.ShortPacket(decide.ServerID{1, 2, 3, 4}, 100)),
		quicPass: testutil.QUICLimits(1_000_000, 1_000_000),
		quicDrop: testutil.QUICLimits(25, 25),
	}
}

// load loads the filter with c and o for a benchmark of the frames: sid is
// learned bound to src, src as a proven peer too if peer is set, and with
// o.xdp the frames' listener is set for the XDP program: a wildcard on
// port 443 of a host whose addresses are the frames' destinations (the
// engine lists a wildcard so).
func (bf benchFrames) load(b *testing.B, c decide.Config, o loadOptions, peer bool) *Program {
	b.Helper()
	f := loadTest(b, c, o)
	if err := f.LearnServerID(bf.sid, bf.src); err != nil {
		b.Fatal(err)
	}
	if peer {
		proveForTest(b, f, bf.src)
	}
	if o.xdp {
		if err := f.SetListeners([]netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:443"), netip.MustParseAddrPort("[::]:443")},
			[]netip.Addr{netip.MustParseAddr("127.0.0.1"), dst4, netip.MustParseAddr("::1"), dst6}); err != nil {
			b.Fatal(err)
		}
	}
	return f
}

// verifying returns c with verification by server ID on.
func verifying(c decide.Config) decide.Config { c.VerifyIDs = true; return c }

// BenchmarkFilter measures the filter per packet through BPF_PROG_TEST_RUN.
// ns/op is nanoseconds per packet; x-floor is the kernel-measured time per
// packet divided by that of the floor program in the same sub-benchmark.
// Each case runs the socket filter, and, as xdp-<case>, the XDP program on
// the same frames, listening on their port (against a floor XDP program);
// xdp-other-port is a frame to another port, which it passes untouched.
//
//	go test ./internal/kernel -run '^$' -bench BenchmarkFilter
func BenchmarkFilter(b *testing.B) {
	bf := newBenchFrames()
	v4 := udp(bf.src.String(), 5000).Bytes()
	v6 := udp("2001:db8:1:2::7", 5000).Bytes()
	initial, short, junk, verified, stranger := bf.initial, bf.short, bf.junk, bf.verified, bf.stranger
	verify := verifying
	// Every datagram alike (the filter before it knew QUIC), and by class.
	pass, drop := testutil.Limits(1_000_000), testutil.Limits(25)
	quicPass, quicDrop := bf.quicPass, bf.quicDrop
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
	otherPort := udp(bf.src.String(), 50000)
	otherPort.DstPort, otherPort.Data = 8080, quicclasstest.ShortHeader(1200)
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
				f := bf.load(b, bc.cfg, bc.opts, strings.TrimPrefix(bc.name, "xdp-") == "verified-peer-pass")
				prog = f.objs.Rakelimit
				if xdp {
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

// BenchmarkXDPAgainstSocket measures the XDP program against the socket
// filter per packet on the same frames, in rounds that alternate the two
// programs of one loaded object (their maps are shared, so both find the
// same state) and each hook's floor program, and reports the medians over
// the rounds of the ratio of their kernel-measured times, xdp/socket, and
// of the same net of each hook's floor (the cost of BPF_PROG_TEST_RUN
// itself, which differs between the hooks), net-xdp/socket: a drift of the
// machine's speed between rounds, which skews two sub-benchmarks run one
// after the other, cancels in each round's ratio.
//
//	go test ./internal/kernel -run '^$' -bench BenchmarkXDPAgainstSocket
func BenchmarkXDPAgainstSocket(b *testing.B) {
	bf := newBenchFrames()
	v6 := udp("2001:db8:1:2::7", 50000)
	v6.Data = quicclasstest.ShortHeader(1200)
	quicPass, quicDrop, verify := bf.quicPass, bf.quicDrop, verifying
	floors := [2]*ebpf.Program{floorProgram(b), xdpFloorProgram(b)}
	cases := []struct {
		name  string
		cfg   decide.Config
		frame []byte
		peer  bool
	}{
		{"opening-pass", quicPass, bf.initial, false},
		{"opening-drop", quicDrop, bf.initial, false},
		{"established-pass", quicPass, bf.short, false},
		{"established-drop", quicDrop, bf.short, false},
		{"ipv6-established-pass", quicPass, v6.Bytes(), false},
		{"invalid-drop", quicPass, bf.junk, false},
		{"verified-pass", verify(quicPass), bf.verified, false},
		{"verified-peer-pass", verify(quicPass), bf.stranger, true},
		{"unverified-drop", verify(quicPass), bf.stranger, false},
	}
	const rounds, perRound = 15, 20000
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			f := bf.load(b, bc.cfg, loadOptions{xdp: true}, bc.peer)
			// The socket filter, its floor, the XDP program, its floor.
			progs := [4]*ebpf.Program{f.objs.Rakelimit, floors[0], f.objs.RakelimitXdp, floors[1]}
			// Warm up: a flood must be over its limit before timing.
			for _, p := range progs {
				if _, _, err := p.Benchmark(bc.frame, 100000, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			var ratios, net, socket, xdp []float64
			for i := 0; i < b.N; i++ {
				ratios, net, socket, xdp = ratios[:0], net[:0], socket[:0], xdp[:0]
				for r := range rounds {
					var per [4]float64
					// Each round starts with another program.
					for j := range progs {
						k := (j + r) % len(progs)
						_, d, err := progs[k].Benchmark(bc.frame, perRound, nil)
						if err != nil {
							b.Fatal(err)
						}
						per[k] = float64(d.Nanoseconds())
					}
					socket, xdp = append(socket, per[0]), append(xdp, per[2])
					if per[0] > 0 {
						ratios = append(ratios, per[2]/per[0])
					}
					if per[0] > per[1] {
						net = append(net, (per[2]-per[3])/(per[0]-per[1]))
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(testutil.Median(socket), "socket-ns/op")
			b.ReportMetric(testutil.Median(xdp), "xdp-ns/op")
			b.ReportMetric(testutil.Median(ratios), "xdp/socket")
			b.ReportMetric(testutil.Median(net), "net-xdp/socket")
		})
	}
}
