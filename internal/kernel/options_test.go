//go:build linux

package kernel

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

func sum(levels [sketch.MaxLevels]uint64) (n uint64) {
	for _, v := range levels {
		n += v
	}
	return n
}

// attached loads a filter with cfg, attaches it to a fresh IPv4 (or
// dual-stack) loopback socket and returns both, with the socket's port.
func attached(t *testing.T, cfg decide.Config, network string) (*Program, *net.UDPConn, uint16) {
	t.Helper()
	f := loadTest(t, cfg, loadOptions{})
	addr := "127.0.0.1:0"
	if network == "udp" {
		addr = "[::]:0"
	}
	conn := testutil.Listen(t, network, addr)
	if err := f.Attach(conn); err != nil {
		t.Fatal(err)
	}
	return f, conn, testutil.PortOf(conn)
}

// TestDryRun: a dry run delivers the whole flood and counts what it would
// have dropped; switched off on the live socket, the same flood is dropped.
func TestDryRun(t *testing.T) {
	const limit, rate = 100, 4000
	c := testutil.Limits(limit)
	f, conn, port := attached(t, c, "udp4")
	c.DryRun = true
	if err := f.Configure(c); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	src := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	r := testutil.Receive(conn)
	if err := flood(src, dst, rate, 2*rate, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatal(err)
	}
	r.Drain(t)
	got := r.Total()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	v4 := decide.FamilyIndex(sketch.IPv4)
	would, dropped := sum(st.WouldDrop[quicclass.Opening][v4]), sum(st.Dropped[quicclass.Opening][v4])
	if got != 2*rate || dropped != 0 || would < uint64(2*rate-4*limit) {
		t.Fatalf("dry run: %d of %d delivered, %d dropped, %d would have been", got, 2*rate, dropped, would)
	}
	streams, err := f.Streams()
	if err != nil || len(streams) != 1 || !streams[0].DryRun {
		t.Fatalf("dry run tracked %+v, %v; want the flood, marked dry run", streams, err)
	}

	// Off, on the live socket: the next flood is dropped.
	c.DryRun = false
	if err := f.Configure(c); err != nil {
		t.Fatal(err)
	}
	if err := flood(src, dst, rate, rate, rand.New(rand.NewPCG(2, 2))); err != nil {
		t.Fatal(err)
	}
	r.Stop(t)
	st, err = f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if d := sum(st.Dropped[quicclass.Opening][v4]); d < uint64(rate-2*limit) {
		t.Fatalf("after the dry run was switched off, %d of %d dropped", d, rate)
	}
	t.Logf("dry run: %d delivered, %d would have been dropped; then enforcing: %d dropped", got, would, sum(st.Dropped[quicclass.Opening][v4]))
}

// TestAllowlist: an allowlisted source is never limited nor counted, while a
// source beside it is held to the limit; for IPv4 and IPv6 on a dual-stack
// socket.
func TestAllowlist(t *testing.T) {
	const limit, rate = 100, 3000
	tests := []struct {
		name, allowed, other, allow string
	}{
		{"ipv4", "127.0.0.9", "127.0.0.10", "127.0.0.8/31"},
		{"ipv6", "::1", "127.0.0.10", "::1/128"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testutil.Limits(limit)
			f, conn, port := attached(t, c, "udp")
			c.Allow = []netip.Prefix{netip.MustParsePrefix(tt.allow)}
			if err := f.Configure(c); err != nil {
				t.Fatal(err)
			}
			r := testutil.Receive(conn)
			done := make(chan error, 1)
			for _, src := range []string{tt.allowed, tt.other} {
				a := netip.MustParseAddr(src)
				s := testutil.Sender(t, netip.AddrPortFrom(a, 0))
				dst := testutil.LoopbackFor(a, port)
				go func() { done <- flood(s, dst, rate, 2*rate, rand.New(rand.NewPCG(3, 3))) }()
			}
			for range 2 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			r.Stop(t)
			total := func(a string) int { return r.ReceivedFrom(netip.MustParseAddr(a)) }
			st, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			fam := decide.FamilyIndex(sketch.IPv4)
			if netip.MustParseAddr(tt.allowed).Is6() {
				fam = decide.FamilyIndex(sketch.IPv6)
			}
			if total(tt.allowed) != 2*rate || st.Allowed[fam] != uint64(2*rate) {
				t.Errorf("allowlisted %s: %d of %d delivered, %d counted as allowed", tt.allowed, total(tt.allowed), 2*rate, st.Allowed[fam])
			}
			if got := total(tt.other); got > 4*limit {
				t.Errorf("%s beside it: %d of %d delivered, want the limit", tt.other, got, 2*rate)
			}
			// Removing the entry puts the source back under the limit.
			c.Allow = nil
			if err := f.Configure(c); err != nil {
				t.Fatal(err)
			}
			if n := countAllow(t, f); n != 0 {
				t.Errorf("allowlist holds %d entries after clearing it", n)
			}
			t.Logf("allowlisted %s: %d of %d delivered; %s: %d", tt.allowed, total(tt.allowed), 2*rate, tt.other, total(tt.other))
		})
	}
}

