//go:build linux

package kernel

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// twin runs the BPF program (in test mode) and the Go twin (decide.Filter)
// side by side on the same packets, time and random numbers, and fails the
// test at the first difference. The program runs twice, in two filters: f
// runs the socket filter alone (mode bpf), x the path of mode xdp, the XDP
// program and then, unless it dropped the datagram, the socket filter
// (runPath), with the XDP program listening on every port of both
// families. Both must agree with the Go twin, and so with each other.
type twin struct {
	t      testing.TB
	f, x   *Program
	d      *decide.Filter
	packet int
}

func newTwin(t testing.TB, c decide.Config) *twin {
	t.Helper()
	hk := sketch.SeededHashKey(7)
	f := loadTest(t, c, loadOptions{testMode: true, hashKey: &hk})
	x := loadTest(t, c, loadOptions{testMode: true, hashKey: &hk, xdp: true})
	listenEverywhere(t, x)
	d, err := decide.New(c, hk)
	if err != nil {
		t.Fatal(err)
	}
	return &twin{t: t, f: f, x: x, d: d}
}

// filters are the twin's two filters, with the names of what they run.
func (w *twin) filters() []struct {
	name string
	f    *Program
} {
	return []struct {
		name string
		f    *Program
	}{{"the socket filter", w.f}, {"XDP and the socket filter", w.x}}
}

