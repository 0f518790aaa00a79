package sketch

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

func newLimiter(t testing.TB, c Config) *Limiter {
	t.Helper()
	// A fixed hash key, so that test outcomes do not depend on luck.
	l, err := New(c, SeededHashKey(1))
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return l
}

func key(s string) Key {
	return KeyFrom(netip.MustParseAddrPort(s), 443)
}

// start is an arbitrary monotonic-clock reading, away from zero.
const start = int64(1000 * time.Second)

func TestValidate(t *testing.T) {
	ok := Config{Limit: 1000, Window: time.Second}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string // empty: valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"zero limit", func(c *Config) { c.Limit = 0 }, "limit 0 out of range"},
		{"huge limit", func(c *Config) { c.Limit = MaxLimit + 1 }, "limit 10000001 out of range"},
		{"zero window", func(c *Config) { c.Window = 0 }, "window 0s out of range"},
		{"negative window", func(c *Config) { c.Window = -time.Second }, "window -1s out of range"},
		{"tiny window", func(c *Config) { c.Window = time.Millisecond }, "window 1ms out of range"},
		{"huge window", func(c *Config) { c.Window = 2 * time.Hour }, "window 2h0m0s out of range"},
		{"burst below one packet", func(c *Config) { c.Limit = 10; c.Window = 50 * time.Millisecond }, "burst of less than one packet"},
		{"burst over the counters", func(c *Config) { c.Limit = 10000; c.Window = time.Hour }, "limit 10000 with window 1h0m0s: limit x window is 36000000 packets"},
		{"established burst", func(c *Config) { c.Established = Limits{Limit: 9_000_000} }, "established limit 9000000 with window 1s"},
		{"established level", func(c *Config) {
			c.Established = Limits{Limit: 100, LevelLimits: map[int]uint32{7: 5}}
		}, "established level limits: level 7 does not exist"},
		{"unverified burst", func(c *Config) { c.Unverified = Limits{Limit: 9_000_000} }, "unverified limit 9000000 with window 1s"},
		{"unverified level", func(c *Config) {
			c.Unverified = Limits{Limit: 100, LevelLimits: map[int]uint32{7: 5}}
		}, "unverified level limits: level 7 does not exist"},
		{"unverified level limit zero", func(c *Config) {
			c.Unverified = Limits{Limit: 100, LevelLimits: map[int]uint32{2: 0}}
		}, "unverified level 2 limit 0 out of range"},
		{"unverified defaults at the longest window", func(c *Config) { c.Limit, c.Window = 1, MaxWindow }, ""},
		{"unverified defaults at the shortest window", func(c *Config) { c.Limit, c.Window = 100, MinWindow }, ""},
		{"established unlimited total", func(c *Config) {
			c.Established = Limits{Limit: 250_000, LevelLimits: map[int]uint32{3: Unlimited}}
		}, ""},
		{"v4 prefix too long", func(c *Config) { c.IPv4Prefixes = []uint8{33, 24, 0} }, "IPv4 prefixes [33 24 0]: /33 is longer than 32 bits"},
		{"v6 prefix too long", func(c *Config) { c.IPv6Prefixes = []uint8{129, 48, 0} }, "IPv6 prefixes [129 48 0]: /129"},
		{"not decreasing", func(c *Config) { c.IPv4Prefixes = []uint8{24, 32, 0} }, "strictly decreasing"},
		{"no all-sources", func(c *Config) { c.IPv4Prefixes = []uint8{32, 24, 16} }, "the last prefix must be 0"},
		{"too many prefixes", func(c *Config) {
			c.IPv4Prefixes = []uint8{32, 28, 24, 16, 0}
		}, "want 1 to 4 prefix lengths"},
		{"length mismatch", func(c *Config) { c.IPv6Prefixes = []uint8{128, 64, 48, 0} }, "must have the same length"},
		{"four prefixes", func(c *Config) {
			c.IPv4Prefixes = []uint8{32, 24, 16, 0}
			c.IPv6Prefixes = []uint8{128, 64, 48, 0}
		}, ""},
		{"level out of range", func(c *Config) { c.LevelLimits = map[int]uint32{4: 5} }, "level 4 does not exist"},
		{"level limit zero", func(c *Config) { c.LevelLimits = map[int]uint32{1: 0} }, "level 1 limit 0 out of range"},
		{"level unlimited", func(c *Config) { c.LevelLimits = map[int]uint32{3: Unlimited} }, ""},
		{"per-dport adds a level", func(c *Config) {
			c.PerDstPort = true
			c.LevelLimits = map[int]uint32{4: Unlimited}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			_, err := Compile(c)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Compile: unexpected error %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("Compile: no error, want one containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("Compile: error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestLatticeOrder(t *testing.T) {
	tests := []struct {
		name       string
		perDstPort bool
		want       []string // Describe(IPv4) of each node, in order
		levels     []int
	}{
		{"one socket", false,
			[]string{"/32 sport=N", "/32 sport=*", "/24 sport=N", "/24 sport=*", "/0 sport=N", "/0 sport=*"},
			[]int{0, 1, 1, 2, 2, 3}},
		{"shared", true,
			[]string{
				"/32 sport=N dport=N",
				"/32 sport=N dport=*", "/32 sport=* dport=N", "/24 sport=N dport=N",
				"/32 sport=* dport=*", "/24 sport=N dport=*", "/24 sport=* dport=N", "/0 sport=N dport=N",
				"/24 sport=* dport=*", "/0 sport=N dport=*", "/0 sport=* dport=N",
				"/0 sport=* dport=*",
			},
			[]int{0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(Config{Limit: 10, Window: time.Second, PerDstPort: tt.perDstPort})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Nodes) != len(tt.want) {
				t.Fatalf("%d nodes, want %d", len(p.Nodes), len(tt.want))
			}
			for i, n := range p.Nodes {
				if got := n.Describe(p, IPv4); got != tt.want[i] || n.Level() != tt.levels[i] {
					t.Errorf("node %d = %q level %d, want %q level %d", i, got, n.Level(), tt.want[i], tt.levels[i])
				}
			}
			// The filter's node loop inlines the total's code for the
			// last node only (visit_nodes in internal/kernel/rakelimit.c).
			last := len(p.Nodes) - 1
			if p.TotalNode != last || p.FairNode != last {
				t.Errorf("total node %d, fair node %d, want both the last, %d", p.TotalNode, p.FairNode, last)
			}
		})
	}
}

// TestVisited checks how many nodes each class visits (Params.Visited): up
// to its last limited node, and that Decide counts nothing past it.
func TestVisited(t *testing.T) {
	top := Config{}.WithDefaults().Levels() - 1
	tests := []struct {
		name string
		c    Config
		want [NumClasses]int
	}{
		{"every node limited", Config{Limit: 10}, [NumClasses]int{6, 6, 6}},
		{"established total unlimited", Config{Limit: 10, Established: Limits{Limit: 10, LevelLimits: map[int]uint32{top: Unlimited}}},
			[NumClasses]int{6, 5, 6}},
		{"an unlimited level under a limited total", Config{Limit: 10, LevelLimits: map[int]uint32{1: Unlimited}},
			[NumClasses]int{6, 6, 6}},
		{"the top two levels unlimited", Config{Limit: 10, LevelLimits: map[int]uint32{top - 1: Unlimited, top: Unlimited}},
			[NumClasses]int{3, 3, 6}}, // established connections inherit the limits
		{"no limit", Config{Limit: 10, LevelLimits: map[int]uint32{0: Unlimited, 1: Unlimited, 2: Unlimited, 3: Unlimited}},
			[NumClasses]int{0, 0, 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.c.Window = time.Second
			l, err := New(tt.c, SeededHashKey(1))
			if err != nil {
				t.Fatal(err)
			}
			p := l.p
			if p.Visited != tt.want {
				t.Fatalf("Visited = %v, want %v", p.Visited, tt.want)
			}
			k := Key{Family: IPv4, HasPorts: true, Words: [4]uint32{0xc0000201}, SrcPort: 4000, DstPort: 443}
			for class := range NumClasses {
				for i := range 100 {
					l.Decide(&k, class, start+int64(i)*1000, 0)
				}
				for i, n := range p.Nodes {
					counted := l.Estimate(&k, class, n, Clean, start+100*1000) > 0
					if want := i < p.Visited[class]; counted != want {
						t.Errorf("class %d node %d (%s): counted %v, want %v", class, i, n.Describe(p, IPv4), counted, want)
					}
				}
			}
		})
	}
}

func TestFixedPoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	exact := func(a, b uint64, shift uint) *big.Int {
		r := new(big.Int).Mul(new(big.Int).SetUint64(a), new(big.Int).SetUint64(b))
		return r.Rsh(r, shift)
	}
	for range 100000 {
		a, b := rng.Uint64(), rng.Uint64N(q32One+1)
		got, want := mulQ32(a, b), exact(a, b, 32)
		// The split floors the low half on its own: at most one unit low.
		if d := new(big.Int).Sub(want, new(big.Int).SetUint64(got)); d.Sign() < 0 || d.Cmp(big.NewInt(1)) > 0 {
			t.Fatalf("mulQ32(%d, %d) = %d, exact %v", a, b, got, want)
		}
		c, g := rng.Uint32(), rng.Uint64N(1<<26)
		got, want = scale(c, g), exact(uint64(c), g, weightBits)
		if want.Cmp(new(big.Int).SetUint64(got)) != 0 {
			t.Fatalf("scale(%d, %d) = %d, exact %v", c, g, got, want)
		}
	}
	if got := satAdd(maxU32-1, 5); got != maxU32 {
		t.Fatalf("satAdd overflow = %d, want max", got)
	}
	if got := satAdd64(maxU64-1, 5); got != maxU64 {
		t.Fatalf("satAdd64 overflow = %d, want max", got)
	}
}

// TestTables checks the documented error of the exponential tables: each
// decay factor within 4 units of 2^-32 of exp(-k*epoch/window).
func TestTables(t *testing.T) {
	for _, w := range []time.Duration{MinWindow, 333 * time.Millisecond, time.Second, time.Minute, MaxWindow} {
		p, err := Compile(Config{Limit: 1000, Window: w})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(w)))
		for range 20000 {
			k := rng.Uint32N(decayHorizon + 1000)
			want := math.Exp(-float64(uint64(k)<<EpochShift)/float64(w)) * oneQ32f
			if k >= decayHorizon {
				want = 0
			}
			if got := float64(p.decay(k)); math.Abs(got-want) > 4 {
				t.Fatalf("window %v: decay(%d) = %v, want %v", w, k, got, want)
			}
		}
		for s := range Slots {
			g := math.Exp(float64(uint64(s)<<SlotShift)/float64(w)) * oneQ24f
			if math.Abs(float64(p.G[s])-g) > 0.5 {
				t.Fatalf("window %v: G[%d] = %d, want %v", w, s, p.G[s], g)
			}
			if wt := g / oneQ24f * oneF; math.Abs(float64(p.W[s])-wt) > 0.5 {
				t.Fatalf("window %v: W[%d] = %d, want %v", w, s, p.W[s], wt)
			}
		}
	}
}

