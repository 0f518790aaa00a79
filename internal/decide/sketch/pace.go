package sketch

import "time"

// The pacers: the twin of internal/kernel/c/pace.h (gcra). The filter keeps
// one theoretical arrival time per pacer (the BPF map pacer, slots PACER_*).

// Pacing is a rate compiled for a pacer: a GCRA (generic cell rate
// algorithm) with one event per Interval nanoseconds and a burst tolerance of
// Tau nanoseconds. Interval 0 lets nothing through.
type Pacing struct {
	Interval, Tau uint64
}

// NewPacing compiles a rate in events per second, with a burst of as many.
func NewPacing(rate uint32) Pacing {
	if rate == 0 {
		return Pacing{}
	}
	iv := uint64(time.Second) / uint64(rate)
	return Pacing{Interval: iv, Tau: iv * uint64(rate-1)}
}

// Admit decides whether an event at now conforms to the pacing, given the
// pacer's theoretical arrival time tat, and returns the new one (gcra in the
// C program, which moves tat with a compare-and-swap).
func (p Pacing) Admit(tat, now uint64) (bool, uint64) {
	if p.Interval == 0 || tat > now+p.Tau {
		return false, tat
	}
	return true, max(tat, now) + p.Interval
}

// ReturningShareShift sets the part of the opening class's total that
// returning users' openings may take ahead of strangers (Key.Returning): the
// total's limit >> ReturningShareShift, half of it, a second's worth at
// once. Past it they are ranked as anyone is; strangers keep the rest.
const ReturningShareShift = 1

// returningPacing is the pacing of the returning part of the opening class's
// fair total whose limit is limit packets per second (Unlimited: none).
func returningPacing(limit uint32) Pacing {
	if limit == Unlimited {
		return Pacing{}
	}
	return NewPacing(max(limit>>ReturningShareShift, 1))
}
