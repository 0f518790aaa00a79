package sketch

import (
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// spoofedKey is a new random address and port in 10.128.0.0/9, the source of
// one packet of a spoofed flood.
func spoofedKey(rng *rand.Rand) Key {
	a := netip.AddrFrom4([4]byte{10, byte(128 + rng.IntN(128)), byte(rng.IntN(256)), byte(rng.IntN(256))})
	return KeyFrom(netip.AddrPortFrom(a, uint16(1024+rng.IntN(64000))), 443)
}

// reflectPort is the source port of the reflection floods in these tests.
const reflectPort = 53

// reflectedKey is a new random address in 10.128.0.0/9 from port
// reflectPort, the source of one packet of a reflection flood (or a spoofed
// flood that keeps one source port).
func reflectedKey(rng *rand.Rand) Key {
	k := spoofedKey(rng)
	k.SrcPort = reflectPort
	return k
}

// TestScreenParams checks where configurations screen: at a fair total or a
// limited reflection node, with a network node that has a limit and no node
// more specific than the network's with a lower one.
func TestScreenParams(t *testing.T) {
	const both = ScreenFair | ScreenReflect
	tests := []struct {
		name   string
		mutate func(*Config)
		want   [NumClasses]uint8
	}{
		{"defaults", func(*Config) {}, [NumClasses]uint8{both, ScreenReflect, both}},
		{"a lower limit at level 0", func(c *Config) { c.LevelLimits = map[int]uint32{0: 500} }, [NumClasses]uint8{0, ScreenReflect, both}},
		{"a higher limit at level 0", func(c *Config) { c.LevelLimits = map[int]uint32{0: 5000} }, [NumClasses]uint8{both, ScreenReflect, both}},
		{"specific levels unlimited", func(c *Config) { c.LevelLimits = map[int]uint32{0: Unlimited, 1: Unlimited} }, [NumClasses]uint8{both, ScreenReflect, both}},
		{"networks unlimited", func(c *Config) { c.LevelLimits = map[int]uint32{2: Unlimited} }, [NumClasses]uint8{0, ScreenReflect, both}},
		{"total unlimited", func(c *Config) { c.LevelLimits = map[int]uint32{3: Unlimited} }, [NumClasses]uint8{ScreenReflect, ScreenReflect, both}},
		{"one drop rate at the total", func(c *Config) { c.ProportionalTotal = true }, [NumClasses]uint8{}},
		{"a single prefix", func(c *Config) {
			c.IPv4Prefixes, c.IPv6Prefixes = []uint8{0}, []uint8{0}
			c.Established.LevelLimits = map[int]uint32{1: Unlimited}
		}, [NumClasses]uint8{}},
		{"per destination port", func(c *Config) { c.PerDstPort = true }, [NumClasses]uint8{ScreenFair, 0, ScreenFair}},
		{"established with a total", func(c *Config) {
			c.Established = Limits{Limit: 200_000, LevelLimits: map[int]uint32{3: 400_000}}
		}, [NumClasses]uint8{both, both, both}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Limit: 1000, Window: time.Second,
				Established: Limits{Limit: 200_000, LevelLimits: map[int]uint32{3: Unlimited}}}
			tt.mutate(&c)
			p, err := Compile(c)
			if err != nil {
				t.Fatal(err)
			}
			if p.Screen != tt.want {
				t.Fatalf("Screen = %v, want %v", p.Screen, tt.want)
			}
		})
	}
}

