package prefilter

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Tuning of the kernel enforcement.
const (
	// Period is how often an Enforcer's owner calls Update.
	Period = 250 * time.Millisecond
	// OnsetPeriod is how often it calls it for OnsetTime after a stream
	// starts being tracked when none had for 2*Period (a flood begins):
	// the unprotected start of a flood fills the socket's receive queue,
	// where legitimate packets are lost with the flood's, and the rates
	// the rules follow are still rising.
	OnsetPeriod = 50 * time.Millisecond
	OnsetTime   = time.Second
	// Headroom is how much more than its limit a limited stream still
	// delivers to the userspace limiter: p = 1 - Headroom*limit/rate. The
	// userspace limiter so keeps dropping (and tracking) the stream, and
	// decides what it lets through.
	Headroom = 2
	// MaxDrop caps a rule's drop probability: the stream keeps reaching
	// the userspace limiter, which keeps measuring it.
	MaxDrop = 0.995
	// MinDrop is the smallest drop probability worth a rule.
	MinDrop = 0.05
)

// Status says what the pre-filter does. The kernel drops are estimated:
// classic BPF cannot count.
type Status struct {
	// Sockets is how many sockets carry the program.
	Sockets int
	// Instructions is the program's length; Rules how many limited
	// streams it drops packets of; Stateless whether it drops invalid
	// datagrams.
	Instructions, Rules int
	Stateless           bool
	// InvalidDropped estimates the invalid datagrams the kernel dropped,
	// by reason: the userspace limiter's count of the sampled ones times
	// the datagrams each sample stands for.
	InvalidDropped [quicclass.NumReasons]uint64
	// StreamDropped estimates the packets of limited streams the kernel
	// dropped, by class: the rate the userspace limiter still sees of each
	// stream times p/(1-p).
	StreamDropped [sketch.NumClasses]uint64
	// NegotiationDropped estimates the datagrams of the negotiation class
	// (unknown versions) the kernel dropped: what the userspace limiter
	// still sees of them times p/(1-p). Negotiation is the drop
	// probability in force.
	NegotiationDropped uint64
	Negotiation        float64
	// ShedDropped estimates the long headers the kernel shed while the
	// receive queue overflowed (SetShed): what the userspace limiter
	// still sees of the opening class times p/(1-p). Shed is the drop
	// probability in force.
	ShedDropped uint64
	Shed        float64
	// Updates counts programs attached; AttachErrors attaches that failed.
	Updates, AttachErrors uint64
}

// ruleState is what the Enforcer remembers of a rule: the drop
// probability in force, its decayed average over the window (the rate the
// userspace limiter estimates is a count decayed over the window, so the
// share of the stream it sees is 1 - peff, not 1 - p, while p changes), and
// the stream's arrival rate, in packets per second.
type ruleState struct {
	p, peff, arrival float64
	class            quicclass.Class
}

// Enforcer keeps the pre-filter of the sockets a userspace limiter reads:
// it compiles the configuration and the streams the limiter drops into a
// program and replaces it on every socket when it changes. It is safe for
// concurrent use.
type Enforcer struct {
	mu    sync.Mutex
	conns []syscall.Conn
	prog  *Program
	// state is every rule's, in force or being phased out.
	state map[ruleKey]*ruleState
	stats Status
	last  time.Time
	// invalid is the userspace limiter's count of invalid datagrams at
	// the last update.
	invalid [quicclass.NumReasons]uint64
	carry   [sketch.NumClasses]float64
	// counts are the candidate streams' drop counts at the last update
	// (see Counted).
	counts map[ruleKey]count
	// neg is the negotiation class's drop probability in force; negSeen
	// the userspace limiter's count of the class at negAt; negCarry the
	// fraction of an estimated kernel drop.
	neg      float64
	negSeen  uint64
	negAt    time.Time
	negCarry float64
	// shed is the drop probability of long headers asked for (SetShed);
	// longSeen the userspace limiter's count of the opening class when
	// the kernel's shed was last estimated; shedCarry the fraction of an
	// estimated drop.
	shed      float64
	longSeen  uint64
	shedKnown bool
	shedCarry float64
	// shedLag is the shed probability that was in force at the last
	// count: a long header the limiter reads now was mostly let into the
	// queue a period ago, under it (the queue is long when the
	// probability rises).
	shedLag float64
}

// NewEnforcer returns an Enforcer with no socket.
func NewEnforcer() *Enforcer {
	return &Enforcer{state: map[ruleKey]*ruleState{}, counts: map[ruleKey]count{}}
}