// configure applies c to both.
func (w *twin) configure(c decide.Config) {
	w.t.Helper()
	for _, f := range w.filters() {
		if err := f.f.Configure(c); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := w.d.Update(c); err != nil {
		w.t.Fatal(err)
	}
}

// decided is what the program records as its decision: the drop before a
// dry run delivers the datagram anyway.
func decided(o decide.Outcome) bool {
	return o.Class == quicclass.Invalid || !o.Paced || o.Verdict.Drop
}

// step sends p through both; d is what the filter should read of it.
func (w *twin) step(p testutil.Frame, d decide.Datagram, now int64, rnd uint32) decide.Outcome {
	w.t.Helper()
	want, err := w.stepFrame(p.Bytes(), d, now, rnd)
	if err != nil {
		w.t.Fatalf("packet %d (%v:%d, key %+v, %d bytes) at %d: %v", w.packet, p.Src, p.SrcPort, d.Key, d.Length, now, err)
	}
	return want
}

// stepFrame sends an Ethernet frame through both; d is what the filter
// should read of it. It returns the Go twin's outcome and an error when the
// program's verdict differs.
func (w *twin) stepFrame(frame []byte, d decide.Datagram, now int64, rnd uint32) (decide.Outcome, error) {
	w.t.Helper()
	w.packet++
	got := w.f.run(w.t, frame, now, rnd)
	viaXDP := w.x.runPath(w.t, frame, now, rnd)
	want := w.d.Decide(&d, now, rnd)
	if !sameVerdict(got, want) {
		return want, fmt.Errorf("BPF %+v, Go %+v", got, want)
	}
	if !sameVerdict(viaXDP.v, want) {
		return want, fmt.Errorf("mode xdp (decided by %s): BPF %+v, Go %+v", viaXDP.by, viaXDP.v, want)
	}
	return want, nil
}

// sameVerdict compares the program's recorded verdict with the Go twin's
// outcome.
func sameVerdict(got rakelimitVerdict, want decide.Outcome) bool {
	v := want.Verdict
	return (got.Drop == 1) == decided(want) && quicclass.Class(got.Class) == want.Class &&
		quicclass.Reason(got.Reason) == want.Reason && quicclass.Verification(got.Verified) == want.Verified &&
		(got.Allowlisted == 1) == want.Allowlisted &&
		(got.Paced == 1) == want.Paced && (got.Limited == 1) == v.Limited &&
		(!v.Limited || (int(got.Level) == v.Level && sketch.Node(got.Node) == v.Node && got.Estimate == v.Estimate))
}

// learnID learns a server ID bound to to in both at time at.
func (w *twin) learnID(id decide.ServerID, to netip.Addr, at int64) {
	w.t.Helper()
	for _, f := range w.filters() {
		if err := f.f.learned.LearnServerID(&f.f.hk, id, to, at); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := w.d.LearnServerID(id, to, at); err != nil {
		w.t.Fatal(err)
	}
}

// learnPeer learns a peer in both at time at.
func (w *twin) learnPeer(addr netip.Addr, at int64) {
	w.t.Helper()
	for _, f := range w.filters() {
		if err := f.f.learned.LearnPeer(&f.f.hk, addr, at); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := w.d.LearnPeer(addr, at); err != nil {
		w.t.Fatal(err)
	}
}

// grant grants credits to addr in both.
func (w *twin) grant(addr netip.Addr, credits int) {
	w.t.Helper()
	for _, f := range w.filters() {
		if err := f.f.learned.Grant(&f.f.hk, addr, credits); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := w.d.Grant(addr, credits); err != nil {
		w.t.Fatal(err)
	}
}

// expire expires in both what was neither learned nor used for lifetime
// before now, and checks that they forget as much.
func (w *twin) expire(now, lifetime int64) {
	w.t.Helper()
	want := w.d.ExpireLearned(now, lifetime)
	for _, f := range w.filters() {
		if got := f.f.learned.Expire(now, decide.LifetimeStamps(lifetime)); got != want {
			w.t.Fatalf("expiry at %d: BPF (%s) forgot %v of each learned set, Go %v", now, f.name, got, want)
		}
	}
}

// compareLearned checks that the kernel's learned sets and the Go twin's
// hold the same slots and quick-reject filters.
func (w *twin) compareLearned() {
	w.t.Helper()
	want := w.d.Learned().Sets()
	for _, f := range w.filters() {
		got := f.f.learned.Sets()
		for i := range got {
			gs, gq := got[i].Snapshot()
			ws, wq := want[i].Snapshot()
			for j := range ws {
				if gs[j] != ws[j] {
					w.t.Fatalf("after packet %d: %s: learned set %d, slot %d: BPF %#x, Go %#x", w.packet, f.name, i, j, gs[j], ws[j])
				}
			}
			if !slices.Equal(gq, wq) {
				w.t.Fatalf("after packet %d: %s: learned set %d: the quick-reject filters differ", w.packet, f.name, i)
			}
		}
		gc, wc := f.f.learned.Credit.Snapshot(), w.d.Learned().Credit.Snapshot()
		for j := range wc {
			if gc[j] != wc[j] {
				w.t.Fatalf("after packet %d: %s: credit of answered slot %d: BPF %d, Go %d", w.packet, f.name, j, gc[j], wc[j])
			}
		}
	}
}

// compareState checks every sketch cell, the fair shares and the total's
// pending counts (of the CPU the test runs the program on), the pacer, the
// learned server IDs and peers with their times, and the counters, of both
// filters.
func (w *twin) compareState() {
	w.t.Helper()
	w.compareLearned()
	for _, f := range w.filters() {
		w.compareFilter(f.name, f.f)
	}
}

// compareFilter checks the state of one filter against the Go twin's.
func (w *twin) compareFilter(name string, f *Program) {
	w.t.Helper()
	got, want := f.lines(w.t), w.d.Limiter().Lines()
	if len(got) != len(want) {
		w.t.Fatalf("%s: BPF has %d lines, Go %d", name, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			w.t.Fatalf("after packet %d: %s: line %d differs: BPF %+v, Go %+v", w.packet, name, i, got[i], want[i])
		}
	}
	if fs := f.fairShares(w.t); fs != w.d.Limiter().FairShares() {
		w.t.Fatalf("after packet %d: %s: fair shares BPF %v, Go %v", w.packet, name, fs, w.d.Limiter().FairShares())
	}
	if p := f.pending(w.t); p != w.d.Limiter().Pending() {
		w.t.Fatalf("after packet %d: %s: the total's pending counts BPF %+v, Go %+v", w.packet, name, p, w.d.Limiter().Pending())
	}
	for _, p := range []struct {
		slot uint32
		name string
		want uint64
	}{
		{pacerNegotiation, "negotiation", w.d.PacerTAT()},
		{pacerProof, "proof", w.d.ProofTAT()},
		{pacerReturning, "returning", w.d.Limiter().ReturningTAT()},
	} {
		var tat uint64
		if err := f.objs.Pacer.Lookup(p.slot, &tat); err != nil {
			w.t.Fatal(err)
		}
		if tat != p.want {
			w.t.Fatalf("after packet %d: %s: %s pacer BPF %d, Go %d", w.packet, name, p.name, tat, p.want)
		}
	}
	st, err := f.Stats()
	if err != nil {
		w.t.Fatal(err)
	}
	if st != w.d.Stats() {
		w.t.Fatalf("after packet %d: %s: counters %+v, want %+v", w.packet, name, st, w.d.Stats())
	}
}

// TestParse feeds frames of every shape the parser must handle and checks
// that the program keyed each exactly as expected: the whole sketch state
// must equal the Go limiter's given the expected key. (BPF_PROG_TEST_RUN
// refuses frames whose IP header is cut short, and no UDP socket receives
// one, so those are left out.)
func TestParse(t *testing.T) {
	v4, v6 := udp("198.51.100.1", 1111), udp("2001:db8:1:2::3", 2222)
	with := func(p testutil.Frame, fn func(*testutil.Frame)) testutil.Frame { fn(&p); return p }
	unknown := sketch.Key{Family: sketch.Unknown}
	tests := []struct {
		name     string
		p        testutil.Frame
		hasPorts bool
		key      *sketch.Key // overrides p.Key(hasPorts)
	}{
		{"ipv4", v4, true, nil},
		{"ipv4 port 0", with(v4, func(p *testutil.Frame) { p.SrcPort = 0 }), true, nil},
		{"ipv4 port 65535", with(v4, func(p *testutil.Frame) { p.SrcPort = 65535; p.DstPort = 65535 }), true, nil},
		{"ipv4 options", with(v4, func(p *testutil.Frame) { p.IPv4Options = 1 }), true, nil},
		{"ipv4 max options", with(v4, func(p *testutil.Frame) { p.IPv4Options = 10 }), true, nil},
		{"ipv4 first fragment", with(v4, func(p *testutil.Frame) { p.IPv4FragOffset = 0x2000 }), true, nil},
		{"ipv4 later fragment", with(v4, func(p *testutil.Frame) { p.IPv4FragOffset = 0x2000 | 185 }), false, nil},
		{"ipv4 udplite", with(v4, func(p *testutil.Frame) { p.Proto = unix.IPPROTO_UDPLITE }), true, nil},
		{"ipv4 tcp", with(v4, func(p *testutil.Frame) { p.Proto = unix.IPPROTO_TCP }), false, nil},
		{"ipv4 header only", with(v4, func(p *testutil.Frame) { p.Truncate = testutil.IPv4HdrLen }), false, nil},
		{"ipv4 header and half a port", with(v4, func(p *testutil.Frame) { p.Truncate = testutil.IPv4HdrLen + 3 }), false, nil},
		{"ipv4 options, ports cut", with(v4, func(p *testutil.Frame) { p.IPv4Options = 2; p.Truncate = testutil.IPv4HdrLen + 10 }), false, nil},
		{"ipv6", v6, true, nil},
		{"ipv6 hop-by-hop", with(v6, func(p *testutil.Frame) { p.IPv6Ext = []testutil.IPv6Ext{{Kind: unix.IPPROTO_HOPOPTS}} }), true, nil},
		{"ipv6 every extension", with(v6, func(p *testutil.Frame) {
			p.IPv6Ext = []testutil.IPv6Ext{{Kind: unix.IPPROTO_HOPOPTS, Units: 1}, {Kind: unix.IPPROTO_ROUTING, Units: 2},
				{Kind: unix.IPPROTO_DSTOPTS}, {Kind: unix.IPPROTO_FRAGMENT}, {Kind: unix.IPPROTO_AH, Units: 4},
				{Kind: unix.IPPROTO_DSTOPTS, Units: 3}}
		}), true, nil},
		{"ipv6 too many extensions", with(v6, func(p *testutil.Frame) {
			for range 7 {
				p.IPv6Ext = append(p.IPv6Ext, testutil.IPv6Ext{Kind: unix.IPPROTO_DSTOPTS})
			}
		}), false, nil},
		{"ipv6 later fragment", with(v6, func(p *testutil.Frame) {
			p.IPv6Ext = []testutil.IPv6Ext{{Kind: unix.IPPROTO_FRAGMENT, FragOffset: 100}}
		}), false, nil},
		{"ipv6 tcp", with(v6, func(p *testutil.Frame) { p.Proto = unix.IPPROTO_TCP }), false, nil},
		{"ipv6 header only", with(v6, func(p *testutil.Frame) { p.Truncate = testutil.IPv6HdrLen }), false, nil},
		{"ipv6 extension cut", with(v6, func(p *testutil.Frame) {
			p.IPv6Ext = []testutil.IPv6Ext{{Kind: unix.IPPROTO_HOPOPTS}}
			p.Truncate = testutil.IPv6HdrLen + 2
		}), false, nil},
		{"not ip", with(v4, func(p *testutil.Frame) { p.EtherType = 0x88b5 }), false, &unknown},
	}
	for _, size := range []int{0, 1, 7, 8, 35, 36, 64, 1200, 1350} {
		tests = append(tests,
			struct {
				name     string
				p        testutil.Frame
				hasPorts bool
				key      *sketch.Key
			}{fmt.Sprintf("ipv4 payload %d", size), with(v4, func(p *testutil.Frame) { p.Payload = size }), true, nil},
			struct {
				name     string
				p        testutil.Frame
				hasPorts bool
				key      *sketch.Key
			}{fmt.Sprintf("ipv6 payload %d", size), with(v6, func(p *testutil.Frame) { p.Payload = size }), true, nil},
		)
	}
	all, classes := newTwin(t, testutil.Limits(1000)), newTwin(t, testutil.QUICLimits(1000, 1000))
	now := start
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A distinct source per case, so that each lands in its own cells.
			tt.p.SrcPort += uint16(i)
			d := tt.p.Datagram(tt.hasPorts)
			if tt.key != nil {
				d = decide.Datagram{Key: *tt.key}
			}
			now += int64(time.Millisecond)
			if tt.p.EtherType == 0 {
				// The Go twin of the parser reads the same.
				got := decide.Parse(tt.p.Bytes()[testutil.EthHdrLen:], tt.p.Src.Is6())
				if !sameDatagram(got, d) {
					t.Fatalf("decide.Parse read %+v, want %+v", got, d)
				}
			}
			for _, w := range []*twin{all, classes} {
				w.t = t
				w.step(tt.p, d, now, uint32(i))
				w.compareState()
			}
		})
	}
}

// sameDatagram compares what two parsers read of a datagram.
func sameDatagram(a, b decide.Datagram) bool {
	return a.Key == b.Key && a.Length == b.Length && bytes.Equal(a.Probe, b.Probe)
}

// quicPayloads builds one datagram of each kind the classifier tells apart,
// sizes drawn from rng.
func quicPayloads(rng *rand.Rand) [][]byte {
	big := func() int { return 1200 + rng.IntN(152) }
	junk := make([]byte, 40+rng.IntN(200))
	for i := range junk {
		junk[i] = byte(rng.Uint32()) &^ 0xc0 // fixed bit 0
	}
	return [][]byte{
		quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, big()), // Initial
		quicclasstest.LongHeader(quicclass.Version2, 1, 8, 8, big()), // v2 Initial
		quicclasstest.LongHeader(quicclass.Version1, 1, 8, 0, 60),    // 0-RTT
		quicclasstest.LongHeader(quicclass.Version1, 2, 4, 8, 90),    // Handshake
		quicclasstest.ShortHeader(21 + rng.IntN(1330)),               // 1-RTT
		quicclasstest.ShortHeader(30),                                // 1-RTT, an ACK
		junk,                                                         // not QUIC
		quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 800),   // small Initial
		quicclasstest.LongHeader(0x1a2a3a4a, 0, 8, 8, big()),         // unknown version
		quicclasstest.LongHeader(0x1a2a3a4a, 0, 8, 8, 300),           // small unknown version
		quicclasstest.LongHeader(quicclass.Version1, 3, 8, 8, 100),   // Retry
		quicclasstest.LongHeader(0, 0, 8, 8, 100),                    // Version Negotiation
		quicclasstest.LongHeader(quicclass.Version1, 2, 21, 8, 100),  // connection ID too long
		quicclasstest.LongHeader(quicclass.Version1, 2, 8, 8, 12),    // truncated
		quicclasstest.ShortHeader(15),                                // short header too short
		{},                                                           // empty
	}
}

