package prefilter

import (
	"cmp"
	"math"
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

// passSteps is how many quantization steps of the pass fraction there are
// per halving: 2^(1/8), about 9% apart.
const passSteps = 8

// DropFor is the drop probability that leaves Headroom times limit of a
// stream arriving at rate (both per the same time), capped at MaxDrop, or 0
// under MinDrop. It is quantized so that noise in the estimate does not
// replace the program every period: the pass fraction 1-p is rounded up to
// a power of 2^(1/passSteps), which never drops more than asked and, unlike
// steps of p, keeps its precision near MaxDrop, where a step of 1/64 would
// pass three times what MaxDrop allows.
func DropFor(rate, limit float64) float64 {
	if rate <= 0 || math.IsNaN(rate) {
		return 0
	}
	pass := max(Headroom*limit/rate, 1-MaxDrop)
	if pass >= 1 {
		return 0
	}
	pass = math.Exp2(math.Ceil(math.Log2(pass)*passSteps) / passSteps)
	if p := 1 - pass; p >= MinDrop {
		return p
	}
	return 0
}

// ruleKey is a rule without its probability.
type ruleKey struct {
	family         sketch.Family
	words          [4]uint32
	bits           int
	sport, dport   uint16
	msport, mdport bool
	form           Form
}

func (r *Rule) key() ruleKey {
	return ruleKey{r.Family, r.Words, r.Bits, r.SrcPort, r.DstPort, r.MatchSrcPort, r.MatchDstPort, r.Form}
}

// Stats says what the pre-filter does. The kernel drops are estimated:
// classic BPF cannot count.
type Stats struct {
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
	stats Stats
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
// (userspace.Limiter.Rate).
type RateFunc func(*decide.Stream) uint64

// Update compiles c, the streams the userspace limiter tracks and the
// networks its fair total drops packets of (RulesOf, FairRulesOf; with its
// compiled configuration p, the current rate of each stream, and its
// counters st, now) and puts the program on every socket if it changed. It
// returns the first attach error; a socket whose update fails keeps its
// previous program.
func (e *Enforcer) Update(c decide.Config, p *sketch.Params, streams, fair []decide.Stream, rate RateFunc,
	st decide.Stats, now time.Time) error {
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
	spec.Negotiation, spec.Shed = e.neg, e.shed
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

// History is what earlier updates tell of a stream, for its arrival rate.
type History interface {
	// Peff is rule k's drop probability averaged as the limiter's
	// decayed count averages (0 for a new rule).
	Peff(k ruleKey) float64
	// Counted is the rate, in packets per second, of the drops the
	// userspace limiter counted of stream s (key k) since the last update,
	// or, for a stream new since, since it was first dropped; and the
	// drop probability the kernel applied meanwhile. ok is false when too
	// few drops or too short a time tell nothing.
	Counted(k ruleKey, s *decide.Stream) (pps, kernel float64, ok bool)
}

// count is a stream's drop count at an update.
type count struct {
	first time.Time
	drops uint64
	at    time.Time
}

// history is the Enforcer's History during an update at now; next
// collects the counts to remember.
type history struct {
	e    *Enforcer
	now  time.Time
	next map[ruleKey]count
}

func (h history) Peff(k ruleKey) float64 {
	if s := h.e.state[k]; s != nil {
		return s.peff
	}
	return 0
}

// Least drops and time for Counted to tell a rate.
const (
	countSpan    = 10 * time.Millisecond
	countSamples = 8 << decide.DefaultTrackShift
)

func (h history) Counted(k ruleKey, s *decide.Stream) (pps, kernel float64, ok bool) {
	h.next[k] = count{first: s.First, drops: s.Drops, at: h.now}
	base := count{first: s.First, at: s.First}
	if c, seen := h.e.counts[k]; seen && c.first.Equal(s.First) && c.drops <= s.Drops {
		base = c
	}
	if st := h.e.state[k]; st != nil && len(h.e.conns) > 0 {
		kernel = st.p
	}
	// A new stream's drops span its first to its last; a known one's
	// the time since the last update.
	span, drops := s.Last.Sub(s.First), s.Drops-base.drops
	if base.at != s.First {
		span = h.now.Sub(base.at)
	}
	if span < countSpan || drops < countSamples {
		return 0, kernel, false
	}
	return float64(drops) / span.Seconds(), kernel, true
}

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
// userspace limiter's counters now, so that Stats counts every drop the
// socket did.
func (e *Enforcer) Account(st decide.Stats) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.countShed(st)
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

// Stats returns what the pre-filter does.
func (e *Enforcer) Stats() Stats {
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
func (s Stats) Dropped() uint64 {
	var n uint64
	for _, v := range s.InvalidDropped {
		n += v
	}
	for _, v := range s.StreamDropped {
		n += v
	}
	return n + s.NegotiationDropped + s.ShedDropped
}

// RulesOf turns the streams the userspace limiter drops into rules,
// largest first. A stream's arrival rate is what the limiter sees of it
// now (rate) corrected for what the kernel drops: observed/(1-peff), where
// peff(k) is rule k's drop probability averaged as the limiter's decayed
// count averages (0 for a new rule). Its probability p = 1 -
// Headroom*limit/rate leaves the limiter Headroom times the stream's limit
// (DropFor). Left out: dry runs, invalid streams (the stateless part drops
// what it can of them), streams of the whole socket (prefix length 0: the
// fair total chooses whom to drop, which a uniform probability cannot; see
// FairRulesOf), unlimited nodes, and probabilities under MinDrop.
func RulesOf(c decide.Config, p *sketch.Params, streams []decide.Stream, rate RateFunc, h History) []Rule {
	var rules []Rule
	seen := map[ruleKey]bool{}
	for i := range streams {
		s := &streams[i]
		r, idx, ok := baseRule(c, p, s)
		if !ok || seen[r.key()] {
			continue
		}
		thresh := p.Thresh[s.Class][idx]
		if thresh == sketch.ThreshUnlimited || thresh == 0 || r.Bits == 0 {
			continue
		}
		seen[r.key()] = true
		observed := float64(rate(s))
		if observed == 0 {
			continue
		}
		r.rate = arrivalOf(p, r.key(), s, observed, float64(thresh), h)
		if r.Drop = DropFor(r.rate, float64(thresh)); r.Drop == 0 {
			continue
		}
		r.arrival = p.PPS(uint64(r.rate))
		rules = append(rules, r)
	}
	sortRules(rules)
	return rules
}

// arrivalOf is the arrival rate of stream s (key k), as a count per
// window, the larger of two estimates that each fall short in their own
// way. One is what the limiter sees of it (observed, its decayed count)
// over 1-peff, the share the kernel leaves of it: while a flood is young
// the decayed count still rises (it is about rate*age for an age under
// the window), and it falls short for several windows. The other counts:
// the drops the limiter counted since the last update (History.Counted),
// plus what it passes, at most pass (a count per window; 0 when unknown),
// over the share the kernel left meanwhile, exact when the counts are; it
// knows nothing of a stream too little dropped.
func arrivalOf(p *sketch.Params, k ruleKey, s *decide.Stream, observed, pass float64, h History) float64 {
	rate := observed / (1 - h.Peff(k))
	pps, kernel, ok := h.Counted(k, s)
	if !ok {
		return rate
	}
	perWindow := pps*float64(p.WindowNanos)/1e9*(1<<sketch.FracBits) + pass
	return max(rate, perWindow/(1-kernel))
}

// sortRules puts the largest streams first.
func sortRules(rules []Rule) {
	slices.SortStableFunc(rules, func(a, b Rule) int { return cmp.Compare(b.rate, a.rate) })
}

// baseRule is the rule of stream s without its probability, and the index
// of its node; false for a stream that cannot have one: a dry run's, an
// invalid one, of another family or of a node the configuration lacks.
func baseRule(c decide.Config, p *sketch.Params, s *decide.Stream) (Rule, int, bool) {
	if s.DryRun || s.Class >= quicclass.LimiterClasses || s.Level < 0 {
		return Rule{}, 0, false
	}
	if s.Key.Family != sketch.IPv4 && s.Key.Family != sketch.IPv6 {
		return Rule{}, 0, false
	}
	idx := slices.Index(p.Nodes, s.Node)
	if idx < 0 {
		return Rule{}, 0, false
	}
	bits := p.PrefixLen(s.Key.Family, s.Node.Prefix())
	r := Rule{Family: s.Key.Family, Bits: bits, Form: AnyForm, class: s.Class}
	for w := range r.Words {
		r.Words[w] = s.Key.Words[w] & prefixMask(bits, w)
	}
	if s.Key.Family == sketch.IPv4 {
		r.Words = [4]uint32{s.Key.Words[0] & prefixMask(bits, 0)}
	}
	if !s.Node.SrcPortAny() {
		r.SrcPort, r.MatchSrcPort = s.Key.SrcPort, true
	}
	if p.PerDstPort && !s.Node.DstPortAny() {
		r.DstPort, r.MatchDstPort = s.Key.DstPort, true
	}
	if c.Classify {
		r.Form = ShortForm
		if s.Class == quicclass.Opening {
			r.Form = LongForm
		}
	}
	return r, idx, true
}

// FairRulesOf turns the networks the fair total drops packets of
// (userspace.Limiter.FairStreams: streams of p.FairSource, the node below
// the total that counts networks) into rules. The total shares its limit
// thr among networks max-min fairly: each keeps min(rate, share), and at
// least the proportional floor thr/total of its rate. The kernel leaves
// each Headroom times the larger of its floor and an equal split of thr
// among the networks dropped, so a network under either never loses a
// packet in the kernel, and the userspace limiter still picks among the
// rest. Rates are corrected for the kernel's drops as in RulesOf, and so
// is the total (rate at the total node): what the limiter sees of it plus
// what the kernel dropped of the networks.
func FairRulesOf(c decide.Config, p *sketch.Params, fair []decide.Stream, rate RateFunc, h History) []Rule {
	if p.FairNode < 0 || p.FairSource < 0 {
		return nil
	}
	type network struct {
		r               Rule
		observed, total float64
		thr             float64
		group           [2]int // class and family
	}
	var nets []network
	seen := map[ruleKey]bool{}
	dropped := map[[2]int]float64{}
	counted := map[[2]int]int{}
	for i := range fair {
		s := &fair[i]
		if s.Node != p.Nodes[p.FairSource] {
			continue
		}
		r, _, ok := baseRule(c, p, s)
		if !ok || r.Bits == 0 || seen[r.key()] {
			continue
		}
		thr := p.Thresh[s.Class][p.FairNode]
		if thr == sketch.ThreshUnlimited || thr == 0 {
			continue
		}
		seen[r.key()] = true
		observed := float64(rate(s))
		total := decide.Stream{Class: s.Class, Node: p.Nodes[p.FairNode], Key: s.Key}
		n := network{r: r, observed: observed, total: float64(rate(&total)), thr: float64(thr),
			group: [2]int{int(s.Class), int(s.Key.Family)}}
		if observed == 0 || n.total == 0 {
			continue
		}
		n.r.rate = arrivalOf(p, r.key(), s, observed, 0, h)
		dropped[n.group] += n.r.rate - observed
		counted[n.group]++
		nets = append(nets, n)
	}
	var rules []Rule
	for _, n := range nets {
		total := n.total + dropped[n.group]
		limit := max(n.thr*n.r.rate/total, n.thr/float64(counted[n.group]))
		if n.r.Drop = DropFor(n.r.rate, limit); n.r.Drop == 0 {
			continue
		}
		n.r.arrival = p.PPS(uint64(n.r.rate))
		rules = append(rules, n.r)
	}
	sortRules(rules)
	return rules
}

// mergeRules adds to rules those of more whose streams have no rule yet,
// largest first.
func mergeRules(rules, more []Rule) []Rule {
	seen := map[ruleKey]bool{}
	for i := range rules {
		seen[rules[i].key()] = true
	}
	for _, r := range more {
		if !seen[r.key()] {
			rules = append(rules, r)
		}
	}
	sortRules(rules)
	return rules
}
