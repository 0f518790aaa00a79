package testutil

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestTally(t *testing.T) {
	tl := NewTally()
	a1 := netip.MustParseAddrPort("127.0.0.2:1000")
	a2 := netip.MustParseAddrPort("127.0.0.2:2000")
	mapped := netip.MustParseAddrPort("[::ffff:127.0.0.2]:1000")
	b := netip.MustParseAddrPort("[::1]:1000")
	for _, from := range []netip.AddrPort{a1, a2, mapped, a1, b} {
		tl.Add(from)
	}
	// Every Add above falls in the first second, unless the machine
	// stalled for one; the counts over all seconds hold either way.
	tests := []struct {
		name      string
		got, want int
	}{
		{"total", tl.Total(), 5},
		{"from 127.0.0.2:1000, mapped or not", tl.Received(a1), 3},
		{"from 127.0.0.2:2000", tl.Received(a2), 1},
		{"from 127.0.0.2, any port", tl.ReceivedFrom(a1.Addr()), 4},
		{"from ::ffff:127.0.0.2, any port", tl.ReceivedFrom(mapped.Addr()), 4},
		{"from ::1", tl.ReceivedFrom(b.Addr()), 1},
		{"from nowhere", tl.ReceivedFrom(netip.MustParseAddr("127.0.0.9")), 0},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, tt.got, tt.want)
		}
	}
	perSecond := tl.PerSecond(a1)
	perSecond[len(perSecond)-1] += 100
	if tl.Received(a1) != 3 {
		t.Error("PerSecond returned the tally's own slice")
	}
	if got := tl.PerSecondFrom(a1.Addr()); len(got) == 0 || slices.Max(got) > 4 {
		t.Errorf("PerSecondFrom = %v", got)
	}
}

// recorder is a testing.TB that records failures and skips instead of
// failing or skipping.
type recorder struct {
	testing.TB
	errors, skips int
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.errors++ }
func (r *recorder) Fatalf(string, ...any) { r.errors++ }
func (r *recorder) Skipf(string, ...any)  { r.skips++ }

func TestCheckHeld(t *testing.T) {
	tests := []struct {
		name            string
		perSecond, sent []int
		wantFail        bool
	}{
		{"at the limit", []int{500, 100, 100, 100}, nil, false},
		{"within 10%", []int{0, 91, 109, 100}, nil, false},
		{"over", []int{100, 100, 120, 100}, nil, true},
		{"under", []int{100, 100, 100, 50}, nil, true},
		{"first second ignored", []int{1000, 100, 100, 100}, nil, false},
		{"too few seconds", []int{100, 100, 100}, nil, true},
		{"sender kept pace", []int{500, 100, 100, 100}, []int{5000, 5000, 5000, 5000}, false},
		{"sender fell behind to 50", []int{500, 100, 46, 100}, []int{5000, 5000, 50, 5000}, false},
		{"fell behind: a burst over part of the second", []int{500, 100, 20, 100}, []int{5000, 5000, 1600, 5000}, false},
		{"fell behind, and over is over", []int{500, 100, 111, 100}, []int{5000, 5000, 1600, 5000}, true},
		{"kept pace within 10%, under the limit", []int{500, 100, 89, 100}, []int{5000, 5000, 4600, 5000}, true},
		{"caught up: the room the stall opened", []int{500, 100, 100, 200}, []int{5000, 5000, 50, 9950}, false},
		{"caught up: over that room is over", []int{500, 100, 100, 211}, []int{5000, 5000, 50, 9950}, true},
		{"kept pace: over is over", []int{500, 100, 100, 111}, []int{5000, 5000, 5000, 5000}, true},
		{"a shortfall of 40%: 40% more", []int{500, 100, 30, 149}, []int{5000, 5000, 3000, 7000}, false},
		{"a shortfall of 40%: over that is over", []int{500, 100, 30, 151}, []int{5000, 5000, 3000, 7000}, true},
		{"sent nothing in the last second", []int{500, 100, 100}, []int{5000, 5000, 5000}, false},
		{"sent in the last second, received nothing", []int{500, 100, 100}, []int{5000, 5000, 5000, 5000}, true},
	}
	for _, tt := range tests {
		r := &recorder{TB: t}
		CheckHeld(r, tt.name, tt.perSecond, tt.sent, 4, 100)
		if got := r.errors > 0; got != tt.wantFail {
			t.Errorf("%s: CheckHeld(%v, sent %v) failed = %v, want %v", tt.name, tt.perSecond, tt.sent, got, tt.wantFail)
		}
	}
}