// TestDifferential runs a long random trace through the program and the Go
// twin: datagrams of every class and reason from both families and blocked
// ports, unparsable packets, a configuration change and a dry run in the
// middle, idle times that exercise every decay table, clock readings older
// than the cells they touch (another CPU moved them on), and a total over
// its limit, where the fair share decides.
func TestDifferential(t *testing.T) {
	for _, perDstPort := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-dport=%v", perDstPort), func(t *testing.T) {
			c := testutil.QUICLimits(50, 200)
			c.Limiter.Window, c.Limiter.PerDstPort = 500*time.Millisecond, perDstPort
			// Networks and ports unlimited, so that enough reaches the
			// total for its fair share to decide.
			top := c.Limiter.WithDefaults().Levels() - 1
			c.Limiter.LevelLimits = map[int]uint32{top: 400}
			for l := 2; l < top; l++ {
				c.Limiter.LevelLimits[l] = sketch.Unlimited
			}
			// Allowlisted prefixes among the sources, blocked ports
			// among theirs: the allowlist exempts from the limiter, not
			// from validity.
			allow := []netip.Prefix{netip.MustParsePrefix("198.51.1.0/27"), netip.MustParsePrefix("192.0.2.0/27"),
				netip.MustParsePrefix("2001:db8:1:1::/64")}
			c.Allow = allow
			allowInvalid, allowed := 0, 0
			w := newTwin(t, c)
			rng := rand.New(rand.NewPCG(3, 4))
			var pool []testutil.Frame
			for i := range 300 {
				var p testutil.Frame
				switch i % 4 {
				case 0:
					p = udp(fmt.Sprintf("198.51.%d.%d", rng.IntN(4), rng.IntN(256)), uint16(1024+rng.IntN(64000)))
				case 1:
					p = udp(fmt.Sprintf("2001:db8:%x:%x::%x", rng.IntN(3), rng.IntN(4), rng.IntN(1<<16)), uint16(1024+rng.IntN(64000)))
				case 2:
					p = udp("203.0.113.9", uint16(40000+rng.IntN(8)))
				default: // sometimes from a blocked port
					p = udp(fmt.Sprintf("192.0.2.%d", rng.IntN(256)), uint16(rng.IntN(2000)))
				}
				p.DstPort = 443 + uint16(rng.IntN(2))
				kinds := quicPayloads(rng)
				p.Data = kinds[rng.IntN(len(kinds))]
				pool = append(pool, p)
			}
			heavy := pool[2]
			heavy.Data = quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
			unparsed := udp("192.0.2.1", 1)
			unparsed.EtherType = 0x88b5
			now := start
			for i := range 40000 {
				switch i {
				case 20000:
					c.Limiter.Limit, c.Limiter.Window, c.Negotiation = 80, 2*time.Second, 5
					c.Limiter.Established.LevelLimits = map[int]uint32{top: sketch.Unlimited}
					w.configure(c)
				case 30000:
					c.DryRun = true
					w.configure(c)
				}
				at := now
				switch {
				case i%5000 == 4999: // long idle times exercise every decay table
					now += []int64{int64(700 * time.Millisecond), int64(3 * time.Second), int64(400 * time.Second), int64(50 * time.Hour)}[i/5000%4]
					at = now
				case i%20 == 7: // an older reading, just before this epoch
					at = now>>sketch.EpochShift<<sketch.EpochShift - 200
				default:
					now += int64(rng.ExpFloat64() * 20e3)
					at = now
				}
				var p testutil.Frame
				var d decide.Datagram
				switch r := rng.IntN(100); {
				case r < 40:
					p = heavy
				case r < 42:
					p, d = unparsed, decide.Datagram{Key: sketch.Key{Family: sketch.Unknown}}
				default:
					p = pool[rng.IntN(len(pool))]
				}
				if p.EtherType == 0 {
					d = p.Datagram(true)
				}
				out := w.step(p, d, at, rng.Uint32())
				if out.Allowlisted {
					allowed++
				}
				if out.Class == quicclass.Invalid && d.Key.Family != sketch.Unknown &&
					slices.ContainsFunc(allow, func(a netip.Prefix) bool { return a.Contains(d.Key.Addr()) }) {
					allowInvalid++
				}
				if i%10000 == 9999 {
					w.compareState()
				}
			}
			w.compareState()
			st := w.d.Stats()
			var invalid, negotiation, fair uint64
			for fam := range decide.Families {
				for r := range quicclass.NumReasons {
					invalid += st.Invalid[0][fam][r] + st.Invalid[1][fam][r]
				}
				negotiation += st.Negotiation[fam][0] + st.Negotiation[fam][1] + st.Negotiation[fam][2]
				fair += st.Dropped[quicclass.Opening][fam][top] + st.WouldDrop[quicclass.Opening][fam][top]
			}
			if allowed == 0 || allowInvalid == 0 {
				t.Fatalf("the trace missed the allowlist: %d allowlisted, %d invalid from allowlisted prefixes", allowed, allowInvalid)
			}
			if invalid == 0 || negotiation == 0 || fair == 0 || st.Passed[quicclass.Established][1] == 0 {
				t.Fatalf("the trace missed a path: invalid %d, negotiation %d, drops at the total %d, established passed %d",
					invalid, negotiation, fair, st.Passed[quicclass.Established][1])
			}
		})
	}
}

