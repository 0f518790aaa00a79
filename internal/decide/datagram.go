// Package decide decides the fate of one UDP datagram the way the BPF
// program's entry point (decide_datagram in internal/kernel/rakelimit.c,
// for the socket filter and the XDP program) does: the allowlist, the QUIC
// class (package quicclass) verified against what the server taught it
// (the server IDs bound to their addresses, the proven and answered peers
// and their credit, the proof pacer), then the version negotiation cap or
// the class's hierarchical limiter (package sketch), and the counters.
// It is deterministic (time and randomness are arguments) and not safe for
// concurrent use. The BPF tests run packet traces through both and compare
// verdicts, counters and sketch state; the userspace mode runs it on
// datagrams quic-go reads.
package decide

import (
	"net/netip"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Datagram is what the filter reads of a datagram.
type Datagram struct {
	// Key is the source and the ports; Key.HasPorts is false when the UDP
	// header could not be found.
	Key sketch.Key
	// Length is the UDP payload's length in bytes.
	Length int
	// Probe is the start of the payload: at least quicclass.ProbeBytes of
	// it (all of it when shorter). With VerifyIDs the classifier reads an
	// Initial's token and Length fields wherever the header puts them, so
	// pass the whole payload; fields beyond Probe are not checked.
	Probe []byte
}

// Outcome is the decision on one datagram.
type Outcome struct {
	// Drop is true when the datagram is dropped (never in a dry run).
	Drop bool
	// Allowlisted datagrams of the limiter's classes skip the limiter; an
	// allowlisted source's invalid and negotiation datagrams are decided
	// as anyone's.
	Allowlisted bool
	// Class and Reason are the datagram's QUIC class (Opening when not
	// classifying) and, for an invalid one, why.
	Class  quicclass.Class
	Reason quicclass.Reason
	// Verdict is the limiter's, for the Opening and Established classes;
	// Verdict.Drop is the drop a dry run does not apply.
	Verdict sketch.Verdict
	// Paced is false for a negotiation datagram over the cap.
	Paced bool
	// Verified says how the datagram was verified (VerifyIDs).
	Verified quicclass.Verification
}

// Families is the number of families the counters keep apart: 0 counts
// datagrams without a readable network header, 1 IPv4, 2 IPv6.
const Families = 3 // C: FAMILY_SLOTS

// The columns of Stats.Negotiation.
const (
	// NegotiationPassed counts the datagrams the cap let through.
	NegotiationPassed = 0 // C: NEG_PASSED
	// NegotiationDropped counts those over the cap, dropped.
	NegotiationDropped = 1 // C: NEG_DROPPED
	// NegotiationWouldDrop counts those over the cap in a dry run, which
	// delivers them.
	NegotiationWouldDrop = 2 // C: NEG_WOULD_DROP
)

// FamilyIndex returns the counters' index of a family.
func FamilyIndex(f sketch.Family) int {
	switch f {
	case sketch.IPv4:
		return 1
	case sketch.IPv6:
		return 2
	}
	return 0
}

// Stats are the datagram counters, as the BPF filter keeps them per CPU.
type Stats struct {
	// Passed counts datagrams of each limiter class let through, by
	// family; Limited those of them over a limit somewhere, by the level
	// of the most specific such node.
	Passed  [sketch.NumClasses][Families]uint64
	Limited [sketch.NumClasses][Families][sketch.MaxLevels]uint64
	// Dropped counts drops by the level of the node that dropped;
	// WouldDrop the same in a dry run, where they are delivered.
	Dropped   [sketch.NumClasses][Families][sketch.MaxLevels]uint64
	WouldDrop [sketch.NumClasses][Families][sketch.MaxLevels]uint64
	// Negotiation counts datagrams with an unknown version: passed
	// (NegotiationPassed), dropped over the cap (NegotiationDropped), or
	// over it in a dry run (NegotiationWouldDrop).
	Negotiation [Families][3]uint64
	// Invalid counts invalid datagrams by reason: dropped (index 0) or, in
	// a dry run, delivered (1).
	Invalid [2][Families][quicclass.NumReasons]uint64
	// Allowed counts allowlisted datagrams of the limiter's classes.
	Allowed [Families]uint64
	// Verified counts, with VerifyIDs, the datagrams verified by a server
	// ID bound to their source or by a peer address, by how
	// (quicclass.Verification; the NotVerified column stays zero),
	// whatever the limiter then decides: short headers by ID and from a
	// proven peer (the rest of the established class with verification:
	// openings by ID, handshakes from a proven peer), openings from a
	// proven peer, which are in the opening class, and short headers from
	// an answered peer, in the unverified class.
	Verified [Families][quicclass.NumVerifications]uint64
	// Errors counts datagrams passed because the filter could not reach
	// its state (only the BPF program has such errors).
	Errors uint64
	// Proofs counts the addresses that proved themselves (became proven
	// peers) by sending back a server ID bound to them.
	Proofs uint64
	// UnpacedAttempts counts the attempts at a proof (quicclass
	// Header.Attempts) that the proof pacer had no room for: their ID,
	// verified or not, proved nothing (see ProofPacing).
	UnpacedAttempts uint64
}

// Unlimited counts the datagrams of a class and family that passed under
// every limit: those passed less those limited somewhere.
func (s *Stats) Unlimited(class, fam int) uint64 {
	n := s.Passed[class][fam]
	for _, l := range s.Limited[class][fam] {
		n -= l
	}
	return n
}

// Add adds o to s.
func (s *Stats) Add(o *Stats) {
	for c := range sketch.NumClasses {
		for f := range Families {
			s.Passed[c][f] += o.Passed[c][f]
			for l := range sketch.MaxLevels {
				s.Limited[c][f][l] += o.Limited[c][f][l]
				s.Dropped[c][f][l] += o.Dropped[c][f][l]
				s.WouldDrop[c][f][l] += o.WouldDrop[c][f][l]
			}
		}
	}
	for f := range Families {
		for i := range s.Negotiation[f] {
			s.Negotiation[f][i] += o.Negotiation[f][i]
		}
		for d := range s.Invalid {
			for r := range s.Invalid[d][f] {
				s.Invalid[d][f][r] += o.Invalid[d][f][r]
			}
		}
		s.Allowed[f] += o.Allowed[f]
		for v := range s.Verified[f] {
			s.Verified[f][v] += o.Verified[f][v]
		}
	}
	s.Errors += o.Errors
	s.Proofs += o.Proofs
	s.UnpacedAttempts += o.UnpacedAttempts
}

// Filter is the whole decision with its state: the limiter's sketches, the
// negotiation pacer, the learned server IDs and peers, and the counters.
type Filter struct {
	cfg    Config
	pacing Pacing
	lim    *sketch.Limiter
	allow  allowlist
	// tat is the negotiation pacer's theoretical arrival time, proofTAT
	// the proof pacer's (ProofPacing).
	tat, proofTAT uint64
	// hk keys the learned sets' hashes (the limiter keeps its own copy).
	hk      sketch.HashKey
	learned Learned
	stats   Stats
}

// New returns a filter for c with the limiter's hash key hk.
func New(c Config, hk sketch.HashKey) (*Filter, error) {
	if err := c.validateOwn(); err != nil {
		return nil, err
	}
	lim, err := sketch.New(c.Limiter, hk) // validates c.Limiter as it compiles it
	if err != nil {
		return nil, err
	}
	return &Filter{cfg: c, pacing: NewPacing(c.Negotiation), lim: lim, allow: newAllowlist(c.Allow),
		hk: hk, learned: NewLearned()}, nil
}

// Update applies a new configuration and keeps the state; the lattice's
// shape must not change.
func (f *Filter) Update(c Config) error {
	if err := c.validateOwn(); err != nil {
		return err
	}
	if err := f.lim.Update(c.Limiter); err != nil { // validates c.Limiter as it compiles it
		return err
	}
	f.cfg, f.pacing, f.allow = c, NewPacing(c.Negotiation), newAllowlist(c.Allow)
	return nil
}

// Limiter returns the class limiter.
func (f *Filter) Limiter() *sketch.Limiter { return f.lim }

// HashKey returns the filter's hash key.
func (f *Filter) HashKey() sketch.HashKey { return f.hk }

// PacerTAT returns the negotiation pacer's theoretical arrival time; for
// tests that compare state with the BPF program.
func (f *Filter) PacerTAT() uint64 { return f.tat }

// ProofTAT returns the proof pacer's theoretical arrival time; for tests
// that compare state with the BPF program.
func (f *Filter) ProofTAT() uint64 { return f.proofTAT }

// Stats returns the counters.
func (f *Filter) Stats() Stats { return f.stats }

// Decide decides the fate of d at time now (nanoseconds, monotonic) with
// the random number rnd, and counts it.
func (f *Filter) Decide(d *Datagram, now int64, rnd uint32) Outcome {
	fam := FamilyIndex(d.Key.Family)
	out := Outcome{Paced: true}
	dry := 0
	if f.cfg.DryRun {
		dry = 1
	}
	if f.cfg.Classify {
		h := f.inspect(d)
		out.Class, out.Reason = h.Class, h.Reason
		if h.Check != quicclass.CheckNone {
			out.Class, out.Reason, out.Verified = f.verify(&h, &d.Key, now)
		}
	}
	if out.Verified != quicclass.NotVerified {
		f.stats.Verified[fam][out.Verified]++
	}
	switch out.Class {
	case quicclass.Invalid:
		f.stats.Invalid[dry][fam][out.Reason]++
		out.Drop = !f.cfg.DryRun
	case quicclass.Negotiation:
		out.Paced, f.tat = f.pacing.Admit(f.tat, uint64(now))
		switch {
		case out.Paced:
			f.stats.Negotiation[fam][NegotiationPassed]++
		case f.cfg.DryRun:
			f.stats.Negotiation[fam][NegotiationWouldDrop]++
		default:
			f.stats.Negotiation[fam][NegotiationDropped]++
			out.Drop = true
		}
	default:
		// The allowlist exempts from the limits, not from validity: an
		// allowlisted source's invalid and negotiation datagrams were
		// decided above, as anyone's, since a spoofer can send from an
		// allowlisted address.
		if f.allow.has(&d.Key) {
			f.stats.Allowed[fam]++
			out.Allowlisted = true
			return out
		}
		class := int(out.Class)
		k := d.Key
		k.Returning = out.Verified.Returning()
		v := f.lim.Decide(&k, class, now, rnd)
		out.Verdict = v
		lvl := max(v.Level, 0)
		switch {
		case v.Drop && f.cfg.DryRun:
			f.stats.WouldDrop[class][fam][lvl]++
		case v.Drop:
			f.stats.Dropped[class][fam][lvl]++
			out.Drop = true
		default:
			f.stats.Passed[class][fam]++
			if v.Limited {
				f.stats.Limited[class][fam][lvl]++
			}
		}
	}
	return out
}

// inspect is quicclass.Inspect on what the filter read of d; a datagram
// without a readable UDP header is invalid.
func (f *Filter) inspect(d *Datagram) quicclass.Header {
	if !d.Key.HasPorts {
		return quicclass.Header{Class: quicclass.Invalid, Reason: quicclass.Unparsed}
	}
	return quicclass.Inspect(f.cfg.BlockedPorts, d.Key.SrcPort, d.Probe, d.Length, f.cfg.VerifyIDs)
}

// verify looks up what h asks for and resolves h's class (verify in the C
// program). A short header's ID is looked up first, and the source among
// the proven peers and then the answered ones only if the ID does not
// verify it. An attempt at a proof (Header.Attempts) looks the peers up
// first: from an answered peer that is not proven, it pays a token of the
// proof pacer at now before its ID is looked up. A server ID that verifies
// the datagram is refreshed at now, and a paid attempt through it proves
// the source (once: the ID's slot is marked then). A datagram that the
// answered tier decides spends a credit of its source.
func (f *Filter) verify(h *quicclass.Header, k *sketch.Key, now int64) (quicclass.Class, quicclass.Reason, quicclass.Verification) {
	pk, ok := peerKey(k)
	if !ok {
		return h.Resolve(false, false, false, false)
	}
	ha := PeerHash(&f.hk, &pk)
	p, paid := peers{answered: -1}, false
	if h.Attempts() {
		p = f.peers(ha)
		if !p.proven && p.answered >= 0 {
			if paid, f.proofTAT = ProofPacing().Admit(f.proofTAT, uint64(now)); !paid {
				f.stats.UnpacedAttempts++
			}
		}
	}
	if id := f.boundID(h, &pk); id >= 0 {
		st := Stamp(now)
		f.learned.IDs.Refresh(id, f.learned.IDs.Slot(id), st)
		if e := f.learned.IDs.Slot(id); paid && e&SlotMark == 0 && f.prove(&pk, st) {
			f.learned.IDs.Mark(id, e)
			f.stats.Proofs++
		}
		return h.Resolve(true, false, false, false)
	}
	if !h.Attempts() && h.NeedsPeer(false) {
		p = f.peers(ha)
	}
	credited := !p.proven && p.answered >= 0 && f.learned.Credit.Spend(p.answered)
	return h.Resolve(false, p.proven, p.answered >= 0, credited)
}

// boundID returns the slot of h's ID when it is a server ID bound to the
// source pk, else -1.
func (f *Filter) boundID(h *quicclass.Header, pk *PeerKey) int {
	if !h.HasID {
		return -1
	}
	return f.learned.IDs.Find(BoundHash(&f.hk, h.ID, pk))
}

// peers is what the sets of peers hold of a source: whether it is a proven
// peer and, if not, its slot in the answered ones (-1: not one).
type peers struct {
	proven   bool
	answered int
}

// peers looks up the source of peer hash ha (peers_of in the C program).
func (f *Filter) peers(ha uint64) peers {
	if f.learned.Proven.Find(ha) >= 0 {
		return peers{proven: true, answered: -1}
	}
	return peers{answered: f.learned.Answered.Find(ha)}
}

// prove records that the source pk proved its address through a server
// ID bound to it, at stamp st: pk becomes a proven peer. It reports whether
// it is one; Decide then marks the ID's slot, so that later datagrams
// through it skip this, and counts the proof.
func (f *Filter) prove(pk *PeerKey, st uint32) bool {
	return f.learned.Proven.Learn(PeerHash(&f.hk, pk), st)
}

// Learned returns the filter's learned sets.
func (f *Filter) Learned() Learned { return f.learned }

// LearnServerID binds id, a connection ID the server put in a long
// header's source connection ID, to addr, the address it was sent to, at
// time now (nanoseconds, monotonic).
func (f *Filter) LearnServerID(id ServerID, addr netip.Addr, now int64) error {
	return f.learned.LearnServerID(&f.hk, id, addr, now)
}

// LearnPeer records that the server sent a connection's packet to addr at
// time now (see Learned.LearnPeer).
func (f *Filter) LearnPeer(addr netip.Addr, now int64) error {
	return f.learned.LearnPeer(&f.hk, addr, now)
}

// Grant adds credits to addr, an answered peer (see Learned.Grant).
func (f *Filter) Grant(addr netip.Addr, credits int) error {
	return f.learned.Grant(&f.hk, addr, credits)
}

// ExpireLearned forgets the keys of each learned set neither learned nor
// used for lifetime before now, and returns how many of each.
func (f *Filter) ExpireLearned(now, lifetime int64) [NumLearned]int {
	return f.learned.Expire(now, LifetimeStamps(lifetime))
}
