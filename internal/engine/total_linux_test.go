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
	"go.uber.org/zap/zaptest/observer"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// waitSent waits, up to within, for n paced senders to report on done,
// failing t on an error, and calls watch after each report and every
// backlog.Period meanwhile.
func waitSent(t *testing.T, done <-chan error, n int, within time.Duration, watch func()) {
	t.Helper()
	deadline := time.Now().Add(within)
	for sent := 0; sent < n && time.Now().Before(deadline); {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			sent++
		case <-time.After(backlog.Period):
		}
		watch()
	}
}

// slowReader reads pc, a quic-go that falls behind, in a goroutine: got sees
// each datagram, then the reader pauses. The function it returns stops it
// and waits for it.
func slowReader(pc net.PacketConn, pause time.Duration, got func([]byte)) (stop func()) {
	var stopping atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for !stopping.Load() {
			pc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if n, _, err := pc.ReadFrom(buf); err == nil && n > 0 {
				got(buf[:n])
				time.Sleep(pause)
			}
		}
	}()
	return func() {
		stopping.Store(true)
		<-done
	}
}

// smallQueue listens on a loopback UDP socket with a receive buffer of
// 256 KiB, which a flood overflows quickly.
func smallQueue(t *testing.T) *net.UDPConn {
	t.Helper()
	rx := testutil.Listen(t, "udp4", "127.0.0.1:0")
	if err := rx.SetReadBuffer(256 << 10); err != nil {
		t.Fatal(err)
	}
	return rx
}

// attachedBPF loads the kernel filter with c and attaches it to a
// smallQueue socket.
func attachedBPF(t *testing.T, name string, c decide.Config) (*Limiter, *net.UDPConn) {
	t.Helper()
	l, err := New(name, c, ModeBPF, zap.NewNop())
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatalf("loading the filter: %v", err)
	}
	rx := smallQueue(t)
	if _, _, err := l.Attach(rx); err != nil {
		l.Close()
		t.Fatal(err)
	}
	return l, rx
}

// TestTotalFollowsQueue: on a real socket read by a slow reader (a quic-go
// that falls behind), a flood of Initials from many ports makes the
// adaptive opening total fall from where it starts, and once the flood is
// over and the queue drained, the total is lifted.
func TestTotalFollowsQueue(t *testing.T) {
	c := decide.Config{Classify: true, AdaptiveTotal: true, Limiter: sketch.Config{Limit: 1000, Window: time.Second,
		// Only the total limits: the flood is one address.
		LevelLimits: map[int]uint32{0: sketch.Unlimited, 1: sketch.Unlimited, 2: sketch.Unlimited, 3: 20_000}}}
	l, rx := attachedBPF(t, "total", c)
	defer l.Close()
	// The reader takes 2,000 datagrams a second at most.
	stopReader := slowReader(rx, 500*time.Microsecond, func([]byte) {})
	dst := netip.MustParseAddrPort(rx.LocalAddr().String())
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	start := l.OpeningTotal()
	if !start.Adaptive || start.Cap != 20_000 {
		t.Fatalf("the total starts at %+v, want adaptive from 20000", start)
	}
	// 3 s at 20,000 a second from 16 ports: ten times what the reader
	// takes; bounded in count.
	lowest := start.Cap
	const senders = 16
	done := make(chan error, senders)
	for range senders {
		s := testutil.Sender(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0))
		go func() {
			done <- testutil.Pace(s, dst, 20_000/senders, 3*20_000/senders, func() []byte { return initial })
		}()
	}
	waitSent(t, done, senders, 5*time.Second, func() {
		if ot := l.OpeningTotal(); ot.Cap != backlog.Unlimited && ot.Cap < lowest {
			lowest = ot.Cap
		}
	})
	if lowest >= start.Cap {
		t.Fatalf("the total never fell below %d while the queue overflowed", start.Cap)
	}
	t.Logf("the total fell to %d under a flood 10x what the reader takes", lowest)
	deadline := time.Now().Add(20 * time.Second)
	for l.OpeningTotal().Cap != backlog.Unlimited {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the flood the total is still %+v", l.OpeningTotal())
		}
		time.Sleep(backlog.Period)
	}
	stopReader()
}

