//go:build linux

package bpf

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// twin runs the BPF program (in test mode) and the Go limiter side by side
// on the same packets, time and random numbers, and fails the test at the
// first difference.
type twin struct {
	t      testing.TB
	f      *Filter
	l      *sketch.Limiter
	stats  Stats // what the counters should say
	packet int
}

func newTwin(t testing.TB, c sketch.Config) *twin {
	t.Helper()
	hk := fixedKey(7)
	f := loadTest(t, c, loadOptions{testMode: true, hashKey: &hk})
	l, err := sketch.New(c, hk)
	if err != nil {
		t.Fatal(err)
	}
	return &twin{t: t, f: f, l: l}
}

// step sends p through both; hasPorts says whether the filter is expected
// to read p's ports (and the key the Go limiter gets).
func (w *twin) step(p packet, k sketch.Key, now int64, rnd uint32) sketch.Verdict {
	w.t.Helper()
	w.packet++
	got := w.f.run(w.t, p.frame(), now, rnd)
	want := w.l.Decide(&k, now, rnd)
	if (got.Drop == 1) != want.Drop || (got.Limited == 1) != want.Limited ||
		(want.Limited && (int(got.Level) != want.Level || sketch.Node(got.Node) != want.Node || got.Estimate != want.Estimate)) {
		w.t.Fatalf("packet %d (%v:%d, key %+v) at %d: BPF %+v, Go %+v", w.packet, p.src, p.sport, k, now, got, want)
	}
	fam := FamilyIndex(k.Family)
	switch {
	case want.Drop:
		w.stats.Dropped[fam][want.Level]++
	case want.Limited:
		w.stats.Passed[fam]++
		w.stats.Limited[fam][want.Level]++
	default:
		w.stats.Passed[fam]++
	}
	return want
}

// compareState checks every sketch cell and the counters.
func (w *twin) compareState() {
	w.t.Helper()
	got, want := w.f.cells(w.t), w.l.Cells()
	if len(got) != len(want) {
		w.t.Fatalf("BPF has %d cells, Go %d", len(got), len(want))
	}
	for i := range want {
		g := sketch.Cell{Epoch: got[i].Epoch}
		for c := range got[i].Class {
			g.Class[c] = sketch.Counter{Offered: got[i].Class[c].Offered, Forwarded: got[i].Class[c].Forwarded}
		}
		if g != want[i] {
			w.t.Fatalf("after packet %d: cell %d differs: BPF %+v, Go %+v", w.packet, i, g, want[i])
		}
	}
	st, err := w.f.Stats()
	if err != nil {
		w.t.Fatal(err)
	}
	if st != w.stats {
		w.t.Fatalf("after packet %d: counters %+v, want %+v", w.packet, st, w.stats)
	}
}

