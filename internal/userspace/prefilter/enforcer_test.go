package prefilter

import (
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// streamAt is a stream of class at node i of p from src.
func streamAt(p *sketch.Params, i int, class quicclass.Class, src string) decide.Stream {
	k := sketch.KeyFrom(netip.MustParseAddrPort(src), 443)
	return decide.Stream{Class: class, Node: p.Nodes[i], Level: p.Nodes[i].Level(), Key: k, Estimate: 1}
}

// quantized is p as DropFor quantizes it: the pass fraction 1-p rounded up
// to a power of 2^(1/8).
func quantized(p float64) float64 {
	return 1 - math.Pow(2, math.Ceil(8*math.Log2(1-p))/8)
}

// TestDropFor checks the drop probability of a stream: none under Headroom
// times its limit, never more than leaves Headroom times it, less by one
// step of 2^(1/8) at most, and capped near MaxDrop, not at the 63/64 a
// step of 1/64 gave, which let three times as much through.
func TestDropFor(t *testing.T) {
	tests := []struct {
		name        string
		rate, limit float64
		want        float64 // the exact probability before quantizing; 0: none
	}{
		{"no traffic", 0, 100, 0},
		{"at the limit", 100, 100, 0},
		{"at twice the limit", 200, 100, 0},
		{"just over MinDrop", 200 / (1 - 2*MinDrop), 100, 2 * MinDrop},
		{"ten times the limit", 1000, 100, 0.8},
		{"a hundred times", 10_000, 100, 0.98},
		{"capped", 1e9, 100, MaxDrop},
		{"a limit of 0", 1000, 0, MaxDrop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DropFor(tt.rate, tt.limit)
			if tt.want == 0 {
				if got != 0 {
					t.Fatalf("DropFor(%v, %v) = %v, want 0", tt.rate, tt.limit, got)
				}
				return
			}
			if got > tt.want+1e-12 || 1-got > (1-tt.want)*math.Pow(2, 1.0/8)+1e-12 {
				t.Fatalf("DropFor(%v, %v) = %v, want at most %v and within a step of it", tt.rate, tt.limit, got, tt.want)
			}
		})
	}
	if got := DropFor(1e9, 1); got <= 0.99 {
		t.Errorf("capped probability %v, want over 0.99", got)
	}
}

