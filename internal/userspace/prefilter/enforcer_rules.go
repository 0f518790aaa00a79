package prefilter

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
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

// RulesOf turns the streams the userspace limiter drops into rules,
// largest first. A stream's arrival rate is what the limiter sees of it
// now (rate) corrected for what the kernel drops: observed/(1-peff), where
// peff(k) is rule k's drop probability averaged as the limiter's decayed
// count averages (0 for a new rule). Its probability p = 1 -
// Headroom*limit/rate leaves the limiter Headroom times the stream's limit
// (DropFor). A rule matches the header forms of its stream's class
// (FormOf). Left out: dry runs, invalid streams (the stateless part drops
// what it can of them), unverified ones (FormOf), streams of the whole
// socket (prefix length 0: the fair total chooses whom to drop, which a
// uniform probability cannot; see FairRulesOf), unlimited nodes, and
// probabilities under MinDrop.
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

// FormOf returns the header forms a rule of the limiter class class at
// lattice node n matches under configuration c, and false for a class and
// node that have no rules.
// Classic BPF cannot verify a connection ID, and only the established
// class's rules may match a packet that verification makes established: a
// spoofer sending junk "from" a network would otherwise take its verified
// clients' packets away in the kernel, where the userspace limiter counts
// them apart from the junk and passes them. So:
//
//   - without classification, AnyForm: every datagram is of the opening
//     class;
//   - the opening class, with verification, OpeningForm: Initial and 0-RTT
//     packets whose destination ID cannot be a server ID, which
//     verification never makes established. Never a Handshake packet nor
//     one addressed to an ID of the server's length, which a server ID
//     bound to its source makes established (a client's handshake under
//     way). The class's Initials to a 4-byte ID that verifies nothing are
//     left to the userspace limiter, as the shed leaves them. Without
//     verification, LongForm: every long header of a known version is the
//     class, and nothing is verified;
//   - the established class, with verification, EstablishedForm (short
//     headers and answering long headers), without, ShortForm: every header
//     the class holds, so that the rule drops its stream's packets at its
//     probability whatever their form (a rule of short headers alone would
//     find a stream of Handshakes undiminished, and raise its probability
//     on the stream's short headers). The established packets it matches
//     are its stream's own, dropped in the share the userspace limiter
//     would drop of them (the rule leaves the stream Headroom times its
//     limit, of which the limiter passes the limit); the others are not
//     established (the unverified class's, invalid Handshakes, Initial and
//     0-RTT packets to a 4-byte ID not bound to their source);
//   - the unverified class, EstablishedForm for a stream of one source
//     address and port (the lattice's most specific node), and none for a
//     wider one: its packets are short headers and Handshakes the program
//     cannot tell from the established class's, and a rule of a network
//     would take the verified packets of its other addresses. A rule of one
//     address and port takes only packets from the flooding stream's own
//     source, whose own verified packets would meet its limits in the
//     userspace limiter too (peers are addresses: a spoofer who sends
//     from a verified client's very address and port is that client's
//     flood). A flood of such junk from one source is so shed in the
//     kernel; from many, the class's small total in userspace holds it.
func FormOf(c decide.Config, class quicclass.Class, n sketch.Node) (Form, bool) {
	switch {
	case !c.Classify:
		return AnyForm, true
	case class == quicclass.Opening && c.VerifyIDs:
		return OpeningForm, true
	case class == quicclass.Opening:
		return LongForm, true
	case class == quicclass.Established && c.VerifyIDs:
		return EstablishedForm, true
	case class == quicclass.Established:
		return ShortForm, true
	case class == quicclass.Unverified && n.Prefix() == 0 && !n.SrcPortAny():
		return EstablishedForm, true
	}
	return AnyForm, false
}

// baseRule is the rule of stream s without its probability, and the index
// of its node; false for a stream that cannot have one: a dry run's, an
// invalid or unverified one (FormOf), of another family or of a node the
// configuration lacks.
func baseRule(c decide.Config, p *sketch.Params, s *decide.Stream) (Rule, int, bool) {
	if s.DryRun || s.Class >= quicclass.LimiterClasses || s.Level < 0 {
		return Rule{}, 0, false
	}
	form, ok := FormOf(c, s.Class, s.Node)
	if !ok {
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
	r := Rule{Family: s.Key.Family, Bits: bits, Form: form, class: s.Class}
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
	return r, idx, true
}

// FairRulesOf turns the networks the fair total drops packets of
// (userspace.Decider.FairStreams: streams of p.FairSource, the node below
// the total that counts networks) into rules. The total shares its limit
// thr among networks max-min fairly: each keeps min(rate, share), and at
// least the proportional floor thr/total of its rate. The kernel leaves
// each Headroom times the larger of its floor and an equal split of thr
// among the networks dropped, so a network under either never loses a
// packet in the kernel, and the userspace limiter still picks among the
// rest. Rates are corrected for the kernel's drops as in RulesOf, and so
// is the total (rate at the total node): what the limiter sees of it plus
// what the kernel dropped of the networks. A rule matches the header forms
// of its network's class (FormOf): the unverified class's networks get
// none.
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