// TestStreamEvents: a flood of a million packets from one 4-tuple produces
// one event, the tracked stream's estimate and sampled drop count, and it
// expires once the flood stops.
func TestStreamEvents(t *testing.T) {
	const limit = 25
	f := loadTest(t, testutil.Limits(limit), loadOptions{})
	events, err := f.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	got := make(chan decide.Stream, 100)
	go func() {
		for {
			s, err := events.Read()
			if errors.Is(err, ringbuf.ErrClosed) {
				close(got)
				return
			}
			if err == nil {
				got <- s
			}
		}
	}()
	frame := udp("198.51.100.7", 5000).Bytes()
	start := time.Now()
	if _, _, err := f.objs.Rakelimit.Benchmark(frame, 1_000_000, nil); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	time.Sleep(200 * time.Millisecond)
	events.Close()
	var evs []decide.Stream
	for s := range got {
		evs = append(evs, s)
	}
	want := sketch.KeyFrom(netip.MustParseAddrPort("198.51.100.7:5000"), 443)
	if len(evs) != 1 || evs[0].Key != want || evs[0].Level != 0 {
		t.Fatalf("a million packets from one 4-tuple gave events %+v, want one for %+v at level 0", evs, want)
	}
	streams, err := f.Streams()
	if err != nil || len(streams) != 1 {
		t.Fatalf("tracked %v, %v", streams, err)
	}
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	dropped := sum(st.Dropped[quicclass.Opening][decide.FamilyIndex(sketch.IPv4)])
	// Sampling one drop in 16: the estimate is within a few percent.
	if d := float64(streams[0].Drops); d < 0.9*float64(dropped) || d > 1.1*float64(dropped) {
		t.Errorf("stream's drops estimated at %v, the counters say %d", d, dropped)
	}
	if expired, err := f.ExpireStreams(time.Hour); err != nil || len(expired) != 0 {
		t.Fatalf("expired %v, %v before the stream went quiet", expired, err)
	}
	expired, err := f.ExpireStreams(0)
	if err != nil || len(expired) != 1 {
		t.Fatalf("expired %v, %v once quiet", expired, err)
	}
	t.Logf("1,000,000 packets in %v: 1 event; %d dropped, estimated from samples %d", elapsed, dropped, streams[0].Drops)
}

// TestStreamEventsUnverified: with VerifyIDs, a flood of short headers
// from a stranger to an ID the server never issued is limited in the
// unverified class, and tracked and reported as a stream of that class.
func TestStreamEventsUnverified(t *testing.T) {
	c := testutil.QUICLimits(100, 100_000)
	c.VerifyIDs = true
	shift := uint8(0)
	f := loadTest(t, c, loadOptions{trackShift: &shift})
	events, err := f.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	p := udp("198.51.100.7", 5000)
	p.Data = quicclasstest.ShortPacket(decide.ServerID{1, 2, 3, 4}, 100)
	if _, _, err := f.objs.Rakelimit.Benchmark(p.Bytes(), 100_000, nil); err != nil {
		t.Fatal(err)
	}
	ev, err := events.Read()
	if err != nil {
		t.Fatal(err)
	}
	want := sketch.KeyFrom(netip.MustParseAddrPort("198.51.100.7:5000"), 443)
	if ev.Class != quicclass.Unverified || ev.Key != want || ev.Level != 0 {
		t.Fatalf("event %+v, want class unverified for %+v at level 0", ev, want)
	}
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	v4 := decide.FamilyIndex(sketch.IPv4)
	if dropped := sum(st.Dropped[quicclass.Unverified][v4]); dropped < 90_000 || st.Passed[quicclass.Established][v4] != 0 {
		t.Fatalf("the unverified class dropped %d of 100,000; the established class passed %d", dropped, st.Passed[quicclass.Established][v4])
	}
	streams, err := f.Streams()
	if err != nil || len(streams) != 1 || streams[0].Class != quicclass.Unverified {
		t.Fatalf("tracked %+v, %v", streams, err)
	}
}

