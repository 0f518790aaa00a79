package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// xorshift replays the limiter's generator, for the twin.
type xorshift struct{ s uint64 }

func (x *xorshift) next() uint32 {
	x.s ^= x.s >> 12
	x.s ^= x.s << 25
	x.s ^= x.s >> 27
	return uint32((x.s * 0x2545F4914F6CDD1D) >> 32)
}

// TestDeciderIsTheFilter runs a mixed trace through the Decider and through
// a bare decide.Filter given the same times and random numbers (the twin
// replays the kernel's order: one number per datagram, for the decision and
// the sampling alike): every outcome, counter and sketch cell must be the
// same, before and after a reconfiguration to a dry run.
func TestDeciderIsTheFilter(t *testing.T) {
	c := testutil.QUICLimits(100, 1000)
	c.Allow = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	clk := &testutil.Clock{}
	clk.Advance(time.Hour)
	l := newTestDecider(t, c, clk, -1)
	hk := sketch.SeededHashKey(1)
	twin, err := decide.New(c, hk)
	if err != nil {
		t.Fatal(err)
	}
	rng := xorshift{0x9e3779b97f4a7c15}
	sources := []struct {
		src     string
		payload []byte
		every   int // one datagram every so many steps
	}{
		{"192.0.2.1:40000", quicclasstest.Initial(), 1},
		{"192.0.2.9:40001", quicclasstest.ShortHeader(100), 3},
		{"198.51.100.7:50000", quicclasstest.ShortHeader(100), 7},
		{"198.51.100.8:50000", junk(), 5},
		{"198.51.100.9:53", quicclasstest.Initial(), 11},
		{"198.51.100.10:50000", quicclasstest.UnknownVersion(), 2},
		{"203.0.113.5:50000", quicclasstest.Initial(), 4},
		{"[2001:db8::1]:40000", quicclasstest.Initial(), 2},
	}
	const steps = 30_000 // 3 s at 10 µs a step
	for step := range steps {
		if step == steps/2 {
			dry := c
			dry.DryRun = true
			if err := l.Configure(dry); err != nil {
				t.Fatal(err)
			}
			if err := twin.Update(dry); err != nil {
				t.Fatal(err)
			}
		}
		clk.Advance(10 * time.Microsecond)
		for _, s := range sources {
			if step%s.every != 0 {
				continue
			}
			d := dgram(s.src, s.payload)
			got := l.Decide(&d)
			want := twin.Decide(&d, clk.Now(), rng.next())
			if got != want {
				t.Fatalf("step %d, %s: outcome %+v, want %+v", step, s.src, got, want)
			}
		}
	}
	st, _ := l.Stats()
	if want := twin.Stats(); st != want {
		t.Fatalf("stats differ:\n got %+v\nwant %+v", st, want)
	}
	if !reflect.DeepEqual(l.f.Limiter().Lines(), twin.Limiter().Lines()) {
		t.Fatal("sketch cells differ from the twin's")
	}
	dropped := uint64(0)
	for f := range decide.Families {
		for lvl := range sketch.MaxLevels {
			dropped += st.Dropped[0][f][lvl]
		}
	}
	if dropped == 0 || st.Invalid[0][1][quicclass.FixedBit] == 0 || st.Invalid[1][1][quicclass.SourcePort] == 0 ||
		st.Negotiation[1][1] == 0 || st.Negotiation[1][2] == 0 || st.Allowed[1] == 0 {
		t.Fatalf("the trace did not exercise every path: %+v", st)
	}
}

// readEvent reads one event, or fails after a second.
func readEvent(t *testing.T, r *EventReader) decide.Stream {
	t.Helper()
	type res struct {
		s   decide.Stream
		err error
	}
	ch := make(chan res, 1)
	go func() { s, err := r.Read(); ch <- res{s, err} }()
	select {
	case x := <-ch:
		if x.err != nil {
			t.Fatalf("reading an event: %v", x.err)
		}
		return x.s
	case <-time.After(time.Second):
		t.Fatal("no event within a second")
	}
	return decide.Stream{}
}

