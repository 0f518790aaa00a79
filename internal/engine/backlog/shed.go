package backlog

import "math"

// The userspace mode receives every datagram its kernel pre-filter lets
// through, and its reader can fall behind a flood: the receive queue then
// fills and the kernel drops what arrives, whatever it is. Tail drop takes
// the packets of established connections (their last ones among them: a
// client's CONNECTION_CLOSE lost there leaves quic-go waiting for the
// connection's idle timeout, and Caddy's stop with it) as often as the
// flood's. A Shedder steers the share of connection-opening packets (long
// headers of a known version) the pre-filter lets into the queue so that it
// does not overflow: short headers keep their room, and the openings lose no
// more than tail drop would have taken from them.

// ShedLaw are the constants of the shedding loop.
type ShedLaw struct {
	// High and Low are fractions of the queue's capacity: at High or
	// above with the queue growing, or after an overflow, the pass
	// fraction falls; at Low or below with no datagram dropped it rises;
	// otherwise it holds.
	High, Low float64
	// Overflows is how many datagrams dropped for want of room in one
	// period count as an overflow.
	Overflows uint64
	// Target is the share of what the reader received in the last period
	// that the queue is to be offered after a cut: under 1, so that the
	// queue drains.
	Target float64
	// Steps is how many pass fractions there are per halving; MaxSteps
	// the most there are (the pass fraction's floor is 2^(-MaxSteps/Steps));
	// Rise how many steps the pass fraction rises in a quiet period.
	Steps, MaxSteps, Rise int
}

// DefaultShedLaw are the constants the engine uses, with a period of
// Period. The marks are the opening total's: a queue a quarter full holds
// about 25 ms of quic-go's work. Pass fractions are 2^(1/8) apart (about 9%:
// noise does not replace the program every period), down to 1/256; from
// there a quiet queue lets every opening in again after 32 periods (1.6 s).
var DefaultShedLaw = ShedLaw{High: 0.25, Low: 0.0625, Overflows: 8, Target: 0.75, Steps: 8, MaxSteps: 64, Rise: 2}

// ShedReading is what a shedding step saw and decided.
type ShedReading struct {
	// Fill is the queue's fill, 0 to 1; Overflows the datagrams dropped
	// for want of room in the period.
	Fill      float64
	Overflows uint64
	// ReceivedPPS is the rate of datagrams the reader received, and
	// LongShare the share of them that were long headers.
	ReceivedPPS, LongShare float64
	// Drop is the drop probability of long headers in force after the
	// step.
	Drop float64
}

// Shedder is the state of the shedding loop: the pass fraction of long
// headers is 2^(-step/Steps).
type Shedder struct {
	law  ShedLaw
	step int
	prev Sample
	have bool
	why  ShedReading
}

// NewShedder returns a Shedder that lets every long header through.
func NewShedder(law ShedLaw) *Shedder {
	return &Shedder{law: law}
}

// Drop is the drop probability of long headers in force.
func (s *Shedder) Drop() float64 { return 1 - s.pass(s.step) }

// Last is what the last step saw.
func (s *Shedder) Last() ShedReading { return s.why }

func (s *Shedder) pass(step int) float64 {
	return math.Exp2(-float64(step) / float64(max(s.law.Steps, 1)))
}

// Step takes a sample (Received and Long are the reader's counts; Overflows
// the datagrams the queue dropped, not the filter) and returns the drop
// probability of long headers and whether it changed.
//
// After an overflow, or with the queue over High and growing, the pass
// fraction q falls to what lets the queue be offered Target times what the
// reader took in the period: the reader received R datagrams a second, a
// share s of them long headers, and the queue dropped O more, at random; so
// S = (1-s)(R+O) short headers and L = s(R+O)/q long ones arrive, and q' =
// (Target*R - S)/L (at least 3 steps under q, as Target < 1), at least the
// floor. When the short headers alone are more than Target*R, shedding long
// headers cannot keep the queue from overflowing: the pass fraction holds,
// and tail drop takes openings as before, no more. In a quiet period it
// rises Rise steps.
func (s *Shedder) Step(x Sample) (float64, bool) {
	if !s.have || x.At <= s.prev.At {
		s.prev, s.have = x, true
		return s.Drop(), false
	}
	dt := float64(x.At-s.prev.At) / 1e9
	received, long := sub(x.Received, s.prev.Received), sub(x.Long, s.prev.Long)
	r := ShedReading{ReceivedPPS: float64(received) / dt, Overflows: sub(x.Overflows, s.prev.Overflows)}
	if received > 0 {
		r.LongShare = min(float64(long)/float64(received), 1)
	}
	if x.Capacity > 0 {
		r.Fill = float64(x.Queued) / float64(x.Capacity)
	}
	growing := x.Queued > s.prev.Queued
	s.prev = x
	prev := s.step
	switch {
	case r.Overflows >= max(s.law.Overflows, 1) || (r.Fill >= s.law.High && growing):
		if r.LongShare == 0 {
			break // no long header to shed: tail drop it is
		}
		arrivals := r.ReceivedPPS + float64(r.Overflows)/dt
		short := (1 - r.LongShare) * arrivals
		longIn := r.LongShare * arrivals / s.pass(s.step)
		want := (s.law.Target*r.ReceivedPPS - short) / longIn
		if want <= 0 {
			break // the short headers alone overflow it
		}
		next := max(s.step+1, int(math.Ceil(-math.Log2(want)*float64(s.law.Steps))))
		s.step = min(next, s.law.MaxSteps)
	case r.Fill <= s.law.Low && r.Overflows == 0:
		s.step = max(s.step-s.law.Rise, 0)
	}
	r.Drop = s.Drop()
	s.why = r
	return r.Drop, s.step != prev
}