// TestTallyStamps: a stamped datagram counts in the second it was sent,
// however late it is counted; one too short for a stamp in the second of
// its source's last stamped one; an unstamped one in the second it was
// counted.
func TestTallyStamps(t *testing.T) {
	tl := NewTally()
	a := netip.MustParseAddrPort("127.0.0.2:1000")
	b := netip.MustParseAddrPort("127.0.0.3:1000")
	stamped := func(since time.Duration) []byte {
		p := make([]byte, 20)
		PutStamp(p, since)
		return p
	}
	tl.AddDatagram(a, stamped(3500*time.Millisecond))
	tl.AddDatagram(a, []byte("x")) // after a stamp of second 3
	tl.AddDatagram(a, stamped(1200*time.Millisecond))
	tl.AddDatagram(a, nil) // after a stamp of second 1
	tl.AddDatagram(a, stamped(0))
	tl.AddDatagram(b, []byte("short, never stamped"))
	if got, want := tl.PerSecond(a), []int{1, 2, 0, 2}; !slices.Equal(got, want) {
		t.Errorf("stamped source: per second %v, want %v", got, want)
	}
	// Counted now, in second 0 unless the machine stalled for a second.
	if got := tl.PerSecond(b); sum(got) != 1 || len(got) > 2 {
		t.Errorf("unstamped source: per second %v, want 1 datagram now", got)
	}
}

func TestStamp(t *testing.T) {
	tests := []struct {
		name   string
		size   int
		since  time.Duration
		wantOK bool
	}{
		{"start", 8, 0, true},
		{"a datagram", 1200, 2*time.Second + 7, true},
		{"the latest accepted", 100, maxStamp, true},
		{"later than any test", 100, maxStamp + 1, false},
		{"too short", 7, time.Second, false},
		{"empty", 0, time.Second, false},
	}
	for _, tt := range tests {
		b := make([]byte, tt.size)
		PutStamp(b, tt.since)
		got, ok := ReadStamp(b)
		if ok != tt.wantOK || (ok && got != tt.since) {
			t.Errorf("%s: ReadStamp(PutStamp(%d bytes, %v)) = %v, %v; want %v", tt.name, tt.size, tt.since, got, ok, tt.wantOK)
		}
		if tt.size >= StampSize && !slices.Equal(b[:tt.size-StampSize], make([]byte, tt.size-StampSize)) {
			t.Errorf("%s: PutStamp wrote before the last %d bytes", tt.name, StampSize)
		}
	}
	if _, ok := ReadStamp(make([]byte, 100)); ok {
		t.Error("zero bytes read as a stamp")
	}
}