// TestRulesOf checks which streams become rules, with what probability,
// form (FormOf) and match, and in which order.
func TestRulesOf(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	thresh := float64(p.Thresh[0][0])
	rates := func(mult ...float64) RateFunc {
		return func(s *decide.Stream) uint64 { return uint64(mult[s.Key.SrcPort%uint16(len(mult))] * thresh) }
	}
	none := fakeHistory{}
	last := len(p.Nodes) - 1
	dry := streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")
	dry.DryRun = true
	invalid := streamAt(p, 0, quicclass.Invalid, "127.0.0.2:40000")
	invalid.Level = -1
	verifying := c
	verifying.VerifyIDs = true
	addressNode := slices.IndexFunc(p.Nodes, func(n sketch.Node) bool { return n.Prefix() == 0 && n.SrcPortAny() })
	tests := []struct {
		name    string
		c       decide.Config
		streams []decide.Stream
		rate    RateFunc
		peff    History
		want    []float64 // drop probabilities, in order
		form    Form
	}{
		{"ten times the limit", c, []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")}, rates(10), none,
			[]float64{quantized(0.8)}, LongForm},
		{"the same stream, 80% dropped in the kernel", c, []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")},
			rates(2), fakeHistory{peff: 0.8}, []float64{quantized(0.8)}, LongForm},
		{"under twice the limit", c, []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")}, rates(1.5), none, nil, 0},
		{"capped", c, []decide.Stream{streamAt(p, 0, quicclass.Established, "[::1]:40000")}, rates(1e6), none,
			[]float64{quantized(MaxDrop)}, ShortForm},
		{"largest first", c, []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000"),
			streamAt(p, 0, quicclass.Opening, "127.0.0.3:40001")}, rates(4, 40), none,
			[]float64{quantized(1 - 2.0/40), quantized(0.5)}, LongForm},
		{"not classifying", testutil.Limits(200), []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")},
			rates(10), none, []float64{quantized(0.8)}, AnyForm},
		{"dry run", c, []decide.Stream{dry}, rates(10), none, nil, 0},
		{"invalid", c, []decide.Stream{invalid}, rates(10), none, nil, 0},
		{"the whole socket", c, []decide.Stream{streamAt(p, last, quicclass.Opening, "127.0.0.2:40000")}, rates(10), none, nil, 0},
		// With verification, an opening rule matches only what opens
		// connections, an established one every header of its class,
		// and the unverified class has rules of one address and port
		// only (FormOf).
		{"verifying: openings", verifying, []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")}, rates(10), none,
			[]float64{quantized(0.8)}, OpeningForm},
		{"verifying: established", verifying, []decide.Stream{streamAt(p, 0, quicclass.Established, "[::1]:40000")}, rates(1e6),
			none, []float64{quantized(MaxDrop)}, EstablishedForm},
		{"verifying: unverified, one address and port", verifying, []decide.Stream{streamAt(p, 0, quicclass.Unverified, "127.0.0.2:40000")},
			rates(1e6), none, []float64{quantized(MaxDrop)}, EstablishedForm},
		{"verifying: unverified, one address", verifying, []decide.Stream{streamAt(p, addressNode, quicclass.Unverified, "127.0.0.2:40000")},
			rates(1e6), none, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := RulesOf(tt.c, p, tt.streams, tt.rate, tt.peff)
			if len(rules) != len(tt.want) {
				t.Fatalf("%d rules %+v, want %d", len(rules), rules, len(tt.want))
			}
			for i, r := range rules {
				if r.Drop != tt.want[i] || r.Form != tt.form {
					t.Errorf("rule %d: drop %v form %v, want %v and %v", i, r.Drop, r.Form, tt.want[i], tt.form)
				}
				n := p.Nodes[0]
				if r.Bits != p.PrefixLen(r.Family, n.Prefix()) || r.MatchSrcPort == n.SrcPortAny() {
					t.Errorf("rule %d: /%d, source port %v: not node %v's stream", i, r.Bits, r.MatchSrcPort, n)
				}
			}
		})
	}
}

// TestFairRulesOf checks the rules of the networks the fair total drops
// packets of: each keeps Headroom times the larger of its proportional
// floor and an equal split of the total's limit, corrected for the kernel's
// drops, and matches its class's header forms (FormOf); a quiet network, a
// stream of another node, a lattice without a fair total and the
// unverified class's networks get none.
func TestFairRulesOf(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	thr := float64(p.Thresh[0][p.FairNode])
	network := func(addr string) decide.Stream { return streamAt(p, p.FairSource, quicclass.Opening, addr) }
	flood := []decide.Stream{network("127.90.0.1:1"), network("127.90.1.1:1"), network("127.90.2.1:1"),
		network("127.90.3.1:1")}
	quiet := network("127.91.0.1:1")
	// rates gives each network mult times thr (the quiet one a hundredth)
	// and the total the sum, each seen through the kernel's drop
	// probability kernel.
	rates := func(mult, kernel float64) RateFunc {
		return func(s *decide.Stream) uint64 {
			switch {
			case s.Node == p.Nodes[p.FairNode]:
				return uint64(4*mult*thr*(1-kernel) + thr/100)
			case s.Key.Words[0]>>16&0xff == 91:
				return uint64(thr / 100)
			}
			return uint64(mult * thr * (1 - kernel))
		}
	}
	none := fakeHistory{}
	half := fakeHistory{peffOf: func(k ruleKey) float64 {
		if k.words[0]>>16&0xff == 91 {
			return 0
		}
		return 0.5
	}}
	proportional := c
	proportional.Limiter.ProportionalTotal = true
	pp, err := sketch.Compile(proportional.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	verifying := c
	verifying.VerifyIDs = true
	var unverified []decide.Stream
	for _, s := range flood {
		s.Class = quicclass.Unverified
		unverified = append(unverified, s)
	}
	tests := []struct {
		name    string
		c       decide.Config
		p       *sketch.Params
		streams []decide.Stream
		rate    RateFunc
		peff    History
		want    float64 // every rule's probability
		rules   int
		form    Form
	}{
		{"four networks at ten times the limit", c, p, append(flood, quiet), rates(10, 0), none, quantized(1 - 2*0.25/10), 4, LongForm},
		{"the same, half dropped in the kernel", c, p, append(flood, quiet), rates(10, 0.5), half, quantized(1 - 2*0.25/10), 4,
			LongForm},
		{"under twice an equal split", c, p, flood, rates(0.4, 0), none, 0, 0, 0},
		{"a stream of another node", c, p, []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.90.0.1:1")}, rates(10, 0), none, 0,
			0, 0},
		{"no fair total", c, pp, append(flood, quiet), rates(10, 0), none, 0, 0, 0},
		{"verifying: openings", verifying, p, append(flood, quiet), rates(10, 0), none, quantized(1 - 2*0.25/10), 4, OpeningForm},
		{"verifying: unverified networks", verifying, p, unverified, rates(1000, 0), none, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := FairRulesOf(tt.c, tt.p, tt.streams, tt.rate, tt.peff)
			if len(rules) != tt.rules {
				t.Fatalf("%d rules %+v, want %d", len(rules), rules, tt.rules)
			}
			for i, r := range rules {
				if math.Abs(r.Drop-tt.want) > 1e-9 || r.Bits != 24 || r.MatchSrcPort || r.Form != tt.form {
					t.Errorf("rule %d: %+v, want /24, any port, forms %#x, drop %v", i, r, tt.form, tt.want)
				}
				if r.Words[0]>>16&0xff == 91 {
					t.Errorf("rule %d drops the quiet network", i)
				}
			}
		})
	}
}

