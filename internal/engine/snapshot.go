package engine

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace/prefilter"
)

// The report names the families of the counters in their order.
var _ [decide.Families]string = report.Families

// ReportStreams is how many limited streams a report lists, the fastest
// first.
const ReportStreams = 20

// Report reads the limiter into one snapshot: its mode, listeners and
// configuration in force (defaults filled in), its counters, the streams it
// limits now, the opening total, verification, attach errors and, in
// userspace mode, the kernel pre-filter. On an error reading the engine it
// returns what it read before, with the error.
func (l *Limiter) Report() (report.Limiter, error) {
	put, listeners := l.Snapshot()
	set := put.Config
	c := set.Limiter.WithDefaults()
	eng := l.Engine()
	r := report.Limiter{
		Name:           l.Name(),
		Mode:           eng.Mode(),
		Listeners:      listeners,
		Config:         report.ConfigOf(set),
		Counters:       map[string]report.Counters{},
		LimitedStreams: []report.Stream{},
		AttachErrors:   l.AttachErrors(),
	}
	learned := l.Learned()
	r.Verification = report.Verification{On: set.VerifyIDs && !l.VerificationOff(), ServerIDs: learned.IDs,
		Peers: learned.Peers, OddIDs: learned.OddIDs, Credits: learned.Grants, Held: map[string]int{}}
	for i, s := range eng.Learned().Sets() {
		r.Verification.Held[report.LearnedSets[i]] = s.Len()
	}
	r.OpeningTotal, r.EstablishedTotal = reportTotal(l.OpeningTotal()), reportTotal(l.EstablishedTotal())
	if pf, ok := eng.(Prefiltered); ok {
		r.Prefilter = prefilterReport(set, pf.Prefilter())
	}
	if x, ok := eng.(xdpReporter); ok {
		r.XDP = x.XDPInterfaces()
		if err := x.XDPTableError(); err != nil {
			r.XDPTableError = err.Error()
		}
	}
	st, err := eng.Stats()
	if err != nil {
		return r, fmt.Errorf("reading the counters: %w", err)
	}
	r.Verification.Proofs, r.Verification.UnpacedAttempts = st.Proofs, st.UnpacedAttempts
	for fam := range decide.Families {
		r.Counters[report.Families[fam]] = countersReport(set, st, fam, c.Levels())
	}
	streams, err := eng.Streams()
	if err != nil {
		return r, fmt.Errorf("reading the limited streams: %w", err)
	}
	r.LimitedStreamsTotal = len(streams)
	if r.UntrackedDrops, err = eng.Untracked(); err != nil {
		return r, fmt.Errorf("reading the untracked drops: %w", err)
	}
	sort.Slice(streams, func(i, j int) bool { return streams[i].Estimate > streams[j].Estimate })
	for _, s := range streams[:min(len(streams), ReportStreams)] {
		name, rate := l.Describe(s)
		rs := report.Stream{Stream: name, Class: ClassName(set, s.Class), Level: s.Level, RatePPS: rate,
			Since: s.First, LastDrop: s.Last, Dropped: s.Drops, DryRun: s.DryRun}
		if s.Class == quicclass.Invalid {
			rs.Reason, rs.Level = s.Reason.String(), -1
		} else {
			rs.LimitPPS = set.LevelLimit(int(s.Class), s.Level)
		}
		r.LimitedStreams = append(r.LimitedStreams, rs)
	}
	return r, nil
}

// countersReport is the report of one family's counters, of a
// configuration with levels levels.
func countersReport(set decide.Config, st decide.Stats, fam, levels int) report.Counters {
	rc := report.Counters{Classes: map[string]report.ClassCounters{}, Allowlisted: st.Allowed[fam],
		Negotiation: map[string]uint64{"passed": st.Negotiation[fam][0], "dropped": st.Negotiation[fam][1],
			"dry_run": st.Negotiation[fam][2]},
		Invalid: map[string]uint64{}, InvalidDryRun: map[string]uint64{}, Verified: map[string]uint64{}}
	for _, class := range LimiterClasses {
		cc := report.ClassCounters{Passed: st.Unlimited(int(class), fam),
			Limited: map[string]uint64{}, Dropped: map[string]uint64{}, DryRun: map[string]uint64{}}
		for lvl := range levels {
			k := strconv.Itoa(lvl)
			cc.Limited[k], cc.Dropped[k], cc.DryRun[k] = st.Limited[class][fam][lvl], st.Dropped[class][fam][lvl],
				st.WouldDrop[class][fam][lvl]
		}
		rc.Classes[ClassName(set, class)] = cc
	}
	for r := quicclass.Reason(1); r < quicclass.NumReasons; r++ {
		rc.Invalid[r.String()], rc.InvalidDryRun[r.String()] = st.Invalid[0][fam][r], st.Invalid[1][fam][r]
	}
	for how := quicclass.Verification(1); how < quicclass.NumVerifications; how++ {
		rc.Verified[how.String()] = st.Verified[fam][how]
	}
	return rc
}

// prefilterReport is the report of a userspace limiter's kernel pre-filter.
func prefilterReport(set decide.Config, ps prefilter.Status) *report.Prefilter {
	rp := &report.Prefilter{Sockets: ps.Sockets, Instructions: ps.Instructions, Streams: ps.Rules, Invalid: ps.Stateless,
		InvalidDroppedEstimated: map[string]uint64{}, StreamDroppedEstimated: map[string]uint64{},
		NegotiationDroppedEstimated: ps.NegotiationDropped, Negotiation: ps.Negotiation,
		ShedDroppedEstimated: ps.ShedDropped, Shed: ps.Shed,
		Updates: ps.Updates, AttachErrors: ps.AttachErrors}
	for _, r := range prefilter.Stateless {
		rp.InvalidDroppedEstimated[r.String()] = ps.InvalidDropped[r]
	}
	for _, class := range LimiterClasses {
		rp.StreamDroppedEstimated[ClassName(set, class)] = ps.StreamDropped[class]
	}
	return rp
}

// reportTotal is a class's total as the report gives it.
func reportTotal(t Total) report.Total {
	return report.Total{Adaptive: t.Adaptive, CapPPS: t.Cap, QueueFill: t.Last.Fill, QueueDrops: t.Last.Overflows,
		PassedPPS: t.Last.PassedPPS}
}