// TestStreamTracking checks the kernel's stream semantics: the key of the
// dropping node (address masked to its prefix, source port only where the
// node counts it), invalid datagrams keyed by source address, one event per
// new stream however long it floods, drops counted exactly when every drop
// is sampled.
func TestStreamTracking(t *testing.T) {
	type flow struct {
		src     string
		payload []byte
	}
	many := func(format string, n int, payload []byte) []flow {
		var out []flow
		for i := range n {
			out = append(out, flow{fmt.Sprintf(format, i), payload})
		}
		return out
	}
	tests := []struct {
		name  string
		cfg   decide.Config
		flows []flow
		rate  int // datagrams per ms, all flows together
		// want lists the streams, as Node.Stream names them, or
		// "invalid <addr> <reason>".
		want  []string
		level int
		class quicclass.Class
	}{
		{"one source", testutil.Limits(100), many("192.0.2.1:4000%d", 1, nil), 5,
			[]string{"192.0.2.1/32 sport=40000 -> :443"}, 0, quicclass.Opening},
		{"one address, many ports", testutil.Limits(100), many("192.0.2.1:%d", 20, nil), 1,
			[]string{"192.0.2.1/32 sport=* -> :443"}, 1, quicclass.Opening},
		{"one /24 and port, many addresses", testutil.Limits(100), many("192.0.2.%d:40000", 20, nil), 1,
			[]string{"192.0.2.0/24 sport=40000 -> :443"}, 1, quicclass.Opening},
		{"one /24, many addresses and ports", testutil.Limits(100), many("192.0.2.%[1]d:400%02[1]d", 20, nil), 1,
			[]string{"192.0.2.0/24 sport=* -> :443"}, 2, quicclass.Opening},
		{"established flood", testutil.QUICLimits(100, 100), many("[2001:db8::1]:4000%d", 1, quicclasstest.ShortHeader(100)), 5,
			[]string{"2001:db8::/64 sport=40000 -> :443"}, 0, quicclass.Established},
		{"unverified flood", unverifiedLimits(100), many("[2001:db8::1]:4000%d", 1, quicclasstest.ShortHeader(100)), 5,
			[]string{"2001:db8::/64 sport=40000 -> :443"}, 0, quicclass.Unverified},
		{"junk from two sources", testutil.QUICLimits(100, 100), []flow{{"192.0.2.1:40000", junk()}, {"192.0.2.2:40001", junk()}, {"192.0.2.2:40002", junk()}}, 5,
			[]string{"invalid 192.0.2.1 fixed_bit", "invalid 192.0.2.2 fixed_bit"}, -1, quicclass.Invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &testutil.Clock{}
			clk.Advance(time.Hour)
			l := newTestDecider(t, topUnlimited(tt.cfg), clk, 0)
			events, err := l.Events()
			if err != nil {
				t.Fatal(err)
			}
			// 2 s of tt.rate datagrams per ms, round robin.
			for i := range 2000 * tt.rate {
				if i%tt.rate == 0 {
					clk.Advance(time.Millisecond)
				}
				f := tt.flows[i%len(tt.flows)]
				d := dgram(f.src, f.payload)
				if d.Length == 0 {
					d = dgram(f.src, []byte("flood"))
				}
				l.Decide(&d)
			}
			streams, _ := l.Streams()
			p := l.Params()
			var got []string
			var drops uint64
			for _, s := range streams {
				if s.Class == quicclass.Invalid {
					got = append(got, fmt.Sprintf("invalid %v %v", s.Key.Addr(), s.Reason))
				} else {
					got = append(got, s.Node.Stream(p, &s.Key))
				}
				if s.Level != tt.level || s.Class != tt.class {
					t.Errorf("stream %+v: level %d class %v, want %d %v", s, s.Level, s.Class, tt.level, tt.class)
				}
				if s.Class == quicclass.Invalid && (s.Key.SrcPort != 0 || s.Node != 0) {
					t.Errorf("invalid stream keyed with port %d node %d, want the address alone", s.Key.SrcPort, s.Node)
				}
				if s.First.After(s.Last) || s.Last.Sub(s.First) < 1800*time.Millisecond {
					t.Errorf("stream %v lasted %v, want about 2 s", s.Key.Addr(), s.Last.Sub(s.First))
				}
				drops += s.Drops
			}
			slicesSort(got)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("streams %q, want %q", got, tt.want)
			}
			st, _ := l.Stats()
			var counted uint64
			for f := range decide.Families {
				for lvl := range sketch.MaxLevels {
					if tt.class < quicclass.LimiterClasses {
						counted += st.Dropped[tt.class][f][lvl]
					}
				}
				for r := range quicclass.NumReasons {
					counted += st.Invalid[0][f][r]
				}
			}
			if drops != counted || drops == 0 {
				t.Errorf("streams count %d drops, the counters %d", drops, counted)
			}
			for range tt.want {
				readEvent(t, events)
			}
			if n := len(l.events); n != 0 {
				t.Errorf("%d events more than one per stream", n)
			}
		})
	}
}