// TestAllowFilterNoFalseNegatives: the quick-reject filter in front of the
// allowlist lets every address of every allowlisted prefix through to the
// trie, whatever the prefix length, IPv4 and IPv6.
func TestAllowFilterNoFalseNegatives(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, bits := range []int{0, 1, 4, 7, 8, 9, 12, 15, 16, 17, 24, 32, 33, 48, 64, 100, 128} {
		for range 20 {
			var a16 [16]byte
			for i := range a16 {
				a16[i] = byte(rng.Uint32())
			}
			addrs := []netip.Addr{netip.AddrFrom16(a16)}
			if bits <= 32 {
				addrs = append(addrs, netip.AddrFrom4([4]byte(a16[:4])))
			}
			for _, a := range addrs {
				p := netip.PrefixFrom(a, bits).Masked()
				filter, always := allowFilter([]netip.Prefix{p})
				fi := 0
				if a.Is6() {
					fi = 1
				}
				for range 50 {
					// A random address inside p.
					b := p.Addr().As16()
					off := 0
					if a.Is4() {
						off = 12
					}
					for i := p.Bits(); i < a.BitLen(); i++ {
						if rng.Uint32()&1 == 1 {
							b[off+i/8] |= 0x80 >> (i % 8)
						}
					}
					var top uint32
					if a.Is4() {
						top = uint32(b[12])<<8 | uint32(b[13])
					} else {
						top = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
					}
					n := allowBucket(top)
					if always[fi] == 0 && filter[fi][n/64]>>(n%64)&1 == 0 {
						t.Fatalf("prefix %v: address %v rejected by the filter", p, netip.AddrFrom16(b))
					}
				}
			}
		}
	}
}

// TestTrackingPaced: new tracked streams are paced. A flood of invalid
// datagrams from a new source each, every drop sampled, tracks a burst of
// decide.MaxTrackedStreams at once and then decide.TrackedStreamsPerSecond
// a second; the sampled drops of the others are counted as untracked, and a
// tracked stream's later drops are always recorded.
func TestTrackingPaced(t *testing.T) {
	shift := uint8(0)
	f := loadTest(t, testutil.QUICLimits(1000, 1000), loadOptions{testMode: true, trackShift: &shift})
	source := 0
	flood := func(n int, now int64) {
		for range n {
			source++
			p := udp(netip.AddrFrom4([4]byte{198, 18, byte(source >> 8), byte(source)}).String(), 5000)
			p.Data = []byte{0x00, 1, 2, 3} // fixed bit 0: invalid
			if v := f.run(t, p.Bytes(), now, 0); v.Drop != 1 || quicclass.Class(v.Class) != quicclass.Invalid {
				t.Fatalf("source %d: verdict %+v, want an invalid drop", source, v)
			}
		}
	}
	untracked := func() uint64 {
		t.Helper()
		n, err := f.Untracked()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	tracked := func() int {
		t.Helper()
		s, err := f.Streams()
		if err != nil {
			t.Fatal(err)
		}
		return len(s)
	}
	const over = 300
	flood(decide.MaxTrackedStreams+over, start)
	if got := untracked(); got != over {
		t.Fatalf("%d new sources at once: %d untracked, want %d", decide.MaxTrackedStreams+over, got, over)
	}
	if got := tracked(); got > decide.MaxTrackedStreams || got < decide.MaxTrackedStreams/2 {
		t.Fatalf("tracking %d streams, want up to %d", got, decide.MaxTrackedStreams)
	}
	// A tracked stream's drops are recorded, although the pacer is full.
	streams, err := f.Streams()
	if err != nil {
		t.Fatal(err)
	}
	one := streams[0]
	for range 5 {
		p := udp(one.Key.Addr().String(), 5000)
		p.Data = []byte{0x00}
		f.run(t, p.Bytes(), start, 0)
	}
	if got := untracked(); got != over {
		t.Fatalf("drops of a tracked stream counted as untracked: %d, want %d", got, over)
	}
	if streams, err = f.Streams(); err != nil {
		t.Fatal(err)
	}
	for _, s := range streams {
		if s.Key == one.Key && s.Drops != one.Drops+5 {
			t.Fatalf("the tracked stream of %v has %d drops after 5 more, want %d", one.Key.Addr(), s.Drops, one.Drops+5)
		}
	}
	// A second later the pacer has room for one second's worth.
	flood(decide.TrackedStreamsPerSecond+over, start+int64(time.Second))
	if got := untracked(); got != 2*over {
		t.Fatalf("a second later: %d untracked, want %d", got, 2*over)
	}
}