// TestEstimateTracksExactRate compares the fixed-point estimate of a single
// stream with the exact exponentially decayed count, computed in floating
// point, for streams at several rates and windows.
func TestEstimateTracksExactRate(t *testing.T) {
	tests := []struct {
		rate   float64
		window time.Duration
	}{
		{10, time.Second}, {1000, time.Second}, {200000, time.Second}, {50, 10 * time.Second}, {5000, 20 * time.Millisecond},
	}
	for _, tt := range tests {
		l := newLimiter(t, Config{Limit: uint32(min(MaxBurst/tt.window.Seconds(), MaxLimit)), Window: tt.window})
		k := key("192.0.2.1:1000")
		rng := rand.New(rand.NewPCG(3, 3))
		now, exact := start, 0.0
		w := float64(tt.window)
		for range int(math.Min(tt.rate*5*tt.window.Seconds(), 500000)) {
			gap := int64(rng.ExpFloat64() / tt.rate * 1e9)
			// The limiter weighs a packet by its slot: quantise as it does.
			prev := now >> SlotShift << SlotShift
			now += gap
			exact = exact*math.Exp(-float64(now>>SlotShift<<SlotShift-prev)/w) + 1
			l.Decide(&k, int(quicclass.Opening), now, rng.Uint32())
		}
		got := float64(l.Estimate(&k, int(quicclass.Opening), l.p.Nodes[0], Clean, now)) / oneF
		// The socket's total counted the one stream too, in its shared
		// cells and its pending cell (countTotal): the same count.
		if total := l.Estimate(&k, int(quicclass.Opening), l.p.Nodes[l.p.TotalNode], Clean, now); total != l.Estimate(&k, int(quicclass.Opening), l.p.Nodes[0], Clean, now) {
			t.Errorf("rate %v window %v: the total's estimate %v, the stream's %v", tt.rate, tt.window, float64(total)/oneF, got)
		}
		// Weights rounded to 1/256 of a packet (at most 0.2% each) and
		// decays floored to 1/256 of a packet: within 0.5%.
		if math.Abs(got-exact) > 5e-3*exact+1.0/oneF {
			t.Errorf("rate %v window %v: estimate %v, exact %v, relative error %.2g", tt.rate, tt.window, got, exact, (got-exact)/exact)
		}
	}
}