// TestDifferentialSpoofed runs floods of a new random source address on
// every packet through the program and the Go twin, ten times the total's
// cap, with a quiet /24 sending among them: a spoofed flood (a random port
// too) over the total, and a reflection flood (one source port) over the
// reflection node. Every verdict, counter and cell must agree, and the Go
// twin must have screened most drops (the source's most specific node left
// as it was), so that the program did too. Under the spoofed flood every
// /24 looks alike and the quiet one heavier, so the fair share admits it at
// a small fraction of the proportional share; the proportional floor
// (sketch.admitFair) lifts it: packets that pass the total without being
// counted forwarded there. The quiet /24 must keep about cap / offered of
// its packets (10%, so 15 of the 150 it sends after the first second;
// without the floor, none). The reflection flood reaches the total as
// limited traffic, and the quiet /24 keeps nearly everything.
func TestDifferentialSpoofed(t *testing.T) {
	tests := []struct {
		name     string
		port     func(*rand.Rand) uint16
		keptLow  int
		keptHigh int
	}{
		{"spoofed", func(rng *rand.Rand) uint16 { return uint16(1024 + rng.IntN(64000)) }, 5, 40},
		{"reflection", func(*rand.Rand) uint16 { return 53 }, 140, 150},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testutil.Limits(1000)
			top := c.Limiter.WithDefaults().Levels() - 1
			c.Limiter.LevelLimits = map[int]uint32{top: 400}
			w := newTwin(t, c)
			lim := w.d.Limiter()
			n0 := lim.Params().Nodes[0]
			rng := rand.New(rand.NewPCG(8, 8))
			const floodPPS, quietPPS, seconds = 4000, 50, 4
			now := start
			sent, kept, drops, screened := 0, 0, 0, 0
			for i := range floodPPS * seconds {
				now += int64(time.Second) / floodPPS
				a := netip.AddrFrom4([4]byte{10, byte(128 + rng.IntN(128)), byte(rng.IntN(256)), byte(rng.IntN(256))})
				p := udp(a.String(), tt.port(rng))
				d := p.Datagram(true)
				before := lim.Estimate(&d.Key, int(quicclass.Opening), n0, sketch.Clean, now)
				if o := w.step(p, d, now, rng.Uint32()); o.Verdict.Drop {
					drops++
					if lim.Estimate(&d.Key, int(quicclass.Opening), n0, sketch.Clean, now) == before {
						screened++
					}
				}
				if i%(floodPPS/quietPPS) != 0 {
					continue
				}
				q := udp("192.0.2.10", uint16(1024+rng.IntN(64000)))
				o := w.step(q, q.Datagram(true), now, rng.Uint32())
				if now-start > int64(time.Second) {
					sent++
					if !o.Verdict.Drop {
						kept++
					}
				}
				if i%(floodPPS/2) == 0 {
					w.compareState()
				}
			}
			w.compareState()
			if kept < tt.keptLow || kept > tt.keptHigh {
				t.Fatalf("the quiet /24 kept %d of %d packets after the first second, want %d to %d", kept, sent, tt.keptLow, tt.keptHigh)
			}
			if screened < drops/2 {
				t.Fatalf("the screen decided %d of %d drops, want at least half", screened, drops)
			}
			t.Logf("the quiet /24 kept %d of %d packets after the first second; the screen decided %d of %d drops",
				kept, sent, screened, drops)
		})
	}
}

