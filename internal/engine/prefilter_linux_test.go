//go:build linux

package engine

import (
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace/prefilter"
)

// prefiltered opens a userspace engine with configuration c, closed when
// the test ends, and protects a dual-stack socket with it, read through the
// returned conn; the engine's pre-filter (returned) must attach.
func prefiltered(t *testing.T, c decide.Config) (*net.UDPConn, *packetconn.Conn, Prefiltered) {
	t.Helper()
	eng, err := OpenUserspace(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	ln := testutil.Listen(t, "udp", "[::]:0")
	pc, err := packetconn.New(ln)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Protect(ln, pc); err != nil {
		t.Fatal(err)
	}
	pf := eng.(Prefiltered)
	if err := pf.PrefilterError(); err != nil {
		t.Fatalf("attaching the pre-filter: %v", err)
	}
	return ln, pc, pf
}

// drain reads through pc until it is closed, counting datagrams by first
// byte's header form: long (Initials) and the rest.
func drain(pc net.PacketConn, long, other *atomic.Int64) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				return
			}
			if n > 0 && buf[0]&0x80 != 0 {
				long.Add(1)
			} else {
				other.Add(1)
			}
		}
	}()
	return done
}

// settle waits wait for the datagrams still in flight, reads the kernel's
// drop counter of ln, then ends the drain of pc (done) and closes ln.
func settle(t *testing.T, ln *net.UDPConn, pc net.PacketConn, done <-chan struct{}, wait time.Duration) uint64 {
	t.Helper()
	time.Sleep(wait)
	_, _, drops, err := backlog.ReadSockets([]*net.UDPConn{ln})
	if err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now())
	ln.Close()
	<-done
	return drops
}

// watchPeak reads a figure of the pre-filter's stats (of) once a period for
// `periods` periods; the function it returns waits for the last reading and
// gives the largest.
func watchPeak[N int | float64](pf Prefiltered, periods int, of func(prefilter.Status) N) func() N {
	var peak N
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range periods {
			time.Sleep(prefilter.Period)
			peak = max(peak, of(pf.Prefilter()))
		}
	}()
	return func() N {
		<-done
		return peak
	}
}

// watchRules watches the pre-filter's number of rules (watchPeak).
func watchRules(pf Prefiltered, periods int) func() int {
	return watchPeak(pf, periods, func(s prefilter.Status) int { return s.Rules })
}

