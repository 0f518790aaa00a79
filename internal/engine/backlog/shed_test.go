package backlog

import (
	"math"
	"testing"
)

// TestShedStep: after an overflow, or with the queue over its high-water
// mark and growing, the pass fraction of long headers falls to what lets the
// queue be offered Target times what the reader took, at least a step and at
// most to the floor; it rises Rise steps while the queue is short, and holds
// in between, or when there is no long header to shed.
func TestShedStep(t *testing.T) {
	law := ShedLaw{High: 0.25, Low: 0.0625, Overflows: 8, Target: 0.75, Steps: 8, MaxSteps: 64, Rise: 2}
	const sec = int64(1e9)
	step := func(q float64) int { return int(math.Ceil(-math.Log2(q) * 8)) }
	for _, tt := range []struct {
		name  string
		start int // the shedder's step before
		first Sample
		next  Sample // one second after first
		want  int    // step after
	}{
		// Received 100,000, half of them long; 100,000 more overflowed:
		// 100,000 short and 100,000 long arrive, and q' = (75,000 -
		// 100,000)/100,000 < 0: shedding cannot help, tail drop it is.
		{"short headers alone overflow", 3, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Overflows: 100_000, Received: 100_000, Long: 50_000}, 3},
		// Received 100,000, 99% long, 400,000 more overflowed: S = 5,000,
		// L = 495,000, q' = 0.141.
		{"a flood of long headers", 0, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Overflows: 400_000, Received: 100_000, Long: 99_000}, step(70_000.0 / 495_000)},
		// q at the floor already: L = 495,000*256, q' under the floor.
		{"the floor", 64, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Overflows: 400_000, Received: 100_000, Long: 99_000}, 64},
		// Received 100,000, 90% long; 100,000 overflowed: S = 20,000, L =
		// 180,000, q' = (75,000-20,000)/180,000 = 0.306.
		{"overflow cuts to the target", 0, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Overflows: 100_000, Received: 100_000, Long: 90_000}, step(55_000.0 / 180_000)},
		// The same at q = 1/2 already: L = 360,000, q' = 0.153.
		{"the cut counts what was shed", 8, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Overflows: 100_000, Received: 100_000, Long: 90_000}, step(55_000.0 / 360_000)},
		{"a full queue growing cuts", 0, Sample{Queued: 10, Capacity: 100},
			Sample{At: sec, Queued: 30, Capacity: 100, Received: 100_000, Long: 90_000}, step((75_000.0 - 10_000) / 90_000)},
		{"no long header: tail drop", 3, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Overflows: 100_000, Received: 100_000}, 3},
		{"a few drops are noise", 3, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Overflows: 7, Received: 100_000, Long: 90_000}, 3},
		{"a full queue draining holds", 3, Sample{Queued: 90, Capacity: 100},
			Sample{At: sec, Queued: 60, Capacity: 100, Received: 100_000, Long: 90_000}, 3},
		{"in between holds", 3, Sample{Capacity: 100},
			Sample{At: sec, Queued: 15, Capacity: 100, Received: 100_000, Long: 90_000}, 3},
		{"a short queue rises", 10, Sample{Capacity: 100},
			Sample{At: sec, Queued: 5, Capacity: 100, Received: 100_000, Long: 90_000}, 8},
		{"to nothing shed", 1, Sample{Capacity: 100},
			Sample{At: sec, Capacity: 100, Received: 100, Long: 90}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := NewShedder(law)
			s.step = tt.start
			before := s.Drop()
			if _, changed := s.Step(tt.first); changed {
				t.Fatal("the first sample changed the probability")
			}
			got, changed := s.Step(tt.next)
			if s.step != tt.want {
				t.Fatalf("step %d (drop %.3f), want %d", s.step, got, tt.want)
			}
			if want := 1 - math.Exp2(-float64(tt.want)/8); math.Abs(got-want) > 1e-12 || changed != (tt.want != tt.start) {
				t.Fatalf("drop %.4f changed %v, want %.4f changed %v (from %.4f)", got, changed, want, tt.want != tt.start, before)
			}
			if r := s.Last(); r.Drop != got {
				t.Errorf("Last().Drop = %v, want %v", r.Drop, got)
			}
		})
	}
}

// TestShedKeepsShortHeaders: a queue served at mu datagrams a second, with
// steady short-header traffic, flooded with long headers far above mu: the
// shed keeps the queue from overflowing, so that the short headers lose
// (almost) nothing, passes about what the reader can take of long headers,
// and lets every long header in again once the flood is over.
func TestShedKeepsShortHeaders(t *testing.T) {
	for _, tt := range []struct {
		name              string
		short, long, mu   float64
		queuePackets      float64
		maxShortLossShare float64
	}{
		{"5x capacity", 5_000, 500_000, 100_000, 3_000, 0.001},
		{"50x capacity", 2_000, 2_000_000, 40_000, 3_000, 0.001},
		{"just over", 10_000, 120_000, 100_000, 3_000, 0.001},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := &shedQueue{mu: tt.mu, size: tt.queuePackets}
			s := NewShedder(DefaultShedLaw)
			var x Sample
			var shortIn, shortLost, passedLong float64
			for i := range 500 { // 25 s: 15 s of flood, 10 s of calm
				long := tt.long
				if i >= 300 {
					long = 100
				}
				var lost float64
				x, lost = q.period(x, tt.short, long*(1-s.Drop()), Period)
				s.Step(x)
				if i >= 40 && i < 300 { // after the first 2 s
					shortIn += tt.short * float64(Period) / 1e9
					shortLost += lost
					passedLong += long * (1 - s.Drop()) * float64(Period) / 1e9
				}
			}
			if share := shortLost / shortIn; share > tt.maxShortLossShare {
				t.Errorf("the queue's overflows took %.2f%% of the short headers, want at most %.2f%%",
					100*share, 100*tt.maxShortLossShare)
			}
			perSecond := passedLong / (260 * float64(Period) / 1e9)
			if room := tt.mu - tt.short; perSecond < 0.5*room || perSecond > 1.3*room {
				t.Errorf("long headers passed at %.0f a second, want near the reader's room for them, %.0f", perSecond, room)
			}
			if s.Drop() != 0 {
				t.Errorf("10 s after the flood the pre-filter sheds %.3f of long headers, want none", s.Drop())
			}
		})
	}
}

// shedQueue is a receive queue of size datagrams served at mu a second,
// first in first out: what overflows is lost at random among what arrives.
type shedQueue struct {
	mu, size, len float64
	overflows     float64
	received      float64
	long          float64
}

// period advances the queue by dt nanoseconds of short and long datagrams
// arriving each second, and returns the next sample and the short
// datagrams lost to overflows.
func (q *shedQueue) period(s Sample, short, long float64, dt int64) (Sample, float64) {
	sec := float64(dt) / 1e9
	in := (short + long) * sec
	served := min(q.mu*sec, q.len+in)
	q.len += in - served
	var lost float64
	if q.len > q.size {
		over := q.len - q.size
		q.overflows += over
		lost = over * short / (short + long)
		q.len = q.size
	}
	q.received += served
	if short+long > 0 {
		q.long += served * long / (short + long)
	}
	s.At += dt
	s.Queued, s.Capacity = uint64(q.len), uint64(q.size)
	s.Overflows, s.Received, s.Long = uint64(q.overflows), uint64(q.received), uint64(q.long)
	return s, lost
}