// TestLatticeNodes sends, for each lattice node of each family, a flood
// shaped to be caught at exactly that node, and checks that both the program
// and the Go limiter drop it there. Every more specific stream of the flood
// sends a third of the limit; together they send 40 times the limit. In the
// second of the flood no more pass than the burst, the noise margin, a second
// at the limit and, at the total, what passes while its fair share settles
// (up to another limit's worth).
func TestLatticeNodes(t *testing.T) {
	const limit, n = 100, 4000
	type shape struct {
		node sketch.Node
		addr func(a, b int) string // a, b: two counters cycling through 128 values each, in a different order
		port func(a, b int) uint16
	}
	fixed := func(p uint16) func(int, int) uint16 { return func(int, int) uint16 { return p } }
	shapes := map[string][]shape{
		"ipv4": {
			{sketch.NewNode(0, false, false), func(a, b int) string { return "198.51.100.7" }, fixed(5000)},
			{sketch.NewNode(0, true, false), func(a, b int) string { return "198.51.100.7" }, func(a, b int) uint16 { return uint16(1000 + a) }},
			{sketch.NewNode(1, false, false), func(a, b int) string { return fmt.Sprintf("198.51.100.%d", a) }, fixed(5000)},
			{sketch.NewNode(1, true, false), func(a, b int) string { return fmt.Sprintf("198.51.100.%d", a) }, func(a, b int) uint16 { return uint16(1000 + b) }},
			{sketch.NewNode(2, false, false), func(a, b int) string { return fmt.Sprintf("198.51.%d.7", a) }, fixed(53)},
			{sketch.NewNode(2, true, false), func(a, b int) string { return fmt.Sprintf("198.51.%d.7", a) }, func(a, b int) uint16 { return uint16(1000 + b) }},
		},
		"ipv6": {
			{sketch.NewNode(0, false, false), func(a, b int) string { return "2001:db8:1:2::7" }, fixed(5000)},
			{sketch.NewNode(0, true, false), func(a, b int) string { return "2001:db8:1:2::7" }, func(a, b int) uint16 { return uint16(1000 + a) }},
			{sketch.NewNode(1, false, false), func(a, b int) string { return fmt.Sprintf("2001:db8:1:%x::7", a) }, fixed(5000)},
			{sketch.NewNode(1, true, false), func(a, b int) string { return fmt.Sprintf("2001:db8:1:%x::7", a) }, func(a, b int) uint16 { return uint16(1000 + b) }},
			{sketch.NewNode(2, false, false), func(a, b int) string { return fmt.Sprintf("2001:db8:%x::7", a) }, fixed(53)},
			{sketch.NewNode(2, true, false), func(a, b int) string { return fmt.Sprintf("2001:db8:%x::7", a) }, func(a, b int) uint16 { return uint16(1000 + b) }},
		},
	}
	c := testutil.Limits(limit)
	p, _ := sketch.Compile(c.Limiter)
	for fam, list := range shapes {
		for _, s := range list {
			want := s.node.Describe(p, map[string]sketch.Family{"ipv4": sketch.IPv4, "ipv6": sketch.IPv6}[fam])
			t.Run(fam+" "+want, func(t *testing.T) {
				w := newTwin(t, c)
				rng := rand.New(rand.NewPCG(5, 5))
				drops := map[string]int{}
				now := start
				for i := range n {
					now += int64(time.Second) / n
					a, b := i%128, i*41%128
					pk := udp(s.addr(a, b), s.port(a, b))
					if v := w.step(pk, pk.Datagram(true), now, rng.Uint32()).Verdict; v.Drop {
						drops[v.Node.Describe(p, pk.Key(true).Family)]++
					}
				}
				w.compareState()
				// At the total, the forwarded count may reach twice the
				// limit while the fair share settles (sketch.FairSlack).
				minDrops := n - 3*limit
				if s.node == p.Nodes[p.FairNode] {
					minDrops = n - 4*limit
				}
				if len(drops) != 1 || drops[want] < minDrops {
					t.Fatalf("drops by node %v, want at least %d, all at %s", drops, minDrops, want)
				}
			})
		}
	}
}

// TestConfigureErrors: a live filter refuses a new lattice, bad values and
// more allowlist prefixes than it holds, and keeps its configuration, its
// allowlist and its active slot.
func TestConfigureErrors(t *testing.T) {
	good := testutil.Limits(100)
	good.Allow = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	f := loadTest(t, good, loadOptions{})
	before, active := f.Params(), f.active
	tooMany := withAllow(testutil.Limits(5000), prefixes(1, 1100), false)
	perDport := testutil.Limits(100)
	perDport.Limiter.PerDstPort = true
	tests := []struct {
		name string
		c    decide.Config
		want string
	}{
		{"new lattice", perDport, "cannot change the lattice"},
		{"zero limit", testutil.Limits(0), "limit 0 out of range"},
		{"tiny window", decide.Config{Limiter: sketch.Config{Limit: 100, Window: time.Nanosecond}}, "window 1ns out of range"},
		{"allowlist over capacity", tooMany, "allow: 1100 IPv4 prefixes, more than the filter holds (at most 1024 per family)"},
		{"negotiation", decide.Config{Limiter: good.Limiter, Negotiation: decide.MaxNegotiation + 1}, "version negotiation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := f.Configure(tt.c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Configure: %v, want an error containing %q", err, tt.want)
			}
			if f.Params() != before || f.active != active || f.Config().Limiter.Limit != 100 {
				t.Fatal("a refused configuration changed the filter")
			}
			if n := countAllow(t, f); n != 1 {
				t.Fatalf("the allowlist holds %d prefixes after a refused configuration, want 1", n)
			}
		})
	}
	if _, err := load(decide.Config{Limiter: sketch.Config{Limit: 100}}, loadOptions{}); err == nil {
		t.Fatal("load with no window accepted")
	}
}

// countAllow counts the entries of both allowlist tries.
func countAllow(t *testing.T, f *Program) int {
	t.Helper()
	n := 0
	var k4 rakelimitAllow4Key
	var k6 rakelimitAllow6Key
	var v uint8
	for it := f.objs.Allow4.Iterate(); it.Next(&k4, &v); {
		n++
	}
	for it := f.objs.Allow6.Iterate(); it.Next(&k6, &v); {
		n++
	}
	return n
}