// TestBurst: a fresh stream sends limit*window packets back to back and all
// pass unlimited; whatever it sends beyond the noise margin is dropped. The
// packets share one timestamp so that nothing decays during the burst.
func TestBurst(t *testing.T) {
	for _, limit := range []uint32{1, 25, 1000, 250000} {
		l := newLimiter(t, Config{Limit: limit, Window: time.Second})
		k := key("192.0.2.7:4000")
		margin := int(math.Sqrt(2 * float64(limit)))
		firstDrop := -1
		for i := range (int(limit)+margin)*1003/1000 + 10 {
			v := l.Decide(&k, int(quicclass.Opening), start, uint32(i*2654435761))
			if i < int(limit) && (v.Drop || v.Limited) {
				t.Fatalf("limit %d: packet %d of a fresh burst: %+v", limit, i, v)
			}
			if v.Drop && firstDrop < 0 {
				firstDrop = i
			}
		}
		// A packet weighs its slot's weight rounded to 1/256: the
		// limit holds within 0.2%.
		if hi := (int(limit) + margin + 1) * 1002 / 1000; firstDrop < int(limit) || firstDrop > hi {
			t.Errorf("limit %d: first drop at packet %d, want in [%d, %d]", limit, firstDrop, limit, hi)
		}
	}
}

// TestDropProbability: a stream held over its limit loses, in the long run,
// the fraction 1 - limit/rate of its packets, whatever its rate.
func TestDropProbability(t *testing.T) {
	for _, rate := range []float64{60, 500, 50000} {
		l := newLimiter(t, Config{Limit: 25, Window: time.Second})
		k := key("198.51.100.1:53")
		rng := rand.New(rand.NewPCG(9, uint64(rate)))
		now := start
		offered, passed := 0, 0
		for now < start+int64(20*time.Second) {
			now += int64(rng.ExpFloat64() / rate * 1e9)
			v := l.Decide(&k, int(quicclass.Opening), now, rng.Uint32())
			if now > start+int64(2*time.Second) { // after the burst
				offered++
				if !v.Drop {
					passed++
				}
			}
		}
		got, want := float64(offered-passed)/float64(offered), 1-25/rate
		if math.Abs(got-want) > 0.03 {
			t.Errorf("rate %v: dropped fraction %.3f, want %.3f", rate, got, want)
		}
	}
}

// TestUpdateKeepsState: a new limit applies from the next packet, and the
// counts survive the change.
func TestUpdateKeepsState(t *testing.T) {
	l := newLimiter(t, Config{Limit: 100, Window: time.Second})
	k := key("198.51.100.1:53")
	now, passed := start, 0
	flood := func(seconds int) {
		passed = 0
		for end := now + int64(seconds)*int64(time.Second); now < end; now += 100_000 { // 10 kpps
			if !l.Decide(&k, int(quicclass.Opening), now, uint32(now)).Drop {
				passed++
			}
		}
	}
	flood(3)
	before := l.Estimate(&k, int(quicclass.Opening), l.p.Nodes[0], Clean, now)
	if err := l.Update(Config{Limit: 1000, Window: time.Second}); err != nil {
		t.Fatal(err)
	}
	if after := l.Estimate(&k, int(quicclass.Opening), l.p.Nodes[0], Clean, now); after != before {
		t.Fatalf("estimate changed by Update: %d -> %d", before, after)
	}
	flood(1) // ramp to the new limit
	flood(2)
	if passed < 1800 || passed > 2200 {
		t.Fatalf("after raising the limit to 1000, %d passed in 2 s, want about 2000", passed)
	}
	err := l.Update(Config{Limit: 1000, Window: time.Second, PerDstPort: true})
	if err == nil || !strings.Contains(err.Error(), "cannot change the lattice") {
		t.Fatalf("Update changing the lattice: err = %v", err)
	}
}