// TestIdleTotalsLogNothing: on an idle socket, the adaptive totals rise
// from where they start (the opening total at its level limit) to lifted
// without a line: the start is not a sign of load, and an operator's first
// sight of the module is no false alarm.
func TestIdleTotalsLogNothing(t *testing.T) {
	c := testutil.QUICLimits(1000, 200_000)
	c.AdaptiveTotal, c.AdaptiveEstablished = true, true
	c.Limiter.LevelLimits = map[int]uint32{c.Limiter.WithDefaults().Levels() - 1: 20_000}
	core, logs := observer.New(zap.InfoLevel)
	l, err := New("idle", c, ModeBPF, zap.New(core))
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatalf("loading the filter: %v", err)
	}
	defer l.Close()
	rx := testutil.Listen(t, "udp4", "127.0.0.1:0")
	if _, _, err := l.Attach(rx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); l.OpeningTotal().Cap != backlog.Unlimited; time.Sleep(backlog.Period) {
		if time.Now().After(deadline) {
			t.Fatalf("the idle opening total is still %+v after 20 s", l.OpeningTotal())
		}
	}
	if et := l.EstablishedTotal(); !et.Adaptive || et.Cap != backlog.Unlimited {
		t.Fatalf("the established total is %+v, want adaptive and lifted", et)
	}
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "total") {
			t.Errorf("an idle socket logged %q (%v)", e.Message, e.ContextMap())
		}
	}
}

// TestTotalKeepsVerificationOff: once the server's connection IDs of
// another length turned verification off, a move of the adaptive total
// keeps it off (it configures the engine from the effective settings, not
// the raw ones), and so does the configuration a fallback starts from.
func TestTotalKeepsVerificationOff(t *testing.T) {
	c := testutil.QUICLimits(1000, 200_000)
	c.VerifyIDs, c.AdaptiveTotal = true, true
	c.Limiter.LevelLimits = map[int]uint32{c.Limiter.WithDefaults().Levels() - 1: 20_000}
	k := newFake(t, ModeBPF, nil)
	l, err := start("odd", k, Setting{Config: c, Mode: ModeBPF, Logger: zap.NewNop()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.oddID(8)
	if k.configured().VerifyIDs {
		t.Fatal("verification stayed on after odd IDs")
	}
	rx := testutil.Listen(t, "udp4", "127.0.0.1:0")
	if _, _, err := l.Attach(rx); err != nil {
		t.Fatal(err)
	}
	// An idle socket lifts the total within seconds: each step
	// reconfigures the engine.
	for deadline := time.Now().Add(20 * time.Second); l.OpeningTotal().Cap != backlog.Unlimited; time.Sleep(backlog.Period) {
		if time.Now().After(deadline) {
			t.Fatalf("the idle opening total is still %+v after 20 s", l.OpeningTotal())
		}
	}
	if k.configured().VerifyIDs {
		t.Fatal("a move of the total turned verification on again")
	}
	l.mu.Lock()
	applied := l.applied()
	l.mu.Unlock()
	if applied.VerifyIDs {
		t.Fatal("the configuration a fallback starts from verifies again")
	}
}

// TestEstablishedTotalFollowsQueue: the established class's total starts
// lifted and stays so while the reader keeps up; a flood of short headers
// from many sources, each under its limit, that overflows a slow reader
// brings it down (no class is unbounded), and it is lifted again once the
// flood is over.
func TestEstablishedTotalFollowsQueue(t *testing.T) {
	c := testutil.QUICLimits(1000, 200_000)
	c.AdaptiveEstablished = true
	l, rx := attachedBPF(t, "established", c)
	defer l.Close()
	if et := l.EstablishedTotal(); !et.Adaptive || et.Cap != backlog.Unlimited {
		t.Fatalf("the established total starts at %+v, want adaptive and lifted", et)
	}
	stopReader := slowReader(rx, 500*time.Microsecond, func([]byte) {})
	defer stopReader()
	dst := netip.MustParseAddrPort(rx.LocalAddr().String())
	short := quicclasstest.ShortHeader(1200)
	// 3 s at 40,000 a second from 16 addresses: twenty times what the
	// reader takes; bounded in count.
	const senders = 16
	done := make(chan error, senders)
	var fell atomic.Bool
	for i := range senders {
		s := testutil.Sender(t, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 9, byte(1 + i)}), 0))
		go func() {
			done <- testutil.Pace(s, dst, 40_000/senders, 3*40_000/senders, func() []byte { return short })
		}()
	}
	waitSent(t, done, senders, 5*time.Second, func() {
		if et := l.EstablishedTotal(); et.Cap != backlog.Unlimited {
			fell.Store(true)
		}
	})
	if !fell.Load() {
		t.Fatal("the established total stayed lifted while the queue overflowed")
	}
	for deadline := time.Now().Add(20 * time.Second); l.EstablishedTotal().Cap != backlog.Unlimited; time.Sleep(backlog.Period) {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the flood the established total is still %+v", l.EstablishedTotal())
		}
	}
}