// fakeHistory is a History with a fixed averaged probability (or one by
// rule, peffOf) and, when counted is set, a drop rate and the kernel's
// probability.
type fakeHistory struct {
	peff    float64
	peffOf  func(ruleKey) float64
	counted bool
	pps, k  float64
}

func (f fakeHistory) Peff(k ruleKey) float64 {
	if f.peffOf != nil {
		return f.peffOf(k)
	}
	return f.peff
}

func (f fakeHistory) Counted(ruleKey, *decide.Stream) (float64, float64, bool) {
	return f.pps, f.k, f.counted
}

// TestArrivalOf checks a stream's arrival rate: the larger of its decayed
// count over the share the kernel leaves on average, and its counted drops
// and passes over the share the kernel left.
func TestArrivalOf(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	// perWindow converts packets per second to a count per window.
	perWindow := func(pps float64) float64 { return pps * float64(p.WindowNanos) / 1e9 * (1 << sketch.FracBits) }
	s := &decide.Stream{}
	tests := []struct {
		name           string
		observed, pass float64
		h              fakeHistory
		want           float64
	}{
		{"nothing counted", 500, 0, fakeHistory{peff: 0.5}, 1000},
		{"a rising count: the drops", 500, 0, fakeHistory{counted: true, pps: 10_000}, perWindow(10_000)},
		{"drops and passes, through the kernel", 500, perWindow(1000), fakeHistory{peff: 0.2, counted: true, pps: 1000, k: 0.9},
			perWindow(2000) / 0.1},
		{"the count above the drops", perWindow(50_000), 0, fakeHistory{counted: true, pps: 10_000}, perWindow(50_000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := arrivalOf(p, ruleKey{}, s, tt.observed, tt.pass, tt.h); math.Abs(got-tt.want) > 1e-6*tt.want {
				t.Errorf("arrivalOf = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCounted checks the drop rate the Enforcer counts: a new stream's
// from its first to its last drop, a known one's since the last update, with
// the probability the kernel applied meanwhile; nothing from too few drops
// or a stream tracked anew.
func TestCounted(t *testing.T) {
	t0 := time.Unix(1000, 0)
	k := ruleKey{bits: 32}
	e := NewEnforcer()
	h := history{e, t0.Add(100 * time.Millisecond), map[ruleKey]count{}}
	s := &decide.Stream{First: t0, Last: t0.Add(80 * time.Millisecond), Drops: 800}
	if pps, kernel, ok := h.Counted(k, s); !ok || math.Abs(pps-10_000) > 1e-6 || kernel != 0 {
		t.Errorf("new stream: %v, %v, %v; want 10,000/s and no kernel drops", pps, kernel, ok)
	}
	e.counts = h.next
	e.state[k] = &ruleState{p: 0.5}
	e.conns = append(e.conns, nil) // attached: the probability applies
	h = history{e, t0.Add(600 * time.Millisecond), map[ruleKey]count{}}
	s.Drops, s.Last = 1800, t0.Add(590*time.Millisecond)
	if pps, kernel, ok := h.Counted(k, s); !ok || math.Abs(pps-2000) > 1e-6 || kernel != 0.5 {
		t.Errorf("known stream: %v, %v, %v; want 2,000/s under 0.5", pps, kernel, ok)
	}
	e.counts = h.next
	h = history{e, t0.Add(700 * time.Millisecond), map[ruleKey]count{}}
	s.Drops = 1810
	if _, _, ok := h.Counted(k, s); ok {
		t.Error("10 drops counted as a rate")
	}
	h = history{e, t0.Add(800 * time.Millisecond), map[ruleKey]count{}}
	anew := &decide.Stream{First: t0.Add(750 * time.Millisecond), Last: t0.Add(790 * time.Millisecond), Drops: 400}
	if pps, _, ok := h.Counted(k, anew); !ok || math.Abs(pps-10_000) > 1e-6 {
		t.Errorf("stream tracked anew: %v, %v; want 10,000/s from its own first drop", pps, ok)
	}
}

// verifiedReplayN is how many packets of each kind the spoofing tests run
// through a program.
const verifiedReplayN = 10_000

// keptOf runs n copies of payload from src through prog with random numbers
// spread evenly over [0, 2^32) (the i-th at (i+1/2)/n of the range), and
// returns how many it keeps: a rule of probability p keeps n(1-p) of them,
// within one.
func keptOf(t *testing.T, prog *Program, src string, payload []byte, n int) int {
	t.Helper()
	keeps, kept := runner(t, prog, packet{src: netip.MustParseAddrPort(src), dport: 443, payload: payload}), 0
	for i := range n {
		if keeps(uint32((float64(i) + 0.5) / float64(n) * (1 << 32))) {
			kept++
		}
	}
	return kept
}

// TestSpoofedNetworkKeepsVerified replays a review's findings. A spoofer
// floods "from" 192.0.2.0/24 at 200 times a limit, with unverified short
// headers or with Initials; the userspace limiter drops the /24's stream of
// that class (or its network at the fair total), and the pre-filter gets
// its rule. A client at 192.0.2.50 whose short headers, Handshakes and
// later Initials carry a server ID bound to its address, or whose address
// is a proven peer (the established class: short_by_id, opening_by_id,
// handshake_from_peer), must keep 99% of them at least: the rule of another
// class must not match them. Before, the unverified class's rule matched
// every short header of the /24 and the opening class's every long header,
// and the client kept about 1% (99 of 10,000 in the review). The flood's
// own Initials and 0-RTT packets (v1 and v2, destination IDs of 8 bytes or
// none) are still dropped at the rule's probability.
func TestSpoofedNetworkKeepsVerified(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	c.VerifyIDs = true
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	net24 := slices.IndexFunc(p.Nodes, func(n sketch.Node) bool {
		return p.PrefixLen(sketch.IPv4, n.Prefix()) == 24 && n.SrcPortAny()
	})
	if net24 < 0 {
		t.Fatalf("no /24 node of any port in %v", p.Nodes)
	}
	id := [quicclass.ServerIDLen]byte{0xc1, 0x1e, 0x47, 0x01} // the client's server ID
	scid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	dcid8 := []byte{9, 9, 9, 9, 9, 9, 9, 9}
	const client, flooder = "192.0.2.50:40000", "192.0.2.77:50000"
	type datagram struct {
		name string
		b    []byte
	}
	verified := []datagram{
		{"short header, ID bound", quicclasstest.ShortPacket(id, 100)},
		{"v1 Handshake, ID bound", quicclasstest.LongPacket(quicclass.Version1, 2, id[:], scid, nil, 300)},
		{"v2 Handshake, ID bound", quicclasstest.LongPacket(quicclass.Version2, 3, id[:], scid, nil, 300)},
		{"v1 Initial to its ID", quicclasstest.LongPacket(quicclass.Version1, 0, id[:], scid, nil, 1200)},
		{"v2 Initial to its ID", quicclasstest.LongPacket(quicclass.Version2, 1, id[:], scid, nil, 1200)},
		{"v2 0-RTT to its ID", quicclasstest.LongPacket(quicclass.Version2, 2, id[:], scid, nil, 300)},
		{"v1 Handshake from a proven peer", quicclasstest.LongPacket(quicclass.Version1, 2, dcid8, scid, nil, 300)},
	}
	flood := []datagram{
		{"v1 Initial", quicclasstest.LongPacket(quicclass.Version1, 0, dcid8, scid, nil, 1200)},
		{"v2 Initial", quicclasstest.LongPacket(quicclass.Version2, 1, dcid8, scid, nil, 1200)},
		{"v1 0-RTT", quicclasstest.LongPacket(quicclass.Version1, 1, dcid8, scid, nil, 300)},
		{"v2 0-RTT", quicclasstest.LongPacket(quicclass.Version2, 2, dcid8, scid, nil, 300)},
		{"v1 Initial, empty ID", quicclasstest.LongPacket(quicclass.Version1, 0, nil, scid, nil, 1200)},
	}
	for _, d := range verified {
		h := quicclass.Inspect(nil, 40000, d.b, len(d.b), true)
		if cl, _, _ := h.Resolve(h.HasID, true, false, false); cl != quicclass.Established {
			t.Fatalf("%s: %v (%v) once verified, want established", d.name, cl, h.Reason)
		}
	}
	for _, d := range flood {
		if h := quicclass.Inspect(nil, 50000, d.b, len(d.b), true); h.Class != quicclass.Opening || h.HasID {
			t.Fatalf("%s: %v (%v), want an opening without a server ID", d.name, h.Class, h.Reason)
		}
	}
	// rulesFor returns the rules of a flood of class at 200 times its
	// limit at the /24, as a tracked stream (RulesOf) or as a network the
	// fair total drops (FairRulesOf).
	rulesFor := func(class quicclass.Class, fair bool) []Rule {
		if !fair {
			s := streamAt(p, net24, class, flooder)
			thresh := p.Thresh[class][net24]
			return RulesOf(c, p, []decide.Stream{s}, func(*decide.Stream) uint64 { return 200 * uint64(thresh) }, fakeHistory{})
		}
		s := streamAt(p, p.FairSource, class, flooder)
		thr := p.Thresh[class][p.FairNode]
		return FairRulesOf(c, p, []decide.Stream{s}, func(*decide.Stream) uint64 { return 200 * uint64(thr) }, fakeHistory{})
	}
	tests := []struct {
		name  string
		class quicclass.Class
		fair  bool
		// rules is how many rules the flood makes.
		rules int
	}{
		{"unverified short headers, the /24's stream", quicclass.Unverified, false, 0},
		{"unverified short headers, the /24 at the fair total", quicclass.Unverified, true, 0},
		{"Initials, the /24's stream", quicclass.Opening, false, 1},
		{"Initials, the /24 at the fair total", quicclass.Opening, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := rulesFor(tt.class, tt.fair)
			if len(rules) != tt.rules {
				t.Errorf("%d rules %+v, want %d", len(rules), rules, tt.rules)
			}
			prog, err := Build(Spec{Classify: true, BlockedPorts: c.BlockedPorts, SampleShift: DefaultSampleShift, Rules: rules})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range verified {
				if kept := keptOf(t, prog, client, d.b, verifiedReplayN); kept < verifiedReplayN*99/100 {
					t.Errorf("the verified client's %s: kept %d of %d, want 99%% at least", d.name, kept, verifiedReplayN)
				}
			}
			if tt.rules == 0 || len(rules) == 0 {
				return
			}
			if rules[0].Drop < 0.98 {
				t.Fatalf("the rule drops %v of a flood at 200 times its limit, want about 0.99", rules[0].Drop)
			}
			want := float64(verifiedReplayN) * (1 - rules[0].Drop)
			for _, d := range flood {
				if kept := keptOf(t, prog, flooder, d.b, verifiedReplayN); math.Abs(float64(kept)-want) > 1 {
					t.Errorf("the flood's %s: kept %d of %d, want %.0f (the rule's probability %v)", d.name, kept, verifiedReplayN,
						want, rules[0].Drop)
				}
			}
		})
	}
}