// TestPrefilterDropsInKernel runs the userspace limiter on a real socket,
// with its pre-filter, under a flood of Initials from one source and of
// invalid datagrams from another: the kernel drops the invalid ones and most
// of the flood (the socket's drop counter counts a filter's drops), while
// the userspace limiter still holds the flood to its limit.
//
// The estimate of the invalid datagrams dropped in the kernel comes from
// the random sample of one in 2^prefilter.DefaultSampleShift that passes:
// a Poisson count. With junkSamples of them expected, the band checked
// below is far out in both tails (with 10,000 junk datagrams, about 10
// expected, one run in 30 fell under half of what was sent).
func TestPrefilterDropsInKernel(t *testing.T) {
	const limit = 200
	ln, pc, pf := prefiltered(t, testutil.QUICLimits(limit, 1000))
	var long, other atomic.Int64
	done := drain(pc, &long, &other)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testutil.PortOf(ln))
	flooder := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	junker := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.3:0"))
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	junk := []byte{0x01, 0x02, 0x03, 0x04}
	const rate, seconds = 10_000, 2
	const junkSamples = 40
	const junkCount = junkSamples << prefilter.DefaultSampleShift
	peakRules := watchRules(pf, 4*seconds)
	type result struct {
		sent int
		err  error
	}
	junked := make(chan result, 1)
	go func() {
		// Bounded by its count, and by time only far past it: a sender
		// starved for a while sends the whole sample late, not less of it.
		n, err := testutil.Flood{From: []*net.UDPConn{junker}, To: dst, Rate: junkCount / seconds, Count: junkCount,
			For: 5 * seconds * time.Second, Next: func() []byte { return junk }}.Send()
		junked <- result{n, err}
	}()
	sent, err := testutil.Flood{From: []*net.UDPConn{flooder}, To: dst, Rate: rate, Count: rate * seconds,
		For: seconds * time.Second, Next: func() []byte { return initial }}.Send()
	if err != nil {
		t.Fatal(err)
	}
	j := <-junked
	if j.err != nil {
		t.Fatal(j.err)
	}
	junkSent := j.sent
	rules := peakRules()
	// Two periods: the enforcer's last update counts the last samples.
	drops := settle(t, ln, pc, done, 2*prefilter.Period+100*time.Millisecond)
	st := pf.Prefilter()
	t.Logf("flood %d, junk %d: kernel drops %d; delivered %d Initials, %d others; pre-filter %+v",
		sent, junkSent, drops, long.Load(), other.Load(), st)
	if rules == 0 {
		t.Error("the pre-filter never had a rule for the flood")
	}
	// The junk: all but the sample dropped in the kernel. The flood:
	// after the first period, all but Headroom times the limit.
	if want := uint64(junkSent*8/10 + sent/4); drops < want {
		t.Errorf("the kernel dropped %d, want at least %d", drops, want)
	}
	if n := other.Load(); n != 0 {
		t.Errorf("%d invalid datagrams reached quic-go", n)
	}
	if n := long.Load(); n > 3*limit*seconds+limit {
		t.Errorf("%d Initials of the flood reached quic-go, over the limit of %d/s", n, limit)
	}
	var invalid uint64
	for _, n := range st.InvalidDropped {
		invalid += n
	}
	// A quarter to twice what was sent: with 40 samples expected, a count
	// of 10 or fewer or over 80 (a Poisson tail of about 1e-8 each way), or
	// an estimate that does not scale the sample back up.
	if invalid < uint64(junkSent/4) || invalid > uint64(junkSent*2) {
		t.Errorf("estimated %d invalid datagrams dropped in the kernel, sent %d", invalid, junkSent)
	}
	if st.Sockets != 1 || st.Instructions == 0 || !st.Stateless {
		t.Errorf("pre-filter stats %+v", st)
	}
}

// TestPrefilterAttachFails: a socket whose filter is locked refuses the
// pre-filter; the limiter warns once and the userspace limiter still drops
// what it must.
func TestPrefilterAttachFails(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	l, err := New("locked", testutil.QUICLimits(100, 1000), ModeUserspace, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ln := testutil.Listen(t, "udp4", "127.0.0.1:0")
	rc, err := ln.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1) })
	if serr != nil {
		t.Fatal(serr)
	}
	pc, _, err := l.Attach(ln)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	warned := logs.FilterMessageSnippet("pre-filter").All()
	if len(warned) != 1 || warned[0].Level != zapcore.WarnLevel {
		t.Fatalf("logged %v, want one warning about the pre-filter", warned)
	}
	if e := warned[0].ContextMap()["error"]; !strings.Contains(e.(string), "operation not permitted") {
		t.Errorf("warning error %q", e)
	}
	var long, other atomic.Int64
	done := drain(pc, &long, &other)
	s := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	dst := netip.MustParseAddrPort(ln.LocalAddr().String())
	if err := testutil.Pace(s, dst, 5000, 500, func() []byte { return []byte{0x01} }); err != nil {
		t.Fatal(err)
	}
	valid := quicclasstest.ShortHeader(100)
	if err := testutil.Pace(s, dst, 5000, 10, func() []byte { return valid }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for other.Load() < 10 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	pc.SetReadDeadline(time.Now())
	ln.Close()
	<-done
	if n := other.Load(); n != 10 {
		t.Errorf("%d datagrams reached quic-go, want the 10 valid ones", n)
	}
	if st := l.Engine().(Prefiltered).Prefilter(); st.Sockets != 0 || st.AttachErrors == 0 {
		t.Errorf("pre-filter stats %+v, want no socket and an attach error", st)
	}
}

