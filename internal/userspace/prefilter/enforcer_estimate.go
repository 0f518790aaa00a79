package prefilter

import (
	"math"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// estimate adds the kernel's drops since the last update to the stats and
// moves each rule's average probability on.
func (e *Enforcer) estimate(c decide.Config, st decide.Stats, p *sketch.Params, now time.Time) {
	var invalid [quicclass.NumReasons]uint64
	for fam := range decide.Families {
		for r := range invalid {
			invalid[r] += st.Invalid[0][fam][r]
		}
	}
	attached := len(e.conns) > 0
	if e.prog != nil && e.prog.Stateless && e.prog.SampleShift > 0 && attached {
		per := uint64(1)<<e.prog.SampleShift - 1
		for _, r := range Stateless {
			if invalid[r] >= e.invalid[r] {
				e.stats.InvalidDropped[r] += (invalid[r] - e.invalid[r]) * per
			}
		}
	}
	e.invalid = invalid
	e.negotiation(c, st, attached, now)
	e.countShed(st)
	if e.last.IsZero() {
		e.last = now
		return
	}
	dt := now.Sub(e.last).Seconds()
	e.last = now
	decay := math.Exp(-dt * 1e9 / float64(max(p.WindowNanos, 1)))
	for k, s := range e.state {
		if attached && s.p > 0 {
			e.carry[s.class] += s.arrival * dt * s.p
			whole := math.Floor(e.carry[s.class])
			e.stats.StreamDropped[s.class] += uint64(whole)
			e.carry[s.class] -= whole
		}
		s.peff = s.p + (s.peff-s.p)*decay
		if s.p == 0 && s.peff < MinDrop/8 {
			delete(e.state, k)
		}
	}
}

// negotiation measures, at most every Period/2, the rate of the
// negotiation class the userspace limiter sees, corrects it for the
// kernel's drops (the counts are exact, so the probability in force over
// the period is the one to divide by), adds those drops to the stats, and
// sets the probability that leaves the limiter Headroom times the
// configured rate of Version Negotiation replies (DropFor); dry runs and
// programs that do not classify drop none.
func (e *Enforcer) negotiation(c decide.Config, st decide.Stats, attached bool, now time.Time) {
	var seen uint64
	for fam := range decide.Families {
		for _, n := range st.Negotiation[fam] {
			seen += n
		}
	}
	if e.negAt.IsZero() || seen < e.negSeen {
		e.negSeen, e.negAt = seen, now
		return
	}
	dt := now.Sub(e.negAt).Seconds()
	if dt < Period.Seconds()/2 {
		return
	}
	inForce := 0.0
	if attached {
		inForce = e.neg
	}
	arrival := float64(seen-e.negSeen) / dt / (1 - inForce)
	if inForce > 0 {
		e.negCarry += arrival * dt * inForce
		whole := math.Floor(e.negCarry)
		e.stats.NegotiationDropped += uint64(whole)
		e.negCarry -= whole
	}
	e.negSeen, e.negAt = seen, now
	e.neg = 0
	if c.Classify && !c.DryRun {
		e.neg = DropFor(arrival, float64(c.Negotiation))
	}
}

// countShed adds to the stats the long headers the pre-filter shed since the
// last count: for each one the userspace limiter saw of the opening class,
// p/(1-p) were shed, p the probability in force at the last count (shedLag).
// e.mu must be held.
func (e *Enforcer) countShed(st decide.Stats) {
	var seen uint64
	for fam := range decide.Families {
		seen += st.Passed[quicclass.Opening][fam]
		for _, n := range st.Dropped[quicclass.Opening][fam] {
			seen += n
		}
	}
	if !e.shedKnown || seen < e.longSeen {
		e.longSeen, e.shedKnown = seen, true
		return
	}
	p := e.shedLag
	e.shedLag = e.shedInForce()
	if p > 0 && p < 1 {
		e.shedCarry += float64(seen-e.longSeen) * p / (1 - p)
		whole := math.Floor(e.shedCarry)
		e.stats.ShedDropped += uint64(whole)
		e.shedCarry -= whole
	}
	e.longSeen = seen
}

// shedInForce is the shed probability on the sockets; e.mu must be held.
func (e *Enforcer) shedInForce() float64 {
	if e.prog == nil || len(e.conns) == 0 {
		return 0
	}
	return e.prog.Shed
}
