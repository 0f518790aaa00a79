package backlog

import (
	"testing"
)

// TestStep: the total falls below what passed when the queue is over its
// high-water mark or overflows, rises while it is short, lifts past Max, and
// holds in between.
func TestStep(t *testing.T) {
	law := Law{Min: 1000, Max: 100_000, High: 0.25, Low: 0.0625, Decrease: 0.75, Increase: 1.125, Overflows: 8}
	const sec = int64(1e9)
	for _, tt := range []struct {
		name        string
		start       uint32
		next        Sample // one second after a zero sample
		want        uint32
		wantChanged bool
	}{
		{"overflow from lifted", Unlimited, Sample{At: sec, Capacity: 100, Overflows: 50, Passed: 40_000}, 30_000, true},
		{"full queue from lifted", Unlimited, Sample{At: sec, Queued: 60, Capacity: 100, Passed: 40_000}, 30_000, true},
		{"overflow below the cap", 20_000, Sample{At: sec, Capacity: 100, Overflows: 50, Passed: 20_000}, 15_000, true},
		{"overflow never raises", 10_000, Sample{At: sec, Capacity: 100, Overflows: 50, Passed: 40_000}, 10_000, false},
		{"floor", 2_000, Sample{At: sec, Capacity: 100, Overflows: 50, Passed: 10}, 1_000, true},
		{"a few drops are noise", 20_000, Sample{At: sec, Capacity: 100, Overflows: 7, Passed: 20_000}, 20_000, false},
		{"short queue rises", 20_000, Sample{At: sec, Queued: 5, Capacity: 100, Passed: 20_000}, 22_501, true},
		{"short queue lifts past Max", 95_000, Sample{At: sec, Queued: 0, Capacity: 100}, Unlimited, true},
		{"lifted stays lifted", Unlimited, Sample{At: sec, Queued: 0, Capacity: 100, Passed: 500_000}, Unlimited, false},
		{"in between holds", 20_000, Sample{At: sec, Queued: 15, Capacity: 100, Passed: 20_000}, 20_000, false},
		{"a full queue draining holds", 20_000, Sample{At: sec, Queued: 60, Capacity: 100, Passed: 20_000}, 20_000, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewController(law, tt.start)
			first := Sample{}
			if tt.name == "a full queue draining holds" {
				first.Queued, first.Capacity = 90, 100
			}
			if _, changed := c.Step(first); changed {
				t.Fatal("the first sample changed the total")
			}
			got, changed := c.Step(tt.next)
			if got != tt.want || changed != tt.wantChanged || c.Cap() != got {
				t.Fatalf("total %d (changed %v), want %d (changed %v)", got, changed, tt.want, tt.wantChanged)
			}
		})
	}
}

// TestSettlesAtCapacity: a queue served at mu packets per second, flooded
// with openings far above it, brings the total near mu, and lifts it once the
// flood is over; the queue never stays full.
func TestSettlesAtCapacity(t *testing.T) {
	for _, tt := range []struct {
		name         string
		offered, mu  float64
		queuePackets float64
	}{
		{"5x capacity", 200_000, 40_000, 6_000},
		{"50x capacity", 1_000_000, 20_000, 6_000},
		{"just over", 50_000, 40_000, 6_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := newModelQueue(tt.mu, tt.queuePackets)
			c := NewController(DefaultLaw, 20_000)
			var s Sample
			var caps []uint32
			full := 0
			for i := range 500 { // 25 s: 15 s of flood, 10 s of calm
				offered := tt.offered
				if i >= 300 {
					offered = 100
				}
				s = q.period(s, offered, c.Cap(), Period)
				c.Step(s)
				if i >= 100 && i < 300 {
					caps = append(caps, c.Cap())
					if s.Queued >= s.Capacity {
						full++
					}
				}
			}
			var sum float64
			for _, cp := range caps {
				sum += float64(cp)
			}
			mean := sum / float64(len(caps))
			if mean < 0.6*tt.mu || mean > 1.3*tt.mu {
				t.Errorf("under the flood the total averaged %.0f, want near the capacity %.0f", mean, tt.mu)
			}
			if full > len(caps)/4 {
				t.Errorf("the queue was full in %d of %d periods", full, len(caps))
			}
			if c.Cap() != Unlimited {
				t.Errorf("10 s after the flood the total is %d, want lifted", c.Cap())
			}
		})
	}
}

// modelQueue is a receive queue of size packets served at mu packets per
// second, fed by openings the total caps.
type modelQueue struct {
	mu, size, len float64
	overflows     float64
}

func newModelQueue(mu, size float64) *modelQueue { return &modelQueue{mu: mu, size: size} }

// period advances the queue by dt nanoseconds of offered openings per second
// under the total and returns the next sample.
func (q *modelQueue) period(s Sample, offered float64, total uint32, dt int64) Sample {
	sec := float64(dt) / 1e9
	in := offered
	if total != Unlimited {
		in = min(offered, float64(total))
	}
	q.len += (in - q.mu) * sec
	if q.len > q.size {
		q.overflows += q.len - q.size
		q.len = q.size
	}
	q.len = max(q.len, 0)
	s.At += dt
	s.Passed += uint64(in * sec)
	s.Queued, s.Capacity = uint64(q.len), uint64(q.size)
	s.Overflows = uint64(q.overflows)
	return s
}