// TestFloodStamps: a stamped flood's datagrams count, at the receiver, in
// exactly the seconds the flood says it sent them in, even when the reader
// takes them only after the flood: both come from the stamp.
func TestFloodStamps(t *testing.T) {
	conn := Listen(t, "udp4", "127.0.0.1:0")
	// Room for the whole flood, read only after it.
	if err := conn.SetReadBuffer(8 << 20); err != nil {
		t.Fatal(err)
	}
	src := Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	dst := LoopbackFor(netip.MustParseAddr("127.0.0.2"), PortOf(conn))
	buf := make([]byte, 64)
	buf[0] = 0xc0 // a QUIC long header byte the stamp must not touch
	f := Flood{From: []*net.UDPConn{src}, To: dst, Rate: 500, Count: 750, Stamp: true, Next: func() []byte { return buf }}
	sent, err := f.Run()
	if err != nil {
		t.Fatal(err)
	}
	// Read only now: read-time seconds would all be one.
	r := Receive(conn)
	r.Drain(t)
	if got := r.Total(); got != sent.Total || sent.Total != 750 || sum(sent.PerSecond) != sent.Total {
		t.Fatalf("sent %d (per second %v), received %d", sent.Total, sent.PerSecond, got)
	}
	r.Stop(t)
	from := src.LocalAddr().(*net.UDPAddr).AddrPort()
	if got := r.PerSecond(from); !slices.Equal(got, sent.PerSecond) || len(got) < 2 {
		t.Errorf("received per second %v, sent %v; want the same, over at least 2 seconds", got, sent.PerSecond)
	}
	if buf[0] != 0xc0 {
		t.Errorf("the stamp changed the first byte to %#x", buf[0])
	}
}

// TestDrain: Drain returns once every datagram sent before it is counted,
// with the reader still running.
func TestDrain(t *testing.T) {
	conn := Listen(t, "udp4", "127.0.0.1:0")
	src := Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	r := Receive(conn)
	const n = 2000
	dst := LoopbackFor(netip.MustParseAddr("127.0.0.2"), PortOf(conn))
	for range n {
		if _, err := src.WriteToUDPAddrPort(make([]byte, 100), dst); err != nil {
			t.Fatal(err)
		}
	}
	r.Drain(t)
	if got := r.Total(); got != n {
		t.Errorf("after Drain, %d of %d counted", got, n)
	}
	r.Stop(t)
}

func TestHeld(t *testing.T) {
	tests := []struct {
		sent    int
		dropped uint64
		want    bool
	}{
		{3000, 2900, true},
		{3000, 2600, true}, // 400 through: a burst, a second and margin
		{3000, 2599, false},
		{3000, 0, false},
		{300, 0, true}, // under four times the limit: nothing to hold
	}
	for _, tt := range tests {
		if got := Held(tt.sent, tt.dropped, 100); got != tt.want {
			t.Errorf("Held(sent %d, dropped %d, limit 100) = %v, want %v", tt.sent, tt.dropped, got, tt.want)
		}
	}
}

// TestWaitEmpty: once WaitEmpty returns, a slow reader has taken every
// datagram sent before it off the queue.
func TestWaitEmpty(t *testing.T) {
	conn := Listen(t, "udp4", "127.0.0.1:0")
	src := Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	const n = 500
	done := make(chan int)
	go func() {
		got, buf := 0, make([]byte, 64)
		for {
			if _, _, err := conn.ReadFromUDPAddrPort(buf); err != nil {
				done <- got
				return
			}
			got++
			time.Sleep(200 * time.Microsecond) // behind the sender
		}
	}()
	dst := LoopbackFor(netip.MustParseAddr("127.0.0.2"), PortOf(conn))
	for range n {
		if _, err := src.WriteToUDPAddrPort(make([]byte, 10), dst); err != nil {
			t.Fatal(err)
		}
	}
	WaitEmpty(t, conn)
	conn.Close()
	if got := <-done; got != n {
		t.Errorf("read %d of %d before the queue was empty", got, n)
	}
}

func TestSumSent(t *testing.T) {
	got := SumSent(Sent{Total: 3, PerSecond: []int{1, 2}}, Sent{Total: 6, PerSecond: []int{1, 2, 3}}, Sent{})
	if want := (Sent{Total: 9, PerSecond: []int{2, 4, 3}}); got.Total != want.Total || !slices.Equal(got.PerSecond, want.PerSecond) {
		t.Errorf("SumSent = %+v, want %+v", got, want)
	}
}
