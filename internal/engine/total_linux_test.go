//go:build linux

package engine

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
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

// TestTotalFollowsQueue: on a real socket read by a slow reader (a quic-go
// that falls behind), a flood of Initials from many ports makes the
// adaptive opening total fall from where it starts, and once the flood is
// over and the queue drained, the total is lifted.
func TestTotalFollowsQueue(t *testing.T) {
	c := decide.Config{Classify: true, AdaptiveTotal: true, Limiter: sketch.Config{Limit: 1000, Window: time.Second,
		// Only the total limits: the flood is one address.
		LevelLimits: map[int]uint32{0: sketch.Unlimited, 1: sketch.Unlimited, 2: sketch.Unlimited, 3: 20_000}}}
	l, err := New("total", c, ModeBPF, zap.NewNop())
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatalf("loading the filter: %v", err)
	}
	defer l.Close()
	rx := testutil.Listen(t, "udp4", "127.0.0.1:0")
	if err := rx.SetReadBuffer(256 << 10); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Attach(rx); err != nil {
		t.Fatal(err)
	}
	// The reader takes 2,000 datagrams a second at most.
	stopReader := slowReader(rx, 500*time.Microsecond, func([]byte) {})
	dst := netip.MustParseAddrPort(rx.LocalAddr().String())
	initial := quicclass.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
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