// TestUnparsed: packets without ports, or without an address, still count
// at the wildcard nodes, together with the parsed traffic there, and are
// limited like the rest.
func TestUnparsed(t *testing.T) {
	tests := []struct {
		name     string
		key      Key
		wantNode Node
	}{
		{"no address", Key{Family: Unknown}, NewNode(2, true, false)},
		{"no ports", Key{Family: IPv4, Words: [4]uint32{0xc0000201}}, NewNode(0, true, false)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLimiter(t, Config{Limit: 25, Window: time.Second})
			dropped := 0
			for i := range 1000 {
				v := l.Decide(&tt.key, int(quicclass.Opening), start+int64(i)*1000_000, uint32(i))
				if v.Drop {
					dropped++
					if v.Node != tt.wantNode {
						t.Fatalf("dropped at %s, want %s", v.Node.Describe(l.p, IPv4), tt.wantNode.Describe(l.p, IPv4))
					}
				}
			}
			if dropped < 900 {
				t.Fatalf("only %d of 1000 packets in 1 s dropped at limit 25", dropped)
			}
			// The all-sources node saw them: a parsed packet now counts
			// on top of them.
			parsed := key("192.0.2.1:1")
			all := l.p.Nodes[len(l.p.Nodes)-1]
			now := start + int64(time.Second)
			est := l.Estimate(&parsed, int(quicclass.Opening), all, Clean, now) + l.Estimate(&parsed, int(quicclass.Opening), all, Limited, now)
			if est < 20*uint64(One) {
				t.Fatalf("all-sources estimate %v, want the unparsed traffic in it", float64(est)/oneF)
			}
		})
	}
}

// TestPerDstPort: with the destination port dimension, floods to two ports
// are limited per port, and the all-ports node caps their sum.
func TestPerDstPort(t *testing.T) {
	l := newLimiter(t, Config{Limit: 100, Window: time.Second, PerDstPort: true,
		LevelLimits: map[int]uint32{4: 150}})
	a := KeyFrom(netip.MustParseAddrPort("198.51.100.1:53"), 443)
	b := KeyFrom(netip.MustParseAddrPort("198.51.100.1:53"), 8443)
	passed := map[uint16]int{}
	rng := rand.New(rand.NewPCG(2, 2))
	for i := range 50000 { // 5 s at 10 kpps, alternating ports
		k := &a
		if i%2 == 1 {
			k = &b
		}
		now := start + int64(i)*100_000
		if !l.Decide(k, int(quicclass.Opening), now, rng.Uint32()).Drop && now > start+int64(2*time.Second) {
			passed[k.DstPort]++
		}
	}
	// 3 s after the ramp: each port gets at most its own 100 pps, the
	// per-address all-ports node (limit 100) holds the sum to ~100.
	sum := passed[443] + passed[8443]
	if sum < 270 || sum > 330 {
		t.Fatalf("passed %v in 3 s, sum %d: want about 300", passed, sum)
	}
	if passed[443] < 100 || passed[8443] < 100 {
		t.Fatalf("passed %v: one port starved", passed)
	}
}

func TestDecideAllocs(t *testing.T) {
	l := newLimiter(t, Config{Limit: 25, Window: time.Second})
	k := key("192.0.2.1:1")
	now := start
	if n := testing.AllocsPerRun(1000, func() { now += 1000; l.Decide(&k, int(quicclass.Opening), now, 1) }); n != 0 {
		t.Fatalf("Decide allocates %v times per call", n)
	}
}

func TestHashKeyRandom(t *testing.T) {
	a, err := NewHashKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewHashKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	if a == b || a == (HashKey{}) {
		t.Fatal("two hash keys from crypto/rand are equal or zero")
	}
	// The same source lands in different columns under different keys.
	la, _ := New(Config{Limit: 1, Window: time.Second}, a)
	lb, _ := New(Config{Limit: 1, Window: time.Second}, b)
	k := key("192.0.2.1:1")
	la.Decide(&k, int(quicclass.Opening), start, 0)
	lb.Decide(&k, int(quicclass.Opening), start, 0)
	same := 0
	for i := range la.lines {
		for j := range la.lines[i].Cells {
			if la.lines[i].Cells[j].Epoch != 0 && lb.lines[i].Cells[j].Epoch != 0 {
				same++
			}
		}
	}
	if same == len(la.p.Nodes)*Depth {
		t.Fatal("every cell identical under two random keys")
	}
}

// TestSketchAccuracyZipf checks the count-min guarantee on a Zipf workload:
// no estimate below the exact decayed count (beyond fixed-point rounding),
// and no more than a fraction delta = e^-Depth of keys over it by more than
// epsilon*N, epsilon = e/Width, N the node's total.
func TestSketchAccuracyZipf(t *testing.T) {
	const keys, packets = 20000, 400000
	l := newLimiter(t, Config{Limit: 1_000_000, Window: time.Second})
	rng := rand.New(rand.NewPCG(11, 11))
	zipf := rand.NewZipf(rng, 1.1, 1, keys-1)
	exact := make([]float64, keys)
	last := make([]int64, keys)
	now := start
	w := float64(time.Second)
	total := 0.0
	lastAll := now
	ks := make([]Key, keys)
	for i := range ks {
		ks[i] = KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 1), 443)
	}
	for range packets {
		now += 5000 // 200 kpps for 2 s
		i := zipf.Uint64()
		q := now >> SlotShift << SlotShift
		exact[i] = exact[i]*math.Exp(-float64(q-last[i])/w) + 1
		last[i] = q
		total = total*math.Exp(-float64(q-lastAll)/w) + 1
		lastAll = q
		l.Decide(&ks[i], int(quicclass.Opening), now, rng.Uint32())
	}
	eps := math.E / OpeningWidth
	delta := math.Exp(-Depth)
	over := 0
	for i := range keys {
		e := exact[i] * math.Exp(-float64(now>>SlotShift<<SlotShift-last[i])/w)
		got := float64(l.Estimate(&ks[i], int(quicclass.Opening), l.p.Nodes[0], Clean, now)) / oneF
		// Each rescale of a cell floors its counts, by less than 1/256 of
		// a packet; a cell rescaled every epoch is low by at most
		// window/epoch such units in all (3.7 packets at 1 s), and a key
		// by 0.5% of its own count (TestEstimateTracksExactRate).
		if floors := float64(time.Second>>EpochShift) / oneF; got < e*(1-5e-3)-floors {
			t.Fatalf("key %d: estimate %v below exact %v", i, got, e)
		}
		if got-e > eps*total {
			over++
		}
	}
	if frac := float64(over) / keys; frac > delta {
		t.Fatalf("%.4f of keys over the bound eps*N = %.1f, want at most delta = %.3f", frac, eps*total, delta)
	}
	t.Logf("N = %.0f, eps*N = %.1f, keys over the bound: %d of %d (delta allows %.0f)", total, eps*total, over, keys, delta*keys)
}