// Attach puts the program in force on conn (the stateless part, until the
// first Update with streams); on an error conn has no pre-filter and the
// userspace limiter alone protects it.
func (e *Enforcer) Attach(conn syscall.Conn, c decide.Config) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.prog == nil {
		p, err := Build(specOf(c, nil))
		if err != nil {
			e.stats.AttachErrors++
			return err
		}
		e.prog = p
	}
	if err := Attach(conn, e.prog.Raw); err != nil {
		e.stats.AttachErrors++
		return err
	}
	e.conns = append(e.conns, conn)
	e.stats.Updates++
	return nil
}

// Detach takes the program away from conn.
func (e *Enforcer) Detach(conn syscall.Conn) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := slices.Index(e.conns, conn)
	if i < 0 {
		return nil
	}
	e.conns = slices.Delete(e.conns, i, i+1)
	return Detach(conn)
}

// specOf is the program for configuration c and rules.
func specOf(c decide.Config, rules []Rule) Spec {
	s := Spec{DryRun: c.DryRun, Classify: c.Classify, Allow: c.Allow, Rules: rules, SampleShift: DefaultSampleShift}
	if c.Classify {
		s.BlockedPorts = c.BlockedPorts
	}
	return s
}

// RateFunc returns the current estimate, at its node, of the packets of a
// stream that reach the userspace limiter: a decayed count per window
// (userspace.Decider.Rate).
type RateFunc func(*decide.Stream) uint64

// Update compiles c, the streams the userspace limiter tracks and the
// networks its fair total drops packets of (RulesOf, FairRulesOf; with its
// compiled configuration p, the current rate of each stream, and its
// counters st, now), leaving the returning users' sources alone
// (Spec.Returning), and puts the program on every socket if it changed. It
// returns the first attach error; a socket whose update fails keeps its
// previous program.
func (e *Enforcer) Update(c decide.Config, p *sketch.Params, streams, fair []decide.Stream, returning []netip.Addr,
	rate RateFunc, st decide.Stats, now time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.estimate(c, st, p, now)
	var rules []Rule
	if !c.DryRun {
		h := history{e, now, map[ruleKey]count{}}
		rules = mergeRules(RulesOf(c, p, streams, rate, h), FairRulesOf(c, p, fair, rate, h))
		e.counts = h.next
	}
	spec := specOf(c, rules)
	spec.Negotiation, spec.Shed, spec.Returning = e.neg, e.shed, returning
	prog, err := Build(spec)
	if err != nil {
		return err
	}
	for _, s := range e.state {
		s.p = 0 // phased out, unless compiled again
	}
	for _, r := range rules[:prog.Rules] {
		s := e.state[r.key()]
		if s == nil {
			s = &ruleState{}
			e.state[r.key()] = s
		}
		s.p, s.arrival, s.class = r.Drop, r.arrival, r.class
	}
	if e.prog != nil && slices.Equal(prog.Raw, e.prog.Raw) {
		return nil
	}
	var first error
	for _, conn := range e.conns {
		if err := Attach(conn, prog.Raw); err != nil {
			e.stats.AttachErrors++
			first = cmp.Or(first, err)
		}
	}
	e.stats.Updates++
	e.prog = prog
	return first
}

// SetShed sets the drop probability of long headers (see Spec.Shed) the
// next Update puts in force, and reports whether it changed; the kernel's
// drops until then are estimated from st, the userspace limiter's counters
// now.
func (e *Enforcer) SetShed(p float64, st decide.Stats) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.countShed(st)
	p = min(max(p, 0), 1)
	changed := p != e.shed
	e.shed = p
	return changed
}

// Account brings the estimate of the kernel's shed drops up to st, the
// userspace limiter's counters now, so that Status counts every drop the
// socket did.
func (e *Enforcer) Account(st decide.Stats) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.countShed(st)
}

// Status returns what the pre-filter does.
func (e *Enforcer) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Sockets = len(e.conns)
	if e.prog != nil {
		s.Instructions, s.Rules, s.Stateless, s.Negotiation, s.Shed = e.prog.Len(), e.prog.Rules, e.prog.Stateless,
			e.prog.Negotiation, e.prog.Shed
	}
	return s
}

// Dropped is the total of the estimated kernel drops.
func (s Status) Dropped() uint64 {
	var n uint64
	for _, v := range s.InvalidDropped {
		n += v
	}
	for _, v := range s.StreamDropped {
		n += v
	}
	return n + s.NegotiationDropped + s.ShedDropped
}