// TestScreenSpoofed runs floods of a new random source on every packet, ten
// times the limit that catches them, through a limiter that screens and one
// that does not: a spoofed flood (a random port too), which the fair total
// limits, and a reflection flood (one source port), which the reflection
// node limits. Every verdict must be the same (a new source is under every
// limit but the one that catches the flood, so the nodes the screen skips
// decide nothing), and the screen must decide nearly every drop, at the
// node that limits the flood: the dropped packet leaves its source's
// estimate at the most specific node as it was, where the walk counts it
// there.
func TestScreenSpoofed(t *testing.T) {
	tests := []struct {
		name  string
		flood func(*rand.Rand) Key
		node  Node
	}{
		{"spoofed, at the fair total", spoofedKey, NewNode(2, true, false)},
		{"reflection, at the reflection node", reflectedKey, NewNode(2, false, false)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: 2000}}
			screened, walked := newLimiter(t, c), newLimiter(t, c)
			walked.p.Screen = [NumClasses]uint8{}
			n0 := screened.p.Nodes[0]
			rng := rand.New(rand.NewPCG(5, 6))
			now := start
			drops, uncounted := 0, 0
			for i := range 40_000 { // 20,000 pps for 2 s
				now += int64(time.Second) / 20_000
				k, rnd := tt.flood(rng), rng.Uint32()
				before := screened.Estimate(&k, int(quicclass.Opening), n0, Clean, now)
				a, b := screened.Decide(&k, int(quicclass.Opening), now, rnd), walked.Decide(&k, int(quicclass.Opening), now, rnd)
				if a != b {
					t.Fatalf("packet %d: the screen decided %+v, the walk %+v", i, a, b)
				}
				if a.Drop {
					if a.Node != tt.node {
						t.Fatalf("packet %d dropped at %v, want %v", i, a.Node, tt.node)
					}
					drops++
					if screened.Estimate(&k, int(quicclass.Opening), n0, Clean, now) == before {
						uncounted++
					}
				}
			}
			if drops < 30_000 {
				t.Fatalf("%d drops of 40,000: the flood was not over its limit", drops)
			}
			if uncounted < drops*9/10 {
				t.Fatalf("the screen decided %d of %d drops, want at least 90%%", uncounted, drops)
			}
			t.Logf("%d drops, %d decided by the screen", drops, uncounted)
		})
	}
}

// TestScreenWalks checks that the screen leaves to the walk the packets of a
// network it cannot judge alone, during a flood that keeps the screen on (a
// spoofed flood, which bounds the total's share, or a reflection flood,
// which the reflection node drops, the client sending from its port): every
// packet of such a network is counted at its most specific node, as the
// walk counts it, whether the flood's node drops it or not.
func TestScreenWalks(t *testing.T) {
	networks := []struct {
		name string
		// neighbour is the network's other traffic, sent before and
		// with the client's packets: pps from one source, or from a
		// new address of the /24 each packet.
		neighbourPPS int
		spread       bool
	}{
		// A source over its own limit: its network holds limited
		// traffic, which the screen cannot place.
		{"limited traffic in the network", 3000, false},
		// Sources each under their limit, their /24 over its own.
		{"the network over its limit", 3000, true},
		// Sources each under their limit, their /24 under its own but
		// over the screen's headroom (ScreenHeadroomShift).
		{"the network over half its limit", 700, true},
	}
	floods := []struct {
		name  string
		flood func(*rand.Rand) Key
		// on is where the flood must have turned the screen on.
		on   uint8
		port uint16 // the client's source port
	}{
		{"spoofed", spoofedKey, ScreenFair, 40000},
		{"reflection", reflectedKey, ScreenReflect, reflectPort},
	}
	for _, fl := range floods {
		for _, tt := range networks {
			t.Run(fl.name+", "+tt.name, func(t *testing.T) {
				c := Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: 2000}}
				l := newLimiter(t, c)
				rng := rand.New(rand.NewPCG(7, 8))
				now := start
				const floodPPS = 20_000
				send := func(k Key) Verdict { return l.Decide(&k, int(quicclass.Opening), now, rng.Uint32()) }
				every := floodPPS / tt.neighbourPPS
				for i := range 2 * floodPPS { // two seconds: the share settles
					now += int64(time.Second) / floodPPS
					send(fl.flood(rng))
					if i%every == 0 {
						if tt.spread {
							send(key("192.0.2." + strconv.Itoa(1+rng.IntN(250)) + ":" + strconv.Itoa(1024+rng.IntN(60000))))
						} else {
							send(key("192.0.2.7:5000"))
						}
					}
				}
				// A flood packet that its node lets through turns the
				// reflection node's screen off until the next drop.
				for i := 0; l.screening[quicclass.Opening]&fl.on == 0; i++ {
					if i == 100 {
						t.Fatalf("the flood left the screen off (%b): the premise failed", l.screening[quicclass.Opening])
					}
					now += int64(time.Second) / floodPPS
					send(fl.flood(rng))
				}
				client := key("192.0.2.200:" + strconv.Itoa(int(fl.port)))
				const packets = 20
				for range packets {
					now += int64(time.Millisecond) / 10
					send(client)
					send(fl.flood(rng))
				}
				got := l.Estimate(&client, int(quicclass.Opening), l.p.Nodes[0], Clean, now) >> FracBits
				if got < packets-1 {
					t.Fatalf("the client's most specific node counts %d of its %d packets: the screen decided them", got, packets)
				}
			})
		}
	}
}