func BenchmarkDecide(b *testing.B) {
	srcs := make([]Key, 1<<16)
	rng := rand.New(rand.NewPCG(5, 5))
	for i := range srcs {
		var a [4]byte
		for j := range a {
			a[j] = byte(rng.Uint32())
		}
		srcs[i] = KeyFrom(netip.AddrPortFrom(netip.AddrFrom4(a), uint16(rng.Uint32())), 443)
	}
	v6 := make([]Key, 1<<16)
	for i := range v6 {
		var a [16]byte
		for j := range a {
			a[j] = byte(rng.Uint32())
		}
		v6[i] = KeyFrom(netip.AddrPortFrom(netip.AddrFrom16(a), uint16(rng.Uint32())), 443)
	}
	hot := key("192.0.2.1:4000")
	for _, bc := range []struct {
		name  string
		limit uint32
		keys  []Key
	}{
		{"hot-flow-pass", 1_000_000, []Key{hot}},
		{"hot-flow-drop", 25, []Key{hot}},
		{"random-sources", 1000, srcs},
		{"random-sources-ipv6", 1000, v6},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := newLimiter(b, Config{Limit: bc.limit, Window: time.Second})
			now := start
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				now += 1000
				l.Decide(&bc.keys[i&(len(bc.keys)-1)], 0, now, uint32(i))
			}
		})
	}
}

// TestClassesApart: the classes have lattices and limits of their own, so a
// flood of one class leaves the other's packets alone.
func TestClassesApart(t *testing.T) {
	l := newLimiter(t, Config{Limit: 100, Window: time.Second, Established: Limits{Limit: 5000}})
	k := key("198.51.100.1:4000")
	passed := [NumClasses]int{}
	for i := range 40000 { // 4 s, 5000 pps of each class from one source
		now := start + int64(i)*100_000
		class := i % 2
		if !l.Decide(&k, class, now, uint32(i*2654435761)).Drop && now >= start+int64(2*time.Second) {
			passed[class]++
		}
	}
	// The opening class held at 100 pps, the established one under its
	// 5000 pps.
	opening, established := passed[quicclass.Opening], passed[quicclass.Established]
	if opening < 180 || opening > 220 || established != 10000 {
		t.Fatalf("in 2 s: the opening class (limit 100) passed %d, the established class (limit 5000, offered 10000) passed %d",
			opening, established)
	}
}

// TestSkewedClock: a clock reading older than a cell's epoch (another CPU
// moved the cell on first) must not wipe the cell. Every packet that crosses
// an epoch boundary is followed by one stamped 200 ns before it; a 95x flood
// is still held at its limit.
func TestSkewedClock(t *testing.T) {
	l := newLimiter(t, Config{Limit: 100, Window: time.Second})
	k := key("198.51.100.1:4000")
	const gap = int64(time.Second) / 9500
	now, passed, sent := start, 0, 0
	send := func(at int64) {
		sent++
		if !l.Decide(&k, int(quicclass.Opening), at, uint32(sent*2654435761)).Drop {
			passed++
		}
	}
	for now < start+int64(time.Second) {
		next := now + gap
		send(next)
		if next>>EpochShift != now>>EpochShift {
			send(next>>EpochShift<<EpochShift - 200)
		}
		now = next
	}
	// The burst (100), the noise margin (14) and a second at 100.
	if passed > 240 {
		t.Fatalf("%d of %d packets passed in 1 s at limit 100", passed, sent)
	}
}

// TestSweep: cells idle for the decay horizon are reset to now's epoch, so
// that a 32-bit epoch never wraps round to look recent; live cells are kept.
func TestSweep(t *testing.T) {
	l := newLimiter(t, Config{Limit: 100, Window: time.Second})
	old, fresh := key("198.51.100.1:1"), key("198.51.100.2:2")
	for i := range 50 {
		l.Decide(&old, int(quicclass.Opening), start+int64(i), 0)
	}
	later := start + int64(40*time.Hour)
	for i := range 50 {
		l.Decide(&fresh, int(quicclass.Opening), later+int64(i), 0)
	}
	swept := l.Sweep(later)
	// The old key's cells (6 nodes, 2 rows) and the shared total's
	// cells, touched by both, are not all old: the fresh key moved them.
	if swept == 0 || swept >= len(l.lines)*CellsPerLine {
		t.Fatalf("Sweep reset %d cells", swept)
	}
	if est := l.Estimate(&fresh, int(quicclass.Opening), l.p.Nodes[0], Clean, later); est < 49*uint64(One) {
		t.Fatalf("Sweep lost a live count: %v", float64(est)/oneF)
	}
	epoch := uint32(uint64(later) >> EpochShift)
	for i := range l.lines {
		for _, c := range l.lines[i].Cells {
			if c.Epoch != epoch {
				t.Fatalf("cell left at epoch %d after the sweep at %d", c.Epoch, epoch)
			}
		}
	}
	tests := []struct {
		cell, now uint32
		stale     bool
	}{
		{100, 100, false},
		{100, 100 + decayHorizon - 1, false},
		{100, 100 + decayHorizon, true},
		{5000, 4999, false}, // skew: the cell is ahead
		{5000, 5000 - SkewEpochs, false},
		{5000, 5000 - SkewEpochs - 1, true}, // wrapped
	}
	for _, tt := range tests {
		if got := Stale(tt.cell, tt.now); got != tt.stale {
			t.Errorf("Stale(%d, %d) = %v, want %v", tt.cell, tt.now, got, tt.stale)
		}
	}
}

