package testutil

import (
	"net/netip"
	"slices"
	"testing"
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
		name      string
		perSecond []int
		wantFail  bool
	}{
		{"at the limit", []int{500, 100, 100, 100}, false},
		{"within 10%", []int{0, 91, 109, 100}, false},
		{"over", []int{100, 100, 120, 100}, true},
		{"under", []int{100, 100, 100, 50}, true},
		{"first second ignored", []int{1000, 100, 100, 100}, false},
		{"too few seconds", []int{100, 100, 100}, true},
	}
	for _, tt := range tests {
		r := &recorder{TB: t}
		CheckHeld(r, tt.name, tt.perSecond, 4, 100)
		if got := r.errors > 0; got != tt.wantFail {
			t.Errorf("%s: CheckHeld(%v) failed = %v, want %v", tt.name, tt.perSecond, got, tt.wantFail)
		}
	}
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