// topUnlimited lifts the limit of the socket's total in every class
// configured, so that a test flood is limited at one level only.
func topUnlimited(c decide.Config) decide.Config {
	c = c.Clone()
	top := c.Limiter.WithDefaults().Levels() - 1
	c.Limiter.LevelLimits = map[int]uint32{top: sketch.Unlimited}
	if c.Limiter.Established.Limit != 0 {
		c.Limiter.Established.LevelLimits = map[int]uint32{top: sketch.Unlimited}
	}
	if c.Limiter.Unverified.Limit != 0 {
		c.Limiter.Unverified.LevelLimits = map[int]uint32{top: sketch.Unlimited}
	}
	return c
}

// unverifiedLimits verifies connection IDs, with limit as class 2's limit:
// every short header from a source the limiter has not learned is
// unverified.
func unverifiedLimits(limit uint32) decide.Config {
	c := testutil.QUICLimits(100, 100_000)
	c.VerifyIDs = true
	c.Limiter.Unverified = sketch.Limits{Limit: limit}
	return c
}

func slicesSort(s []string) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}

// TestStreamSampling: with the default sampling, one drop in 16 is looked
// up, and the drops a stream reports are within 15% of the true count (16,000
// drops: about 1,000 samples, 4 standard deviations).
func TestStreamSampling(t *testing.T) {
	clk := &testutil.Clock{}
	l := newTestDecider(t, testutil.Limits(100), clk, -1)
	for range 16_200 {
		clk.Advance(100 * time.Microsecond)
		d := dgram("192.0.2.1:40000", []byte("x"))
		l.Decide(&d)
	}
	st, _ := l.Stats()
	dropped := st.Dropped[0][1][0]
	streams, _ := l.Streams()
	if len(streams) != 1 {
		t.Fatalf("%d streams, want 1", len(streams))
	}
	if got := float64(streams[0].Drops); got < 0.85*float64(dropped) || got > 1.15*float64(dropped) {
		t.Fatalf("stream reports %v drops, counters %d", got, dropped)
	}
	if streams[0].Drops%16 != 0 {
		t.Fatalf("drops %d are not sampled drops times 16", streams[0].Drops)
	}
}

// TestExpireStreams: a stream with no drop for idle is returned once and
// forgotten; one still dropped stays.
func TestExpireStreams(t *testing.T) {
	clk := &testutil.Clock{}
	l := newTestDecider(t, topUnlimited(testutil.Limits(100)), clk, 0)
	flood := func(src string, d time.Duration) {
		for end := clk.Now() + int64(d); clk.Now() < end; clk.Advance(time.Millisecond) {
			for range 10 {
				dg := dgram(src, []byte("x"))
				l.Decide(&dg)
			}
		}
	}
	flood("192.0.2.1:1000", time.Second) // A
	flood("198.51.100.1:2000", 3*time.Second)
	expired, _ := l.ExpireStreams(2 * time.Second)
	if len(expired) != 1 || expired[0].Key.Addr() != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("expired %+v, want the stream of 192.0.2.1", expired)
	}
	if d := expired[0].Last.Sub(expired[0].First); d < 900*time.Millisecond || d > time.Second {
		t.Errorf("expired stream lasted %v, want about 1 s", d)
	}
	if again, _ := l.ExpireStreams(2 * time.Second); len(again) != 0 {
		t.Fatalf("expired again: %+v", again)
	}
	if left, _ := l.Streams(); len(left) != 1 || left[0].Key.Addr() != netip.MustParseAddr("198.51.100.1") {
		t.Fatalf("left %+v, want the stream of 198.51.100.1", left)
	}
}