// TestConfigureRollsBack: a configuration that fails half way (here, one
// more prefix than the trie holds slips past the capacity check because the
// trie is full of entries the check does not know) leaves no new prefix
// behind and the old configuration in force.
func TestConfigureRollsBack(t *testing.T) {
	f := loadTest(t, testutil.Limits(100), loadOptions{})
	// Fill the IPv4 trie behind the filter's back.
	for i := range decide.MaxAllow {
		e := allowEntry{bits: 32, addr: netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}).As16()}
		if err := f.allowAdd(e); err != nil {
			t.Fatal(err)
		}
	}
	c := testutil.Limits(5000)
	c.Allow = []netip.Prefix{netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("198.51.100.0/24")}
	err := f.Configure(c)
	if err == nil || !strings.Contains(err.Error(), "adding") {
		t.Fatalf("Configure into a full trie: %v", err)
	}
	if f.Config().Limiter.Limit != 100 || countAllow(t, f) != decide.MaxAllow {
		t.Fatalf("after the failure: limit %d, %d allowlist entries (want 100 and %d)", f.Config().Limiter.Limit,
			countAllow(t, f), decide.MaxAllow)
	}
}

// TestInfo: the sketches of the three classes fit in 1 MiB with the default
// lattice, and a socket pays little option memory for the filter.
func TestInfo(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(1000, 250_000), loadOptions{})
	in, err := f.Info()
	if err != nil {
		t.Fatal(err)
	}
	if in.Instructions < 100 || in.SketchBytes > 1<<20 || in.SketchBytes != f.Params().TotalLines*sketch.LineBytes {
		t.Fatalf("info %+v: want instructions > 100 and sketches of at most 1 MiB", in)
	}
	// The kernel charges an attached filter to the socket's option memory
	// (net.core.optmem_max): measure it. The bound keeps it well within
	// the 128 KB that Linux 6.12 and later allow (older kernels' 20 KB
	// needs raising whatever the filter's size; the README says so).
	conn := testutil.Listen(t, "udp4", "127.0.0.1:0")
	before := optmem(t, conn)
	if err := f.Attach(conn); err != nil {
		t.Fatal(err)
	}
	charged := optmem(t, conn) - before
	if charged <= 0 || charged > 72<<10 {
		t.Fatalf("attaching charged %d bytes of optmem", charged)
	}
	t.Logf("program: %d instructions; maps: %d bytes (sketches %d); optmem per socket: %d bytes",
		in.Instructions, in.MapBytes, in.SketchBytes, charged)
}

// optmem reads SK_MEMINFO_OPTMEM of a socket.
func optmem(t testing.TB, conn *net.UDPConn) int {
	t.Helper()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info [unix.SK_MEMINFO_VARS]uint32
	var serr error
	err = raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(info))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			serr = errno
		}
	})
	if err != nil || serr != nil {
		t.Fatalf("SO_MEMINFO: %v %v", err, serr)
	}
	return int(info[unix.SK_MEMINFO_OPTMEM])
}

// TestDimensions: the loader sizes the sketch map for the largest lattice,
// and the program reaches its last line, which belongs to the last class's
// total (a short map would count every packet as an error): datagrams of
// every class of the limiter, with verification.
func TestDimensions(t *testing.T) {
	c := testutil.QUICLimits(100, 1000)
	c.VerifyIDs = true
	c.Limiter.PerDstPort = true
	c.Limiter.IPv4Prefixes, c.Limiter.IPv6Prefixes = []uint8{32, 24, 16, 0}, []uint8{128, 64, 48, 0}
	w := newTwin(t, c)
	if got, want := int(w.f.objs.Cells.MaxEntries()), w.d.Limiter().Params().TotalLines; got != want {
		t.Fatalf("cells map has %d lines, want %d", got, want)
	}
	sid := decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	payloads := [sketch.NumClasses][]byte{
		quicclasstest.LongPacket(quicclass.Version1, 0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, nil, 1200),
		quicclasstest.ShortPacket(sid, 100),
		quicclasstest.ShortPacket(decide.ServerID{1, 2, 3, 4}, 100),
	}
	for i := range 2000 {
		p := udp(fmt.Sprintf("2001:db8:%x::%x", i, i), uint16(2000+i))
		p.Data = payloads[i%sketch.NumClasses]
		if i%sketch.NumClasses == int(quicclass.Established) { // the ID was sent to this source
			w.learnID(sid, p.Src, start+int64(i)*1000)
		}
		w.step(p, p.Datagram(true), start+int64(i)*1000, uint32(i))
	}
	w.compareState()
	st, _ := w.f.Stats()
	if st.Errors != 0 {
		t.Fatalf("%d packets could not reach their cells", st.Errors)
	}
	lines, params := w.f.lines(t), w.d.Limiter().Params()
	last := params.Base[quicclass.Unverified][len(params.Nodes)-1] + sketch.Depth - 1
	if l := lines[last]; l.Cells[0].Epoch == 0 && l.Cells[1].Epoch == 0 && l.Cells[2].Epoch == 0 {
		t.Fatal("the unverified class's total's last line was never touched")
	}
	if params.ReturningLine != uint32(len(lines)-1) {
		t.Fatalf("the returning part's line is %d of %d", params.ReturningLine, len(lines))
	}
	for class := range sketch.NumClasses {
		if st.Passed[class][decide.FamilyIndex(sketch.IPv6)] == 0 {
			t.Fatalf("no datagram passed in class %d: %+v", class, st.Passed)
		}
	}
}