// TestFairTotalWholeSources: at a capped total, the sources of a wide flood
// are admitted or refused whole for a period: most pass all their packets
// or none, rather than each losing the same share.
func TestFairTotalWholeSources(t *testing.T) {
	l := newLimiter(t, Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: 20_000}})
	var srcs []Key
	for n := range 256 {
		for a := range 4 {
			srcs = append(srcs, KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(n), byte(1 + a)}), uint16(30000+n)), 443))
		}
	}
	// Start at a period boundary; settle for 2 s, then count 2 s, all
	// within one period of 4.3 s. 200,000 pps, 195 per source.
	t0 := (start>>PeriodShift + 1) << PeriodShift
	offered, passed := make([]int, len(srcs)), make([]int, len(srcs))
	rng := rand.New(rand.NewPCG(4, 4))
	for i := range 800_000 {
		now := t0 + int64(i)*5000
		j := rng.IntN(len(srcs))
		v := l.Decide(&srcs[j], int(quicclass.Opening), now, rng.Uint32())
		if now >= t0+int64(2*time.Second) {
			offered[j]++
			if !v.Drop {
				passed[j]++
			}
		}
	}
	whole, total := 0, 0
	for j := range srcs {
		total += passed[j]
		if f := float64(passed[j]) / float64(offered[j]); f <= 0.05 || f >= 0.95 {
			whole++
		}
	}
	if whole < len(srcs)*9/10 || total < 2*18_000 || total > 2*22_000 {
		t.Fatalf("%d of %d sources passed all or nothing (want 90%%); %d passed in 2 s at a cap of 20,000 pps", whole, len(srcs), total)
	}
}

// TestHashSpreadsProgressions: keys in arithmetic progression (256
// consecutive /24s) collide in a row about as often as random keys would
// (256^2 / 2 / 4140, about 8), under every one of many secrets; a linear
// hash without the mix crowds them into a few columns for some secrets.
func TestHashSpreadsProgressions(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	worst := 0
	for range 500 {
		var hk HashKey
		hk.A[0][1], hk.B[0] = rng.Uint64(), rng.Uint64()
		seen := map[[2]uint64]bool{}
		collisions := 0
		for n := range 256 {
			h := hk.A[0][1]*uint64(0x0a020000+n<<8) + hk.B[0]
			line, cell := column(h, OpeningLines)
			if seen[[2]uint64{line, cell}] {
				collisions++
			}
			seen[[2]uint64{line, cell}] = true
		}
		worst = max(worst, collisions)
	}
	if worst > 25 {
		t.Fatalf("256 consecutive /24s: up to %d collisions in a row of %d cells", worst, OpeningWidth)
	}
}

// TestFairTotalAfterFlood: after a wide flood stops, the total's offered
// rate, smoothed over the window, stays over its cap for about two seconds.
// A network sending 75 pps, near the fair share of the flood (20,000 / 256,
// about 78), then sends alone: once the total's forwarded count has decayed
// under the cap (a few tenths of a second), it loses nothing. A share that
// went on learning from what arrives would admit only cap / offered of it.
func TestFairTotalAfterFlood(t *testing.T) {
	l := newLimiter(t, Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: 20_000}})
	rng := rand.New(rand.NewPCG(5, 5))
	now := start
	quiet := func() Key {
		return KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, 10}), uint16(1024+rng.IntN(60000))), 443)
	}
	// The quiet network alone for 3 s, so that its estimate is its rate;
	// then 0.5 s at 400,000 pps from 1024 addresses in 256 /24s, the quiet
	// network still sending among them.
	for range 225 {
		now += int64(time.Second) / 75
		q := quiet()
		l.Decide(&q, int(quicclass.Opening), now, rng.Uint32())
	}
	for i := range 200_000 {
		now += 2500
		n, a := rng.IntN(256), rng.IntN(4)
		k := KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(n), byte(1 + a)}), uint16(30000+n)), 443)
		l.Decide(&k, int(quicclass.Opening), now, rng.Uint32())
		if i%5333 == 0 {
			q := quiet()
			l.Decide(&q, int(quicclass.Opening), now, rng.Uint32())
		}
	}
	end := now
	totalNode := l.p.Nodes[l.p.FairNode]
	if pps := l.PPS(l.Estimate(&Key{Family: IPv4}, int(quicclass.Opening), totalNode, Clean, now)); pps < 2*20_000 {
		t.Fatalf("the total's offered rate is %.0f pps at the end of the flood, want over twice the cap", pps)
	}
	early, late := 0, 0
	for range 112 { // 1.5 s at 75 pps
		now += int64(time.Second) / 75
		q := quiet()
		if l.Decide(&q, int(quicclass.Opening), now, rng.Uint32()).Drop {
			if now-end < int64(time.Second/2) {
				early++
			} else {
				late++
			}
		}
	}
	if pps := l.PPS(l.Estimate(&Key{Family: IPv4}, int(quicclass.Opening), totalNode, Clean, now)); pps < 20_000 {
		t.Fatalf("the total's offered rate is %.0f pps 1.5 s after the flood, want still over the cap", pps)
	}
	if late != 0 {
		t.Fatalf("from 0.5 s after the flood on, the quiet network lost %d packets (%d in the first 0.5 s)", late, early)
	}
	t.Logf("lost %d packets in the first 0.5 s after the flood, while the total still forwarded over its cap", early)
}