// TestStreamTableFull: past decide.MaxTrackedStreams, new streams replace those
// that saw no drop lately, never those still dropped.
func TestStreamTableFull(t *testing.T) {
	clk := &testutil.Clock{}
	l := newTestDecider(t, testutil.QUICLimits(100, 100), clk, 0)
	send := func(i int) {
		d := dgram(fmt.Sprintf("10.%d.%d.1:40000", i/256, i%256), junk())
		l.Decide(&d)
	}
	for i := range decide.MaxTrackedStreams {
		send(i)
	}
	// A second: the tracking pacer has room for the new streams again.
	clk.Advance(time.Second)
	for i := range decide.MaxTrackedStreams / 2 {
		send(i) // still dropped
	}
	for i := range 100 {
		send(decide.MaxTrackedStreams + i) // new
	}
	streams, _ := l.Streams()
	if len(streams) != decide.MaxTrackedStreams {
		t.Fatalf("%d streams, want %d", len(streams), decide.MaxTrackedStreams)
	}
	have := map[netip.Addr]bool{}
	for _, s := range streams {
		have[s.Key.Addr()] = true
	}
	for i := range decide.MaxTrackedStreams / 2 {
		if a := netip.MustParseAddr(fmt.Sprintf("10.%d.%d.1", i/256, i%256)); !have[a] {
			t.Fatalf("stream %v, still dropped, was evicted", a)
		}
	}
	for i := range 100 {
		if a := netip.MustParseAddr(fmt.Sprintf("10.%d.%d.1", (decide.MaxTrackedStreams+i)/256, (decide.MaxTrackedStreams+i)%256)); !have[a] {
			t.Fatalf("new stream %v is missing", a)
		}
	}
	if n := len(l.tab.index); n != decide.MaxTrackedStreams {
		t.Fatalf("index holds %d streams, want %d", n, decide.MaxTrackedStreams)
	}
}

// TestTrackingPaced: new tracked streams are paced as the kernel paces them
// (bpf's TestTrackingPaced): a burst of decide.MaxTrackedStreams, then
// decide.TrackedStreamsPerSecond a second; the sampled drops of the others
// are counted as untracked, and a tracked stream's drops are always recorded.
func TestTrackingPaced(t *testing.T) {
	clk := &testutil.Clock{}
	l := newTestDecider(t, testutil.QUICLimits(1000, 1000), clk, 0)
	source := 0
	flood := func(n int) {
		for range n {
			source++
			d := dgram(fmt.Sprintf("198.18.%d.%d:5000", source>>8&0xff, source&0xff), junk())
			if out := l.Decide(&d); !out.Drop || out.Class != quicclass.Invalid {
				t.Fatalf("source %d: %+v, want an invalid drop", source, out)
			}
		}
	}
	untracked := func() uint64 {
		n, _ := l.Untracked()
		return n
	}
	const over = 300
	flood(decide.MaxTrackedStreams + over)
	if got := untracked(); got != over {
		t.Fatalf("%d new sources at once: %d untracked, want %d", decide.MaxTrackedStreams+over, got, over)
	}
	streams, _ := l.Streams()
	if len(streams) != decide.MaxTrackedStreams {
		t.Fatalf("tracking %d streams, want %d", len(streams), decide.MaxTrackedStreams)
	}
	one := streams[0]
	for range 5 {
		d := dgram(netip.AddrPortFrom(one.Key.Addr(), 5000).String(), junk())
		l.Decide(&d)
	}
	if got := untracked(); got != over {
		t.Fatalf("drops of a tracked stream counted as untracked: %d, want %d", got, over)
	}
	streams, _ = l.Streams()
	for _, s := range streams {
		if s.Key == one.Key && s.Drops != one.Drops+5 {
			t.Fatalf("the tracked stream of %v has %d drops after 5 more, want %d", one.Key.Addr(), s.Drops, one.Drops+5)
		}
	}
	clk.Advance(time.Second)
	flood(decide.TrackedStreamsPerSecond + over)
	if got := untracked(); got != 2*over {
		t.Fatalf("a second later: %d untracked, want %d", got, 2*over)
	}
}