// TestParse feeds frames of every shape the parser must handle and checks
// that the program keyed each exactly as expected: the whole sketch state
// must equal the Go limiter's given the expected key. (BPF_PROG_TEST_RUN
// refuses frames whose IP header is cut short, and no UDP socket receives
// one, so those are left out.)
func TestParse(t *testing.T) {
	v4, v6 := udp("198.51.100.1", 1111), udp("2001:db8:1:2::3", 2222)
	with := func(p packet, fn func(*packet)) packet { fn(&p); return p }
	unknown := sketch.Key{Family: sketch.Unknown}
	tests := []struct {
		name     string
		p        packet
		hasPorts bool
		key      *sketch.Key // overrides p.key(hasPorts)
	}{
		{"ipv4", v4, true, nil},
		{"ipv4 port 0", with(v4, func(p *packet) { p.sport = 0 }), true, nil},
		{"ipv4 port 65535", with(v4, func(p *packet) { p.sport = 65535; p.dport = 65535 }), true, nil},
		{"ipv4 options", with(v4, func(p *packet) { p.ipv4Options = 1 }), true, nil},
		{"ipv4 max options", with(v4, func(p *packet) { p.ipv4Options = 10 }), true, nil},
		{"ipv4 first fragment", with(v4, func(p *packet) { p.ipv4FragOffset = 0x2000 }), true, nil},
		{"ipv4 later fragment", with(v4, func(p *packet) { p.ipv4FragOffset = 0x2000 | 185 }), false, nil},
		{"ipv4 udplite", with(v4, func(p *packet) { p.proto = unix.IPPROTO_UDPLITE }), true, nil},
		{"ipv4 tcp", with(v4, func(p *packet) { p.proto = unix.IPPROTO_TCP }), false, nil},
		{"ipv4 header only", with(v4, func(p *packet) { p.truncate = ipv4HdrLen }), false, nil},
		{"ipv4 header and half a port", with(v4, func(p *packet) { p.truncate = ipv4HdrLen + 3 }), false, nil},
		{"ipv4 options, ports cut", with(v4, func(p *packet) { p.ipv4Options = 2; p.truncate = ipv4HdrLen + 10 }), false, nil},
		{"ipv6", v6, true, nil},
		{"ipv6 hop-by-hop", with(v6, func(p *packet) { p.ipv6Ext = []ipv6Ext{{kind: unix.IPPROTO_HOPOPTS}} }), true, nil},
		{"ipv6 every extension", with(v6, func(p *packet) {
			p.ipv6Ext = []ipv6Ext{{kind: unix.IPPROTO_HOPOPTS, units: 1}, {kind: unix.IPPROTO_ROUTING, units: 2},
				{kind: unix.IPPROTO_DSTOPTS}, {kind: unix.IPPROTO_FRAGMENT}, {kind: unix.IPPROTO_AH, units: 4},
				{kind: unix.IPPROTO_DSTOPTS, units: 3}}
		}), true, nil},
		{"ipv6 too many extensions", with(v6, func(p *packet) {
			for range 7 {
				p.ipv6Ext = append(p.ipv6Ext, ipv6Ext{kind: unix.IPPROTO_DSTOPTS})
			}
		}), false, nil},
		{"ipv6 later fragment", with(v6, func(p *packet) {
			p.ipv6Ext = []ipv6Ext{{kind: unix.IPPROTO_FRAGMENT, fragOffset: 100}}
		}), false, nil},
		{"ipv6 tcp", with(v6, func(p *packet) { p.proto = unix.IPPROTO_TCP }), false, nil},
		{"ipv6 header only", with(v6, func(p *packet) { p.truncate = ipv6HdrLen }), false, nil},
		{"ipv6 extension cut", with(v6, func(p *packet) {
			p.ipv6Ext = []ipv6Ext{{kind: unix.IPPROTO_HOPOPTS}}
			p.truncate = ipv6HdrLen + 2
		}), false, nil},
		{"not ip", with(v4, func(p *packet) { p.etherType = 0x88b5 }), false, &unknown},
	}
	for _, size := range []int{0, 1, 7, 8, 35, 36, 64, 1200, 1350} {
		tests = append(tests,
			struct {
				name     string
				p        packet
				hasPorts bool
				key      *sketch.Key
			}{fmt.Sprintf("ipv4 payload %d", size), with(v4, func(p *packet) { p.payload = size }), true, nil},
			struct {
				name     string
				p        packet
				hasPorts bool
				key      *sketch.Key
			}{fmt.Sprintf("ipv6 payload %d", size), with(v6, func(p *packet) { p.payload = size }), true, nil},
		)
	}
	w := newTwin(t, sketch.Config{Limit: 1000, Window: time.Second})
	now := start
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w.t = t
			// A distinct source per case, so that each lands in its own cells.
			tt.p.sport += uint16(i)
			k := tt.p.key(tt.hasPorts)
			if tt.key != nil {
				k = *tt.key
			}
			now += int64(time.Millisecond)
			w.step(tt.p, k, now, uint32(i))
			w.compareState()
		})
	}
}

// TestDifferential runs a long random trace, with a configuration change in
// the middle, through the program and the Go limiter.
func TestDifferential(t *testing.T) {
	for _, perDstPort := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-dport=%v", perDstPort), func(t *testing.T) {
			c := sketch.Config{Limit: 50, Window: 500 * time.Millisecond, PerDstPort: perDstPort}
			w := newTwin(t, c)
			rng := rand.New(rand.NewPCG(3, 4))
			var pool []packet
			for i := range 300 {
				var p packet
				switch i % 3 {
				case 0:
					p = udp(fmt.Sprintf("198.51.%d.%d", rng.IntN(4), rng.IntN(256)), uint16(rng.Uint32()))
				case 1:
					p = udp(fmt.Sprintf("2001:db8:%x:%x::%x", rng.IntN(3), rng.IntN(4), rng.IntN(1<<16)), uint16(rng.Uint32()))
				default:
					p = udp("203.0.113.9", uint16(rng.IntN(8)))
				}
				p.dport = 443 + uint16(rng.IntN(2))
				pool = append(pool, p)
			}
			unparsed := udp("192.0.2.1", 1)
			unparsed.etherType = 0x88b5
			now := start
			for i := range 40000 {
				if i == 20000 {
					c.Limit, c.Window = 80, 2*time.Second
					c.LevelLimits = map[int]uint32{c.WithDefaults().Levels() - 1: sketch.Unlimited}
					if err := w.f.Update(c); err != nil {
						t.Fatal(err)
					}
					if err := w.l.Update(c); err != nil {
						t.Fatal(err)
					}
				}
				switch {
				case i%5000 == 4999: // long idle times exercise every decay table
					now += []int64{int64(700 * time.Millisecond), int64(3 * time.Second), int64(400 * time.Second), int64(50 * time.Hour)}[i/5000%4]
				default:
					now += int64(rng.ExpFloat64() * 20e3)
				}
				var p packet
				var k sketch.Key
				switch r := rng.IntN(100); {
				case r < 40: // a heavy hitter
					p = pool[2]
				case r < 42:
					p, k = unparsed, sketch.Key{Family: sketch.Unknown}
				default:
					p = pool[rng.IntN(len(pool))]
				}
				if p.etherType == 0 {
					k = p.key(true)
				}
				w.step(p, k, now, rng.Uint32())
				if i%10000 == 9999 {
					w.compareState()
				}
			}
			w.compareState()
		})
	}
}