// TestUnverifiedClass: the unverified class has the default limits (every level but the
// top at DefaultUnverifiedLimit, the top at DefaultUnverifiedTotal) unless
// configured, narrow rows, and with the other classes fits in 1 MiB.
func TestUnverifiedClass(t *testing.T) {
	p, err := Compile(Config{Limit: 100, Window: time.Second, Established: Limits{Limit: 200_000}})
	if err != nil {
		t.Fatal(err)
	}
	top := len(p.Nodes) - 1
	for i, n := range p.Nodes {
		want := threshold(DefaultUnverifiedLimit, p.WindowNanos)
		if i == top {
			want = threshold(DefaultUnverifiedTotal, p.WindowNanos)
		}
		if p.Thresh[quicclass.Unverified][i] != want {
			t.Errorf("node %d (level %d): unverified class threshold %d, want %d", i, n.Level(), p.Thresh[quicclass.Unverified][i], want)
		}
		lines := uint32(UnverifiedLines)
		if i == top {
			lines = 1
		}
		if p.Lines[quicclass.Unverified][i] != lines || p.Base[quicclass.Unverified][i] < p.Base[quicclass.Established][top]+Depth*p.Lines[quicclass.Established][top] {
			t.Errorf("node %d: the unverified class has %d lines at %d, want %d after the established class", i, p.Lines[quicclass.Unverified][i], p.Base[quicclass.Unverified][i], lines)
		}
	}
	// Every class's rows, and the returning part's line.
	if got := p.TotalLines * LineBytes; got != 1_047_488 || got > 1<<20 || p.ReturningLine != uint32(p.TotalLines-1) {
		t.Errorf("the sketches take %d bytes, want 1,047,488 (under 1 MiB), the returning part's line last", got)
	}
	c := Config{Limit: 100, Window: time.Second, Unverified: Limits{Limit: 50, LevelLimits: map[int]uint32{1: 70}}}
	if p, err = Compile(c); err != nil {
		t.Fatal(err)
	}
	for i, n := range p.Nodes {
		want := threshold(50, p.WindowNanos)
		if n.Level() == 1 {
			want = threshold(70, p.WindowNanos)
		}
		if p.Thresh[quicclass.Unverified][i] != want {
			t.Errorf("configured: node %d unverified class threshold %d, want %d", i, p.Thresh[quicclass.Unverified][i], want)
		}
	}
}

// TestUnverifiedTotal: junk in the unverified class from a new random source on every
// packet, 50 times the class's total, is held near the total (what passes
// while the fair share settles aside), and the established class beside it
// passes whole.
func TestUnverifiedTotal(t *testing.T) {
	l := newLimiter(t, Config{Limit: 100, Window: time.Second, Established: Limits{Limit: 5000}})
	rng := rand.New(rand.NewPCG(6, 6))
	user := key("192.0.2.7:5000")
	var junk, users [2]int
	for i := range 200_000 { // 2 s at 100,000 pps of junk
		now := start + int64(i)*10_000
		k := KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()),
			byte(rng.Uint32()), byte(rng.Uint32())}), uint16(1024+rng.IntN(60000))), 443)
		sec := i / 100_000
		if !l.Decide(&k, int(quicclass.Unverified), now, rng.Uint32()).Drop {
			junk[sec]++
		}
		if i%50 == 0 && !l.Decide(&user, int(quicclass.Established), now, rng.Uint32()).Drop {
			users[sec]++
		}
	}
	if junk[1] < DefaultUnverifiedTotal*8/10 || junk[1] > DefaultUnverifiedTotal*13/10 || junk[0] > 4*DefaultUnverifiedTotal {
		t.Fatalf("junk passed %d in the first second and %d in the second, at a total of %d", junk[0], junk[1], DefaultUnverifiedTotal)
	}
	if users != [2]int{2000, 2000} {
		t.Fatalf("the established class beside it passed %v of 2000 a second", users)
	}
	t.Logf("junk passed %v a second", junk)
}

// TestReturning: at a capped total, a source marked Returning inside a
// flooded network keeps every packet, where the same source unmarked loses
// most of them.
func TestReturning(t *testing.T) {
	for _, returning := range []bool{true, false} {
		t.Run(fmt.Sprintf("returning=%v", returning), func(t *testing.T) {
			l := newLimiter(t, Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: 20_000}})
			rng := rand.New(rand.NewPCG(7, 7))
			var users []Key
			for n := range 16 {
				k := KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(n), 9}), 40000), 443)
				k.Returning = returning
				users = append(users, k)
			}
			offered, passed := 0, 0
			for i := range 800_000 { // 4 s at 200,000 pps from 1024 sources in 256 /24s
				now := start + int64(i)*5000
				n, a := rng.IntN(256), rng.IntN(4)
				k := KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(n), byte(1 + a)}), uint16(30000+n)), 443)
				l.Decide(&k, int(quicclass.Opening), now, rng.Uint32())
				if i%250 == 0 { // 50 pps from each user
					u := &users[i/250%16]
					v := l.Decide(u, int(quicclass.Opening), now, rng.Uint32())
					if now >= start+int64(time.Second) {
						offered++
						if !v.Drop {
							passed++
						}
					}
				}
			}
			if returning && passed != offered || !returning && passed > offered/2 {
				t.Fatalf("users passed %d of %d", passed, offered)
			}
			t.Logf("users passed %d of %d", passed, offered)
		})
	}
}

