package testutil

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// TestInitials: every datagram is a 1200-byte Initial that the classifier
// counts as connection-opening, each with a destination connection ID of
// its own; a seed makes the same datagrams again.
func TestInitials(t *testing.T) {
	g, again := NewInitials(7), NewInitials(7)
	seen := map[string]bool{}
	for i := range 200 {
		b := g.Next()
		if len(b) != InitialSize {
			t.Fatalf("datagram %d has %d bytes", i, len(b))
		}
		if class, reason := quicclass.Classify(quicclass.DefaultBlockedPorts(), 50000, b[:quicclass.ProbeBytes], len(b)); class != quicclass.Opening {
			t.Fatalf("datagram %d (%x) classified %v (%v), want opening", i, b[:16], class, reason)
		}
		dcid := string(b[initialDCIDAt : initialDCIDAt+initialCIDLen])
		if seen[dcid] {
			t.Fatalf("datagram %d repeats a destination connection ID", i)
		}
		seen[dcid] = true
		if a := again.Next(); !bytes.Equal(a, b) {
			t.Fatalf("datagram %d differs under the same seed", i)
		}
	}
}

// TestFloodInitials: the flood arrives, bounded by its rate and duration,
// and refuses a destination outside loopback.
func TestFloodInitials(t *testing.T) {
	const rate, d = 2000, 500 * time.Millisecond
	rcv := Listen(t, "udp4", "127.0.0.1:0")
	r := Receive(rcv)
	src := netip.MustParseAddr("127.0.0.6")
	sent := FloodInitials(t, src, LoopbackFor(src, PortOf(rcv)), rate, d)
	r.Stop(t)
	if max := int(rate * d.Seconds()); sent < 50 || sent > max {
		t.Errorf("sent %d in %v at %d per second, want 50 to %d", sent, d, rate, max)
	}
	if got := r.ReceivedFrom(src); got != sent {
		t.Errorf("received %d of %d", got, sent)
	}
	rec := &recorder{TB: t}
	if n := FloodInitials(rec, src, netip.MustParseAddrPort("192.0.2.1:443"), rate, d); n != 0 || rec.errors != 1 {
		t.Errorf("a flood to 192.0.2.1 sent %d, failed the test %d times; want 0 and 1", n, rec.errors)
	}
}