// TestLatticeNodes sends, for each lattice node of each family, a flood
// shaped to be caught at exactly that node, and checks that both the program
// and the Go limiter drop it there. Every more specific stream of the flood
// sends a third of the limit; together they send 40 times the limit.
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
	c := sketch.Config{Limit: limit, Window: time.Second}
	p, _ := sketch.Compile(c)
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
					if v := w.step(pk, pk.key(true), now, rng.Uint32()); v.Drop {
						drops[v.Node.Describe(p, pk.key(true).Family)]++
					}
				}
				w.compareState()
				if len(drops) != 1 || drops[want] < n-2*limit {
					t.Fatalf("drops by node %v, want at least %d, all at %s", drops, n-2*limit, want)
				}
			})
		}
	}
}

// TestUpdateErrors: a live filter refuses a new lattice and bad values, and
// keeps its configuration.
func TestUpdateErrors(t *testing.T) {
	f := loadTest(t, sketch.Config{Limit: 100, Window: time.Second}, loadOptions{})
	before := f.Params()
	for _, c := range []sketch.Config{
		{Limit: 100, Window: time.Second, PerDstPort: true},
		{Limit: 0, Window: time.Second},
		{Limit: 100, Window: time.Nanosecond},
	} {
		if err := f.Update(c); err == nil {
			t.Errorf("Update(%+v) accepted", c)
		}
	}
	if f.Params() != before {
		t.Fatal("a refused update changed the configuration")
	}
	if _, err := load(sketch.Config{Limit: 100}, loadOptions{}); err == nil {
		t.Fatal("load with no window accepted")
	}
}

func TestInfo(t *testing.T) {
	f := loadTest(t, sketch.Config{Limit: 100, Window: time.Second}, loadOptions{})
	in, err := f.Info()
	if err != nil {
		t.Fatal(err)
	}
	cells := 6 * sketch.Depth * sketch.Width * sketch.CellBytes
	if in.Instructions < 100 || in.MapBytes < cells {
		t.Fatalf("info %+v: want instructions > 100 and map bytes >= %d", in, cells)
	}
	// The kernel charges an attached filter to the socket's option memory
	// (net.core.optmem_max): measure it.
	conn := listen(t, "udp4", "127.0.0.1:0")
	before := optmem(t, conn)
	if err := f.Attach(conn); err != nil {
		t.Fatal(err)
	}
	charged := optmem(t, conn) - before
	if charged <= 0 || charged > 64<<10 {
		t.Fatalf("attaching charged %d bytes of optmem", charged)
	}
	t.Logf("program: %d instructions; maps: %d bytes (sketches %d); optmem per socket: %d bytes",
		in.Instructions, in.MapBytes, cells, charged)
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

// TestDimensions: the C program's default sketch map matches the Go
// limiter's largest lattice.
func TestDimensions(t *testing.T) {
	spec, err := loadRakelimit()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := spec.Maps[rakelimitMapCells].MaxEntries, uint32(sketch.MaxNodes*sketch.Depth*sketch.Width); got != want {
		t.Fatalf("cells map has %d entries, want MaxNodes*Depth*Width = %d (WIDTH or DEPTH differ between C and Go)", got, want)
	}
}

// TestVerifierBudget keeps the program's verification well under the
// kernel's limit of a million instructions: a change that makes the node
// loop's paths multiply shows up here before it breaks loading on a kernel
// whose verifier prunes less.
func TestVerifierBudget(t *testing.T) {
	loadTest(t, sketch.Config{Limit: 1, Window: time.Second}, loadOptions{}) // skips without BPF
	spec, err := loadRakelimit()
	if err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
	})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	defer coll.Close()
	log := coll.Programs[rakelimitProgRakelimit].VerifierLog
	_, after, ok := strings.Cut(log, "processed ")
	if !ok {
		t.Fatalf("no statistics in the verifier log:\n%s", log)
	}
	var processed int
	if _, err := fmt.Sscanf(after, "%d insns", &processed); err != nil {
		t.Fatalf("parsing %q: %v", after, err)
	}
	if processed > 250_000 {
		t.Fatalf("the verifier processed %d instructions, want at most 250,000 (a quarter of its limit)", processed)
	}
	t.Logf("verifier processed %d instructions", processed)
}