// TestReturningInFloodedNetwork: a returning user in a /24 that a flood
// from the /24's other addresses holds far over its limit keeps its
// packets (the network's nodes pass it), where a stranger beside it loses
// nearly all; and its own address's limits still hold it: a returning
// source at five times the per-address limit is held near the limit.
func TestReturningInFloodedNetwork(t *testing.T) {
	l := newLimiter(t, Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: 20_000}})
	rng := rand.New(rand.NewPCG(8, 8))
	user := key("10.9.9.200:40000")
	user.Returning = true
	stranger := key("10.9.9.201:40000")
	greedy := key("10.9.8.7:40000")
	greedy.Returning = true
	var userN, userOK, strN, strOK, greedyOK int
	for i := range 400_000 { // 4 s: 100,000 pps from random addresses of 10.9.9.0/24
		now := start + int64(i)*10_000
		k := KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 9, 9, byte(rng.IntN(200))}), uint16(1024+rng.IntN(60000))), 443)
		l.Decide(&k, int(quicclass.Opening), now, rng.Uint32())
		second := now >= start+int64(time.Second)
		if i%2000 == 0 { // 50 pps each
			if v := l.Decide(&user, int(quicclass.Opening), now, rng.Uint32()); second {
				userN++
				if !v.Drop {
					userOK++
				}
			}
			if v := l.Decide(&stranger, int(quicclass.Opening), now, rng.Uint32()); second {
				strN++
				if !v.Drop {
					strOK++
				}
			}
		}
		if i%20 == 0 { // 5,000 pps
			if v := l.Decide(&greedy, int(quicclass.Opening), now, rng.Uint32()); second && !v.Drop {
				greedyOK++
			}
		}
	}
	if userOK < userN*99/100 || strOK > strN/10 {
		t.Fatalf("the returning user kept %d of %d, the stranger beside it %d of %d", userOK, userN, strOK, strN)
	}
	if perSec := greedyOK / 3; perSec > 1300 || perSec < 800 {
		t.Fatalf("a returning source at 5,000 pps passed %d a second, its address's limit is 1,000", perSec)
	}
	t.Logf("returning user %d of %d, stranger %d of %d, greedy returning source %d a second", userOK, userN, strOK, strN, greedyOK/3)
}

// TestReturningBotnet: returning sources flooding the opening class, each
// under every limit of its own (60 addresses in 60 /24s at 900 pps from
// ever new ports, as new connections come, 54,000 pps against a total of
// 20,000), take the returning part of the total first and are ranked with
// everyone past it: the total holds, and a quiet stranger network keeps
// its packets. Unmarked, the same sources are held alike.
func TestReturningBotnet(t *testing.T) {
	for _, returning := range []bool{true, false} {
		t.Run(fmt.Sprintf("returning=%v", returning), func(t *testing.T) {
			const total = 20_000
			l := newLimiter(t, Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: total}})
			rng := rand.New(rand.NewPCG(9, 9))
			port := func() uint16 { return uint16(1024 + rng.IntN(60000)) }
			botsOK, quietN, quietOK := 0, 0, 0
			const step = int64(time.Second) / 54_000
			for i := range 4 * 54_000 { // 4 s
				now := start + int64(i)*step
				second := now >= start+int64(time.Second)
				bot := KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 3, byte(i % 60), 1}), port()), 443)
				bot.Returning = returning
				if v := l.Decide(&bot, int(quicclass.Opening), now, rng.Uint32()); second && !v.Drop {
					botsOK++
				}
				if i%1080 == 0 { // 50 pps
					quiet := KeyFrom(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 4, 0, 9}), port()), 443)
					if v := l.Decide(&quiet, int(quicclass.Opening), now, rng.Uint32()); second {
						quietN++
						if !v.Drop {
							quietOK++
						}
					}
				}
			}
			if perSec := botsOK / 3; perSec > total*11/10 {
				t.Fatalf("the bots passed %d a second, over the total of %d", perSec, total)
			}
			if quietOK < quietN*9/10 {
				t.Fatalf("the quiet network kept %d of %d", quietOK, quietN)
			}
			t.Logf("bots passed %d a second; the quiet network kept %d of %d", botsOK/3, quietOK, quietN)
		})
	}
}

// TestAdmitFairFloor: at the fair total, a network the share admits at p of
// its packets keeps max(p, f) of them, f = thr/total: a packet the rank
// refuses passes by the proportional floor with the probability that makes
// up the difference, and a network the share admits at f or more never
// needs the floor. While the forwarded count is over the limit, the share
// and the floor shrink alike, to nothing at twice the limit (FairSlack).
// Every outcome is counted over a grid of ranks and coins.
func TestAdmitFairFloor(t *testing.T) {
	const thr, total, network = 20_000 << FracBits, 200_000 << FracBits, 800 << FracBits // f = 0.1
	tests := []struct {
		name      string
		p         float64 // the share, as the fraction of the network it admits
		forwarded uint64
		want      float64 // the fraction of the network's packets kept
	}{
		{"under the share", 1, thr, 1},
		{"share admits half", 0.5, thr, 0.5},
		{"share admits f", 0.1, thr, 0.1},
		{"share admits a twentieth", 0.05, thr, 0.1},
		{"share admits nothing", 0, thr, 0.1},
		{"forwarded 1.5 x limit, share admits f", 0.1, thr * 3 / 2, 0.05},
		{"forwarded 1.5 x limit, share admits a fortieth", 0.025, thr * 3 / 2, 0.05},
		{"forwarded 1.75 x limit, share admits half", 0.5, thr * 7 / 4, 0.125},
		{"forwarded twice the limit", 0.5, 2 * thr, 0},
	}
	const ranks, coins = 1024, 256
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			share := uint64(tt.p * float64(uint64(network)<<16))
			kept, floors := 0, 0
			for r := range ranks {
				rank := uint32(uint64(r)<<32/ranks + 1<<21)
				for c := range coins {
					nw := nodeWork{omin: total, fmin: uint32(tt.forwarded), network: network, coin: uint32(c)<<8 + 0x80}
					s := share
					switch admitFair(&s, &nw, rank, thr) {
					case fairRank:
						kept++
					case fairFloor:
						kept++
						floors++
					}
				}
			}
			got := float64(kept) / (ranks * coins)
			if math.Abs(got-tt.want) > 0.005 {
				t.Errorf("kept %.4f of the network's packets, want %.4f", got, tt.want)
			}
			if tt.p >= 0.1 && tt.forwarded <= thr && floors != 0 {
				t.Errorf("the floor admitted %d packets of a network the share admits at f or more", floors)
			}
		})
	}
}