// TestVerifierBudget keeps each program's verification well under the
// kernel's limit of a million instructions: a change that makes the node
// loop's paths multiply shows up here before it breaks loading on a kernel
// whose verifier prunes less.
func TestVerifierBudget(t *testing.T) {
	loadTest(t, testutil.Limits(1), loadOptions{}) // skips without BPF
	spec, err := loadRakelimit()
	if err != nil {
		t.Fatal(err)
	}
	// The production entries only, as Load and LoadXDP load them: the
	// object's other entries are the tests' (c/pkt.h).
	var objs struct {
		rakelimitMaps
		Rakelimit    *ebpf.Program `ebpf:"rakelimit"`
		RakelimitXdp *ebpf.Program `ebpf:"rakelimit_xdp"`
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
	}); err != nil {
		t.Fatalf("%+v", err)
	}
	defer objs.rakelimitMaps.Close()
	defer objs.Rakelimit.Close()
	defer objs.RakelimitXdp.Close()
	// The socket filter first: .ci/kernels.sh reports the first count.
	for _, p := range []struct {
		name string
		prog *ebpf.Program
	}{{rakelimitProgRakelimit, objs.Rakelimit}, {rakelimitProgRakelimitXdp, objs.RakelimitXdp}} {
		name, log := p.name, p.prog.VerifierLog
		_, after, ok := strings.Cut(log, "processed ")
		if !ok {
			t.Fatalf("%s: no statistics in the verifier log:\n%s", name, log)
		}
		var processed int
		if _, err := fmt.Sscanf(after, "%d insns", &processed); err != nil {
			t.Fatalf("%s: parsing %q: %v", name, after, err)
		}
		if processed > 250_000 {
			t.Fatalf("%s: the verifier processed %d instructions, want at most 250,000 (a quarter of its limit)", name, processed)
		}
		t.Logf("%s: verifier processed %d instructions", name, processed)
	}
}

