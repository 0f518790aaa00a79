package userspace

import (
	"math"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestRate: a tracked stream's current rate is its node's estimate now, at
// the rate it arrives, decaying once it stops; an invalid stream has none.
func TestRate(t *testing.T) {
	var clk testutil.Clock
	l := newTestDecider(t, testutil.QUICLimits(100, 1000), &clk, 0)
	// 1,000 Initials a second for 3 s, and junk, from two sources.
	for range 3000 {
		clk.Advance(time.Millisecond)
		d := dgram("127.0.0.2:40000", quicclasstest.Initial())
		l.Decide(&d)
		j := dgram("127.0.0.3:40000", junk())
		l.Decide(&j)
	}
	streams, _ := l.Streams()
	var rate, invalid uint64
	found := 0
	for i := range streams {
		s := &streams[i]
		switch s.Class {
		case quicclass.Opening:
			if s.Node == l.Params().Nodes[0] {
				rate = l.Rate(s)
				found++
			}
		case quicclass.Invalid:
			invalid = l.Rate(s)
			found++
		}
	}
	if found != 2 {
		t.Fatalf("streams %+v: want the flood's most specific stream and the junk's", streams)
	}
	// 3 windows at 1,000 a second: 95% of the steady 1,000.
	if pps := l.Params().PPS(rate); math.Abs(pps-950) > 50 {
		t.Errorf("rate %v/s, want about 950", pps)
	}
	if invalid != 0 {
		t.Errorf("the invalid stream has a rate %d", invalid)
	}
	clk.Advance(time.Second)
	for i := range streams {
		if s := &streams[i]; s.Class == quicclass.Opening && s.Node == l.Params().Nodes[0] {
			if later := l.Rate(s); float64(later) > float64(rate)*0.4 || later == 0 {
				t.Errorf("a window after the flood, rate %d of %d: want it decayed by e", later, rate)
			}
		}
	}
}
