package prefilter

import (
	"cmp"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// Tuning of the kernel enforcement.
const (
	// Period is how often an Enforcer's owner calls Update.
	Period = 250 * time.Millisecond
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
	// Updates counts programs attached; AttachErrors attaches that failed.
	Updates, AttachErrors uint64
}

// Enforcer keeps the pre-filter of the sockets a userspace limiter reads:
// it compiles the configuration and the streams the limiter drops into a
// program and replaces it on every socket when it changes. It is safe for
// concurrent use.
type Enforcer struct {
	mu    sync.Mutex
	conns []syscall.Conn
	prog  *Program
	// inForce are the drop probabilities of the program's rules.
	inForce map[ruleKey]float64
	// streams are the rules' observed rates, packets per second.
	observed map[ruleKey]float64
	stats    Stats
	last     time.Time
	// invalid is the userspace limiter's count of invalid datagrams at
	// the last update.
	invalid [quicclass.NumReasons]uint64
	carry   [sketch.NumClasses]float64
}

// NewEnforcer returns an Enforcer with no socket.
func NewEnforcer() *Enforcer {
	return &Enforcer{inForce: map[ruleKey]float64{}, observed: map[ruleKey]float64{}}
}

// Attach puts the program in force on conn (the stateless part, until the
// first Update with streams); on an error conn has no pre-filter and the
// userspace limiter alone protects it.
func (e *Enforcer) Attach(conn syscall.Conn, c datagram.Config) error {
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
func specOf(c datagram.Config, rules []Rule) Spec {
	s := Spec{DryRun: c.DryRun, Classify: c.Classify, Allow: c.Allow, Rules: rules, SampleShift: DefaultSampleShift}
	if c.Classify {
		s.BlockedPorts = c.BlockedPorts
	}
	return s
}

// Update compiles c and the streams the userspace limiter tracks (with
// its compiled configuration p and counters st, now) and puts the program
// on every socket if it changed. It returns the first attach error; a
// socket whose update fails keeps its previous program.
func (e *Enforcer) Update(c datagram.Config, p *sketch.Params, streams []datagram.Stream, st datagram.Stats, now time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.estimate(st, now)
	var rules []Rule
	if !c.DryRun {
		rules = RulesOf(c, p, streams, e.inForce)
	}
	prog, err := Build(specOf(c, rules))
	if err != nil {
		return err
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
	clear(e.inForce)
	clear(e.observed)
	for _, r := range rules[:prog.Rules] {
		e.inForce[r.key()] = r.Drop
		e.observed[r.key()] = r.observed
	}
	return first
}

// estimate adds the kernel's drops since the last update to the stats.
func (e *Enforcer) estimate(st datagram.Stats, now time.Time) {
	var invalid [quicclass.NumReasons]uint64
	for fam := range datagram.Families {
		for r := range invalid {
			invalid[r] += st.Invalid[0][fam][r]
		}
	}
	if e.prog != nil && e.prog.Stateless && e.prog.SampleShift > 0 && len(e.conns) > 0 {
		per := uint64(1)<<e.prog.SampleShift - 1
		for _, r := range Stateless {
			if invalid[r] >= e.invalid[r] {
				e.stats.InvalidDropped[r] += (invalid[r] - e.invalid[r]) * per
			}
		}
	}
	e.invalid = invalid
	if !e.last.IsZero() && len(e.conns) > 0 {
		dt := now.Sub(e.last).Seconds()
		for k, pd := range e.inForce {
			class := classOfForm(k.form)
			e.carry[class] += e.observed[k] * dt * pd / (1 - pd)
			whole := uint64(e.carry[class])
			e.stats.StreamDropped[class] += whole
			e.carry[class] -= float64(whole)
		}
	}
	e.last = now
}

// classOfForm is the class a rule's form stands for in the estimates.
func classOfForm(f Form) int {
	if f == ShortForm {
		return int(quicclass.Established)
	}
	return int(quicclass.Opening)
}

// Stats returns what the pre-filter does.
func (e *Enforcer) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Sockets = len(e.conns)
	if e.prog != nil {
		s.Instructions, s.Rules, s.Stateless = e.prog.Len(), e.prog.Rules, e.prog.Stateless
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
	return n
}

// RulesOf turns the streams the userspace limiter drops into rules,
// largest first. A stream's rate is what the limiter sees of it (its
// estimate) corrected for what the kernel already drops (inForce, the
// probabilities in force): rate = observed/(1-p). Its new probability leaves
// it Headroom times its limit. Left out: dry runs, invalid streams (the
// stateless part drops what it can of them), streams of the whole socket
// (prefix length 0: the fair total chooses whom to drop, which a uniform
// probability cannot), unlimited nodes, and probabilities under MinDrop.
func RulesOf(c datagram.Config, p *sketch.Params, streams []datagram.Stream, inForce map[ruleKey]float64) []Rule {
	var rules []Rule
	seen := map[ruleKey]bool{}
	for i := range streams {
		s := &streams[i]
		if s.DryRun || s.Class >= quicclass.LimiterClasses || s.Level < 0 || s.Estimate == 0 {
			continue
		}
		idx := slices.Index(p.Nodes, s.Node)
		if idx < 0 {
			continue
		}
		thresh := p.Thresh[s.Class][idx]
		if thresh == sketch.ThreshUnlimited || thresh == 0 {
			continue
		}
		if s.Key.Family != sketch.IPv4 && s.Key.Family != sketch.IPv6 {
			continue
		}
		bits := p.PrefixLen(s.Key.Family, s.Node.Prefix())
		if bits == 0 {
			continue
		}
		r := Rule{Family: s.Key.Family, Bits: bits, Form: AnyForm}
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
		k := r.key()
		if seen[k] {
			continue
		}
		seen[k] = true
		prev := inForce[k]
		observed := float64(s.Estimate)
		rate := observed / (1 - prev)
		r.Drop = min(1-Headroom*float64(thresh)/rate, MaxDrop)
		if r.Drop < MinDrop {
			continue
		}
		// Quantize, so that noise in the estimate does not replace the
		// program every period.
		r.Drop = float64(int(r.Drop*64)) / 64
		if r.Drop < MinDrop {
			continue
		}
		r.observed = p.PPS(s.Estimate)
		r.rate = rate
		rules = append(rules, r)
	}
	slices.SortStableFunc(rules, func(a, b Rule) int { return cmp.Compare(b.rate, a.rate) })
	return rules
}