// TestScreenTurnsOff checks when the screen runs (Limiter.screening), at
// each node it asks. At the fair total: a spoofed flood over the total turns
// it on, and a flood from one source that the walk limits below the total,
// reaching the total as limited traffic, turns it off again, though the
// clean share it left stays bounded; each of that flood's packets is then
// walked straight away instead of paying for a screen that would leave it
// to the walk. At the reflection node: a reflection flood turns it on, and a
// spoofed flood that follows it (a random port on every packet, no port
// over its limit) turns it off on its first packets, which the node would
// not drop.
func TestScreenTurnsOff(t *testing.T) {
	const pps = 20_000
	tests := []struct {
		name      string
		at        uint8
		total     uint32 // the socket total's limit
		on, off   func(*rand.Rand) Key
		offPacket int // how many packets of off to send
	}{
		{"at the fair total", ScreenFair, 500, spoofedKey, func(*rand.Rand) Key { return key("198.51.100.7:4000") }, 2 * pps},
		{"at the reflection node", ScreenReflect, 2000, reflectedKey, spoofedKey, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Limit: 1000, Window: time.Second, LevelLimits: map[int]uint32{3: tt.total}}
			l := newLimiter(t, c)
			rng := rand.New(rand.NewPCG(9, 10))
			now := start
			send := func(flood func(*rand.Rand) Key, n int) {
				for range n {
					now += int64(time.Second) / pps
					k := flood(rng)
					l.Decide(&k, int(quicclass.Opening), now, rng.Uint32())
				}
			}
			send(tt.on, 2*pps)
			// A packet the reflection node lets through turns its
			// screen off until the next drop.
			for i := 0; l.screening[quicclass.Opening]&tt.at == 0; i++ {
				if i == 100 {
					t.Fatal("the flood that the node drops left the screen off")
				}
				send(tt.on, 1)
			}
			send(tt.off, tt.offPacket)
			if tt.at == ScreenFair && l.fair[quicclass.Opening][Clean] == FairUnbounded {
				t.Fatal("the clean share is unbounded: the premise failed")
			}
			if l.screening[quicclass.Opening]&tt.at != 0 {
				t.Fatal("a flood the node does not drop left the screen on")
			}
		})
	}
}

// TestTakes: Params.Takes answers as SameShape on the compiled
// configuration does, without compiling it.
func TestTakes(t *testing.T) {
	base := Config{Limit: 100, Window: time.Second}
	tests := []struct {
		name string
		c    Config
		want bool
	}{
		{"another limit", Config{Limit: 500, Window: 2 * time.Second}, true},
		{"the default prefixes written out", Config{Limit: 100, Window: time.Second, IPv4Prefixes: []uint8{32, 24, 0},
			IPv6Prefixes: []uint8{64, 48, 0}}, true},
		{"other prefixes of the same number", Config{Limit: 100, Window: time.Second, IPv4Prefixes: []uint8{32, 16, 0},
			IPv6Prefixes: []uint8{128, 56, 0}}, true},
		{"fewer prefixes", Config{Limit: 100, Window: time.Second, IPv4Prefixes: []uint8{32, 0}, IPv6Prefixes: []uint8{64, 0}}, false},
		{"per destination port", Config{Limit: 100, Window: time.Second, PerDstPort: true}, false},
	}
	p, err := Compile(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := Compile(tt.c)
			if err != nil {
				t.Fatal(err)
			}
			if got, same := p.Takes(tt.c), p.SameShape(q); got != tt.want || got != same {
				t.Errorf("Takes %v, SameShape %v, want %v", got, same, tt.want)
			}
		})
	}
}