// TestPrefilterDropsNegotiation runs the userspace limiter on a real socket
// under a flood of unknown-version datagrams (each would earn a Version
// Negotiation reply) at 50 times the cap: after the first periods the
// kernel drops all but about Headroom times the cap, while the userspace
// limiter still paces what reaches quic-go to the cap.
func TestPrefilterDropsNegotiation(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	c.Negotiation = 100
	ln, pc, pf := prefiltered(t, c)
	var long, other atomic.Int64
	done := drain(pc, &long, &other)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testutil.PortOf(ln))
	flooder := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.4:0"))
	unknown := quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200)
	const rate, seconds = 5_000, 3
	// The probability is read while the flood lasts: one read after it
	// ends may fall on an update that measured the flood over part of its
	// period only, and lowered the probability for the rate it saw.
	peakP := watchPeak(pf, 4*seconds-1, func(s prefilter.Status) float64 { return s.Negotiation })
	sent, err := testutil.Flood{From: []*net.UDPConn{flooder}, To: dst, Rate: rate, Count: rate * seconds,
		For: seconds * time.Second, Next: func() []byte { return unknown }}.Send()
	if err != nil {
		t.Fatal(err)
	}
	p := peakP()
	drops := settle(t, ln, pc, done, 200*time.Millisecond)
	st := pf.Prefilter()
	t.Logf("flood %d: kernel drops %d, estimated %d at p %v (at most %v); %d reached quic-go", sent, drops,
		st.NegotiationDropped, st.Negotiation, p, long.Load())
	// The first period passes everything to the userspace limiter; the
	// kernel drops most of the rest.
	if want := uint64(sent / 2); drops < want {
		t.Errorf("the kernel dropped %d of %d unknown-version datagrams, want at least %d", drops, sent, want)
	}
	if p < 0.9 {
		t.Errorf("drop probability at most %v at 50 times the cap, want 0.9 at least", p)
	}
	if est := st.NegotiationDropped; est < drops/2 || est > drops*2 {
		t.Errorf("estimated %d kernel drops, the socket counted %d", est, drops)
	}
	if n := long.Load(); n > 2*100*seconds+100 {
		t.Errorf("%d unknown-version datagrams reached quic-go, over the cap of 100/s", n)
	}
}

// TestPrefilterDropsFairTotal runs the userspace limiter on a real socket
// with only the socket's total limited (the fair total) under a flood from
// 16 networks of 4 sources and a quiet network beside it: the pre-filter
// gets rules for the flooding networks and the kernel drops most of the
// flood, while every datagram of the quiet network reaches quic-go.
func TestPrefilterDropsFairTotal(t *testing.T) {
	c := testutil.QUICLimits(1000, 1000)
	c.Limiter.LevelLimits = map[int]uint32{0: sketch.Unlimited, 1: sketch.Unlimited, 2: sketch.Unlimited, 3: 1000}
	ln, pc, pf := prefiltered(t, c)
	quietSrc := netip.MustParseAddr("127.93.0.1")
	var quietGot atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			_, src, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if src.Addr().Unmap() == quietSrc {
				quietGot.Add(1)
			}
		}
	}()
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testutil.PortOf(ln))
	var from []*net.UDPConn
	for n := range 16 {
		for h := range 4 {
			from = append(from, testutil.Sender(t, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 92, byte(n), byte(h + 1)}), 0)))
		}
	}
	quiet := testutil.Sender(t, netip.AddrPortFrom(quietSrc, 0))
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	const rate, seconds, quietRate = 20_000, 3, 20
	peakRules := watchRules(pf, 4*seconds)
	errs := make(chan error, 1)
	quietSent := make(chan int, 1)
	go func() {
		n, err := testutil.Flood{From: []*net.UDPConn{quiet}, To: dst, Rate: quietRate, Count: quietRate * seconds,
			For: seconds * time.Second, Next: func() []byte { return initial }}.Send()
		quietSent <- n
		errs <- err
	}()
	sent, err := testutil.Flood{From: from, To: dst, Rate: rate, Count: rate * seconds, For: seconds * time.Second,
		Next: func() []byte { return initial }}.Send()
	if err != nil {
		t.Fatal(err)
	}
	qs := <-quietSent
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	rules := peakRules()
	drops := settle(t, ln, pc, done, 300*time.Millisecond)
	st := pf.Prefilter()
	t.Logf("flood %d from 16 networks: kernel drops %d, %d rules at most; quiet network %d of %d; pre-filter %+v",
		sent, drops, rules, quietGot.Load(), qs, st)
	if rules < 8 {
		t.Errorf("the pre-filter had %d rules at most, want one for each of most of the 16 flooding networks", rules)
	}
	// After the first periods, the kernel leaves each network twice its
	// share of the total: most of the flood at 20 times the total.
	if want := uint64(sent / 2); drops < want {
		t.Errorf("the kernel dropped %d of the flood's %d, want at least %d", drops, sent, want)
	}
	if got := quietGot.Load(); got != int64(qs) {
		t.Errorf("the quiet network got %d of its %d datagrams through", got, qs)
	}
}