// TestDifferentialVerify runs a long random trace with connection ID
// verification through the program and the Go twin: server IDs and peers
// learned as the trace goes (and learned again, which moves their time),
// expired every so often; short headers, Initials (with tokens, to a server
// ID or a client's), 0-RTT and Handshake packets of both versions to known
// and unknown IDs, from peers and strangers; long headers whose lengths do
// not add up; a spoofed flood of unverified short headers over the
// unverified class's total; credits granted to the peers the server sends
// to, spent and run out; a burst of attempts at a proof past the proof
// pacer's room; returning users' openings at a capped total; verification
// switched off and on again; a dry run at the end.
// Every verdict, counter, cell, fair share, pacer, credit and learned time
// must agree.
func TestDifferentialVerify(t *testing.T) {
	c := testutil.QUICLimits(50, 500)
	c.VerifyIDs = true
	c.Limiter.Window = 500 * time.Millisecond
	top := c.Limiter.WithDefaults().Levels() - 1
	c.Limiter.LevelLimits = map[int]uint32{top: 400, 2: sketch.Unlimited}
	c.Limiter.Unverified = sketch.Limits{Limit: 40, LevelLimits: map[int]uint32{2: sketch.Unlimited, top: 100}}
	w := newTwin(t, c)
	rng := rand.New(rand.NewPCG(8, 9))
	randID := func() decide.ServerID {
		var id decide.ServerID
		for i := range id {
			id[i] = byte(rng.Uint32())
		}
		return id
	}
	var ids []decide.ServerID
	for range 60 {
		ids = append(ids, randID())
	}
	var peers []netip.Addr
	for i := range 40 {
		if i%2 == 0 {
			peers = append(peers, netip.MustParseAddr(fmt.Sprintf("203.0.113.%d", 1+i)))
		} else {
			peers = append(peers, netip.MustParseAddr(fmt.Sprintf("2001:db8:77::%x", 1+i)))
		}
	}
	// The server sends each ID to one peer; the last ten peers get none,
	// so that they stay answered peers, which never prove themselves.
	type bound struct {
		id decide.ServerID
		to netip.Addr
	}
	var issued []bound
	learnedAt := map[bound]uint32{}
	ownID := map[netip.Addr]decide.ServerID{}
	clientID := func() []byte {
		b := make([]byte, 8+rng.IntN(13))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	version := func() (uint32, uint8) { // a version and its Initial type field
		if rng.IntN(2) == 0 {
			return quicclass.Version1, 0
		}
		return quicclass.Version2, 1
	}
	// payload draws a datagram of one of the kinds verification tells
	// apart; id is a server ID (learned or not).
	payload := func(id decide.ServerID) []byte {
		ver, initial := version()
		typ := func(v1 uint8) uint8 { // a v1 type field in version ver
			if ver == quicclass.Version2 {
				return (v1 + 1) & 3
			}
			return v1
		}
		big := 1200 + rng.IntN(152)
		switch r := rng.IntN(16); r {
		case 0, 1, 2:
			return quicclasstest.ShortPacket(id, 21+rng.IntN(1330))
		case 3:
			return quicclasstest.LongPacket(ver, initial, clientID(), clientID(), nil, big)
		case 4:
			return quicclasstest.LongPacket(ver, initial, id[:], clientID(), make([]byte, rng.IntN(200)), big)
		case 5:
			return quicclasstest.LongPacket(ver, typ(1), id[:], clientID(), nil, 40+rng.IntN(1200))
		case 6:
			return quicclasstest.LongPacket(ver, typ(1), clientID(), clientID(), nil, 40+rng.IntN(1200))
		case 7:
			return quicclasstest.LongPacket(ver, typ(2), id[:], nil, nil, 40+rng.IntN(1200))
		case 8:
			return quicclasstest.LongPacket(ver, typ(2), clientID(), clientID(), nil, 60+rng.IntN(200))
		case 9: // a Length one past the end, or too small, or a token past the end
			b := quicclasstest.LongPacket(ver, initial, id[:], clientID(), make([]byte, rng.IntN(50)), big)
			b = b[:len(b)-1-rng.IntN(2)]
			return append(b, make([]byte, rng.IntN(2))...)
		case 10:
			b := quicclasstest.LongPacket(ver, typ(2), id[:], nil, nil, 200)
			copy(b[7+4:], []byte{0x40, byte(rng.IntN(20))})
			return b
		case 11:
			b := quicclasstest.LongPacket(ver, initial, clientID(), nil, nil, big)
			b[6+b[5]+1] = 0x80 | byte(rng.IntN(64)) // a 4-byte token length, mostly past the end
			return b
		case 12:
			return []byte{0xe0 | typ(2)<<4&0x30, 0, 0, 0, 1, 0, 0}[:7]
		}
		kinds := quicPayloads(rng)
		return kinds[rng.IntN(len(kinds))]
	}
	now := start
	for i := range 36000 {
		switch i {
		case 14000:
			c.VerifyIDs = false
			w.configure(c)
		case 18000:
			c.VerifyIDs = true
			w.configure(c)
		case 32000:
			c.DryRun = true
			w.configure(c)
		}
		at := now
		burst := i >= 26000 && i < 30000
		switch {
		case burst: // attempts at a proof, faster than the pacer's rate
			now += 200
			at = now
		case i%3000 == 2999: // idle long enough to refresh IDs and expire what is quiet
			now += []int64{int64(1500 * time.Millisecond), int64(700 * time.Millisecond), int64(4 * time.Second)}[i/3000%3]
			at = now
		case i%20 == 7: // an older reading, just before this epoch
			at = now>>sketch.EpochShift<<sketch.EpochShift - 200
		default:
			now += int64(rng.ExpFloat64() * 25e3)
			at = now
		}
		switch {
		case i%400 == 0 && len(issued) < len(ids): // the server issues a new ID to a peer
			b := bound{ids[len(issued)], peers[rng.IntN(len(peers)-10)]}
			w.learnID(b.id, b.to, at)
			issued = append(issued, b)
			learnedAt[b] = decide.Stamp(at)
			ownID[b.to] = b.id
		case i%150 == 0: // and sends to a peer, which earns it credit
			a := peers[rng.IntN(len(peers))]
			w.learnPeer(a, at)
			w.grant(a, rng.IntN(6))
		case i%5000 == 4000:
			w.expire(now, int64(3*time.Second))
			w.compareState()
		}
		var p testutil.Frame
		id := randID()
		if rng.IntN(3) > 0 {
			id = ids[rng.IntN(len(ids))]
		}
		spoofed := func() string {
			return netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())}).String()
		}
		switch r := rng.IntN(100); {
		case burst: // from answered peers that never prove
			if i == 26000 {
				for _, a := range peers[len(peers)-10:] {
					w.learnPeer(a, now)
				}
			}
			id := ids[rng.IntN(len(ids))]
			if rng.IntN(4) == 0 {
				id = randID()
			}
			p = udp(peers[len(peers)-10+rng.IntN(10)].String(), uint16(1024+rng.IntN(60000)))
			ver, _ := version()
			hs := uint8(2)
			if ver == quicclass.Version2 {
				hs = 3
			}
			p.Data = quicclasstest.LongPacket(ver, hs, id[:], clientID(), nil, 60+rng.IntN(200))
		case r < 25: // spoofed unverified short headers
			p = udp(spoofed(), uint16(1024+rng.IntN(60000)))
			p.Data = quicclasstest.ShortPacket(randID(), 30+rng.IntN(1000))
		case r < 32 && len(issued) > 0: // an ID the server sent to a peer, sprayed from anywhere else
			p = udp(spoofed(), uint16(1024+rng.IntN(60000)))
			p.Data = payload(issued[rng.IntN(len(issued))].id)
		case r < 55:
			peer := peers[rng.IntN(len(peers))]
			if own, ok := ownID[peer]; ok && rng.IntN(2) == 0 {
				id = own
			}
			p = udp(peer.String(), uint16(1024+rng.IntN(60000)))
			p.Data = payload(id)
		default:
			if rng.IntN(2) == 0 {
				p = udp(fmt.Sprintf("198.51.%d.%d", rng.IntN(4), rng.IntN(256)), uint16(1024+rng.IntN(64000)))
			} else {
				p = udp(fmt.Sprintf("2001:db8:%x:%x::%x", rng.IntN(3), rng.IntN(4), rng.IntN(1<<16)), uint16(1024+rng.IntN(64000)))
			}
			p.Data = payload(id)
		}
		if rng.IntN(10) == 0 && p.Src.Is6() {
			p.IPv6Ext = []testutil.IPv6Ext{{Kind: unix.IPPROTO_HOPOPTS}, {Kind: unix.IPPROTO_DSTOPTS, Units: 1}}
		}
		w.step(p, p.Datagram(true), at, rng.Uint32())
	}
	w.compareState()
	st := w.d.Stats()
	var verified [quicclass.NumVerifications]uint64
	var unknownID, length, unverifiedPassed, unverifiedDropped, openingTop uint64
	for fam := range decide.Families {
		for v := range verified {
			verified[v] += st.Verified[fam][v]
		}
		unknownID += st.Invalid[0][fam][quicclass.UnknownConnectionID] + st.Invalid[1][fam][quicclass.UnknownConnectionID]
		length += st.Invalid[0][fam][quicclass.Length] + st.Invalid[1][fam][quicclass.Length]
		unverifiedPassed += st.Passed[quicclass.Unverified][fam]
		unverifiedDropped += st.Dropped[quicclass.Unverified][fam][top] + st.WouldDrop[quicclass.Unverified][fam][top]
		openingTop += st.Dropped[quicclass.Opening][fam][top] + st.WouldDrop[quicclass.Opening][fam][top]
	}
	refreshed := 0
	for b, st := range learnedAt {
		pk, err := decide.PeerKeyOf(b.to)
		if err != nil {
			t.Fatal(err)
		}
		ids := w.d.Learned().IDs
		if i := ids.Find(decide.BoundHash(&w.f.hk, b.id, &pk)); i >= 0 && uint32(ids.Slot(i))&decide.StampMask != st {
			refreshed++
		}
	}
	if st.Proofs == 0 || st.UnpacedAttempts == 0 {
		t.Errorf("%d addresses proved themselves; %d attempts found the proof pacer full", st.Proofs, st.UnpacedAttempts)
	}
	if w.d.Limiter().ReturningTAT() == 0 {
		t.Errorf("no returning user's opening met the returning part of a capped total")
	}
	for v := quicclass.ShortByID; v < quicclass.NumVerifications; v++ {
		if verified[v] == 0 {
			t.Errorf("the trace verified no datagram %v", v)
		}
	}
	if unknownID == 0 || length == 0 || unverifiedPassed == 0 || unverifiedDropped == 0 || openingTop == 0 || refreshed == 0 {
		t.Fatalf("the trace missed a path: invalid unknown ID %d, length %d; unverified passed %d, dropped at the total %d; "+
			"openings dropped at the total %d; IDs refreshed by datagrams %d", unknownID, length, unverifiedPassed,
			unverifiedDropped, openingTop, refreshed)
	}
	t.Logf("verified %v; invalid: unknown ID %d, length %d; unverified passed %d, dropped at the total %d; %d IDs refreshed; "+
		"%d proofs, %d unpaced attempts", verified, unknownID, length, unverifiedPassed, unverifiedDropped, refreshed,
		st.Proofs, st.UnpacedAttempts)
}