// TestConfigure: a bad configuration is refused with an error naming the
// field and value, and changes nothing; a good one applies from the next
// datagram and keeps the counts.
func TestConfigure(t *testing.T) {
	base := testutil.QUICLimits(100, 1000)
	many := make([]netip.Prefix, decide.MaxAllow+1)
	for i := range many {
		many[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
	}
	tests := []struct {
		name string
		edit func(*decide.Config)
		want string
	}{
		{"zero limit", func(c *decide.Config) { c.Limiter.Limit = 0 }, "limit 0 out of range"},
		{"window too short", func(c *decide.Config) { c.Limiter.Window = time.Millisecond }, "window 1ms out of range"},
		{"established limit", func(c *decide.Config) { c.Limiter.Established.Limit = 20_000_000 }, "established limit 20000000"},
		{"level", func(c *decide.Config) { c.Limiter.LevelLimits = map[int]uint32{7: 5} }, "level limits: level 7 does not exist"},
		{"negotiation", func(c *decide.Config) { c.Negotiation = 2_000_000 }, "version negotiation 2000000"},
		{"fewer prefixes", func(c *decide.Config) {
			c.Limiter.IPv4Prefixes, c.Limiter.IPv6Prefixes = []uint8{32, 0}, []uint8{64, 0}
		}, "cannot change the lattice"},
		{"per destination port", func(c *decide.Config) { c.Limiter.PerDstPort = true }, "cannot change the lattice"},
		{"too many allowed", func(c *decide.Config) { c.Allow = many }, "allow: 1025 IPv4 prefixes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newTestDecider(t, base, nil, -1)
			d := dgram("192.0.2.1:40000", quicclasstest.Initial())
			l.Decide(&d)
			before, params := l.Config(), l.Params()
			bad := base.Clone()
			tt.edit(&bad)
			err := l.Configure(bad)
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Configure: %v, want one line containing %q", err, tt.want)
			}
			if !reflect.DeepEqual(l.Config(), before) || l.Params() != params {
				t.Fatal("a refused configuration changed the limiter")
			}
			if _, err := New(bad, nil); err == nil && tt.want != "cannot change the lattice" {
				t.Fatalf("New accepted %s", tt.name)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		l := newTestDecider(t, base, nil, -1)
		for range 50 {
			d := dgram("192.0.2.1:40000", quicclasstest.Initial())
			l.Decide(&d)
		}
		next := base.Clone()
		next.Limiter.Limit, next.Limiter.IPv4Prefixes, next.Limiter.IPv6Prefixes = 5, []uint8{32, 16, 0}, []uint8{128, 32, 0}
		if err := l.Configure(next); err != nil {
			t.Fatal(err)
		}
		st, _ := l.Stats()
		if st.Passed[0][1] != 50 {
			t.Fatalf("counts not kept: passed %d", st.Passed[0][1])
		}
		drops := 0
		for range 50 {
			d := dgram("192.0.2.1:40000", quicclasstest.Initial())
			if l.Decide(&d).Drop {
				drops++
			}
		}
		if drops == 0 {
			t.Fatal("the new limit of 5 dropped nothing of 50 more datagrams")
		}
	})
}

// TestConfigIsCopied: the limiter keeps its own copy of the configuration.
func TestConfigIsCopied(t *testing.T) {
	c := testutil.QUICLimits(100, 1000)
	l := newTestDecider(t, c, nil, -1)
	c.BlockedPorts.Add(40000, 40000)
	c.Limiter.Limit = 1
	d := dgram("192.0.2.1:40000", quicclasstest.Initial())
	if out := l.Decide(&d); out.Drop || out.Class != quicclass.Opening {
		t.Fatalf("changing the caller's configuration changed the limiter: %+v", out)
	}
	got := l.Config()
	got.BlockedPorts.Add(50000, 50000)
	d = dgram("192.0.2.1:50000", quicclasstest.Initial())
	if out := l.Decide(&d); out.Drop {
		t.Fatal("changing the returned configuration changed the limiter")
	}
}

// TestEvents: Read blocks until an event, one reader at a time, and Close
// (of the reader or the limiter) ends a blocked Read with os.ErrClosed.
func TestEvents(t *testing.T) {
	l := newTestDecider(t, testutil.Limits(10), nil, 0)
	r, err := l.Events()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Events(); err == nil {
		t.Fatal("a second reader was opened")
	}
	got := make(chan decide.Stream, 1)
	go func() {
		s, err := r.Read()
		if err == nil {
			got <- s
		}
	}()
	select {
	case s := <-got:
		t.Fatalf("Read returned %+v before any drop", s)
	case <-time.After(50 * time.Millisecond):
	}
	for range 100 {
		d := dgram("192.0.2.1:40000", []byte("x"))
		l.Decide(&d)
	}
	select {
	case s := <-got:
		if s.Key.Addr() != netip.MustParseAddr("192.0.2.1") {
			t.Fatalf("event %+v", s)
		}
	case <-time.After(time.Second):
		t.Fatal("no event for a flood")
	}
	for _, closer := range []struct {
		name  string
		close func(*EventReader) error
	}{
		{"reader", func(r *EventReader) error { return r.Close() }},
		{"limiter", func(*EventReader) error { return l.Close() }},
	} {
		if closer.name == "reader" {
			// r is open: close it below.
		} else if r, err = l.Events(); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { _, err := r.Read(); errc <- err }()
		time.Sleep(20 * time.Millisecond)
		closer.close(r)
		select {
		case err := <-errc:
			if !errors.Is(err, os.ErrClosed) {
				t.Fatalf("closing the %s: Read returned %v, want os.ErrClosed", closer.name, err)
			}
		case <-time.After(time.Second):
			t.Fatalf("closing the %s did not end a blocked Read", closer.name)
		}
	}
	if _, err := l.Events(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Events on a closed limiter: %v", err)
	}
	d := dgram("192.0.2.1:40000", []byte("x"))
	if !l.Decide(&d).Drop {
		t.Fatal("a closed limiter stopped deciding")
	}
}

// TestSweep: cells idle past the decay horizon are reset.
func TestSweep(t *testing.T) {
	clk := &testutil.Clock{}
	clk.Advance(time.Hour)
	l := newTestDecider(t, testutil.Limits(100), clk, -1)
	d := dgram("192.0.2.1:40000", []byte("x"))
	l.Decide(&d)
	if n, _ := l.Sweep(); n != 0 {
		t.Fatalf("swept %d fresh cells", n)
	}
	clk.Advance(48 * time.Hour)
	if n, _ := l.Sweep(); n == 0 {
		t.Fatal("swept nothing after 48 idle hours")
	}
}

// TestLimiterConcurrent decides datagrams from two goroutines, one by one
// and in batches, while others read the counters and streams, reconfigure,
// expire, sweep and read events: run with -race. Every datagram must be
// counted once.
func TestLimiterConcurrent(t *testing.T) {
	c := testutil.QUICLimits(200, 2000)
	l := newTestDecider(t, c, nil, -1)
	events, err := l.Events()
	if err != nil {
		t.Fatal(err)
	}
	const perWorker = 20_000
	var wg, bg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds := make([]decide.Datagram, 8)
			drop := make([]bool, 8)
			for i := 0; i < perWorker; i += len(ds) {
				for j := range ds {
					payload := quicclasstest.Initial()
					if j%4 == 3 {
						payload = junk()
					}
					ds[j] = dgram(fmt.Sprintf("192.0.%d.%d:4000%d", w, j, j%3), payload)
				}
				if w == 0 {
					l.DecideBatch(ds, drop)
				} else {
					for j := range ds {
						l.Decide(&ds[j])
					}
				}
			}
		}()
	}
	background := []func(i int){
		func(int) { l.Stats() },
		func(int) { l.Streams() },
		func(int) { l.ExpireStreams(time.Millisecond) },
		func(int) { l.Sweep() },
		func(int) { l.Params() },
		func(i int) {
			next := c.Clone()
			next.DryRun = i%2 == 1
			if err := l.Configure(next); err != nil {
				panic(err)
			}
		},
	}
	hammer(stop, &bg, background)
	bg.Add(1)
	go func() {
		defer bg.Done()
		for {
			if _, err := events.Read(); err != nil {
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	events.Close()
	bg.Wait()
	st, _ := l.Stats()
	var total uint64
	for class := range sketch.NumClasses {
		for f := range decide.Families {
			total += st.Passed[class][f]
			for lvl := range sketch.MaxLevels {
				total += st.Dropped[class][f][lvl] + st.WouldDrop[class][f][lvl]
			}
		}
	}
	for f := range decide.Families {
		for r := range quicclass.NumReasons {
			total += st.Invalid[0][f][r] + st.Invalid[1][f][r]
		}
	}
	if total != 2*perWorker {
		t.Fatalf("counted %d datagrams, decided %d", total, 2*perWorker)
	}
}