// TestOnset checks when a flood begins and how often the pre-filter is
// updated then: at OnsetPeriod for OnsetTime after a stream is tracked
// following a quiet of 2*Period, at Period otherwise.
func TestOnset(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var o onset
	steps := []struct {
		name    string
		tracked time.Duration // -1: no stream tracked
		began   bool
		next    time.Time
		period  time.Duration
	}{
		{"before any stream", -1, false, at(0), prefilter.Period},
		{"the first stream", 0, true, at(0), prefilter.OnsetPeriod},
		{"another soon after", 100 * time.Millisecond, false, at(100 * time.Millisecond), prefilter.OnsetPeriod},
		{"another", 500 * time.Millisecond, false, at(500 * time.Millisecond), prefilter.OnsetPeriod},
		{"and another", 900 * time.Millisecond, false, at(900 * time.Millisecond), prefilter.OnsetPeriod},
		{"the onset is over", -1, false, at(prefilter.OnsetTime), prefilter.Period},
		{"streams keep coming", 1300 * time.Millisecond, false, at(1300 * time.Millisecond), prefilter.Period},
		{"after a quiet", 5 * time.Second, true, at(5 * time.Second), prefilter.OnsetPeriod},
	}
	for _, s := range steps {
		if s.tracked >= 0 {
			if got := o.tracked(at(s.tracked)); got != s.began {
				t.Errorf("%s: began = %v, want %v", s.name, got, s.began)
			}
		}
		if got := o.period(s.next); got != s.period {
			t.Errorf("%s: period %v, want %v", s.name, got, s.period)
		}
	}
}

// TestPrefilterOnset: a flood from one source gets its rule within a few
// OnsetPeriods of its start, not a Period later. The time is wall clock,
// which a loaded machine stretches (the flood's goroutine, the reader, the
// update's timer may each start late): an update that waits for the period
// is late in every attempt, so the test fails only when 3 attempts in a
// row are.
func TestPrefilterOnset(t *testing.T) {
	const attempts = 3
	var took []time.Duration
	for range attempts {
		d := prefilterOnset(t)
		took = append(took, d)
		// Generous: the bound catches an update that waits for the
		// period (250 ms), not a figure.
		if d <= prefilter.Period-50*time.Millisecond {
			t.Logf("the flood's rule came after %v (attempts %v)", d, took)
			return
		}
	}
	t.Errorf("the flood's rule came after %v in %d attempts, want well under the period %v", took, attempts, prefilter.Period)
}

// prefilterOnset floods a new engine's socket from one source, right after
// a periodic update, and returns how long its rule took to come.
func prefilterOnset(t *testing.T) time.Duration {
	t.Helper()
	ln, pc, pf := prefiltered(t, testutil.QUICLimits(200, 1000))
	var long, other atomic.Int64
	done := drain(pc, &long, &other)
	defer func() {
		pc.SetReadDeadline(time.Now())
		ln.Close()
		<-done
	}()
	// Let the first periodic update pass, so that the flood starts
	// right after one.
	time.Sleep(prefilter.Period + 20*time.Millisecond)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testutil.PortOf(ln))
	flooder := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.7:0"))
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	stop := make(chan struct{})
	flooded := make(chan error, 1)
	go func() {
		_, err := testutil.Flood{From: []*net.UDPConn{flooder}, To: dst, Rate: 20_000, Count: 40_000, For: 2 * time.Second,
			Stop: stop, Next: func() []byte { return initial }}.Send()
		flooded <- err
	}()
	start := time.Now()
	for pf.Prefilter().Rules == 0 && time.Since(start) < 2*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	close(stop)
	if err := <-flooded; err != nil {
		t.Fatal(err)
	}
	return took
}
