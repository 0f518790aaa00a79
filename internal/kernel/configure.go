//go:build linux

package kernel

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// The pacers' slots in the pacer map: the version negotiation cap's
// (decide.Pacing), the tracking pacer's (decide.TrackPacing), the proof
// pacer's (decide.ProofPacing) and the returning part of the opening
// class's fair total's (sketch.Params.Returning).
const (
	pacerNegotiation = 0 // C: PACER_NEGOTIATION
	pacerTracking    = 1 // C: PACER_TRACKING
	pacerProof       = 2 // C: PACER_PROOF
	pacerReturning   = 3 // C: PACER_RETURNING
	numPacers        = 4 // C: NUM_PACERS
)

// Configure replaces the configuration of a live filter, all or nothing,
// with one switch of the configuration slot: the change governs the next
// packet, and the sketches and counters are kept. On an error the filter is
// left as it was. The lattice (prefix count and PerDstPort) cannot change,
// since the sketches are laid out for it.
func (f *Program) Configure(c decide.Config) error {
	p, err := c.Compile()
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.params.SameShape(p) {
		return fmt.Errorf("cannot change the lattice (prefix count or per-destination-port) of a loaded filter: %d nodes to %d",
			len(f.params.Nodes), len(p.Nodes))
	}
	return f.configure(c, p)
}

// configure puts c (compiled to p) in force, or on any error leaves the
// kernel and the Go side as they were: the slot in force, the allowlist and
// what Config and Params report. New allowlist entries go in before the
// switch and old ones out after it, so that a prefix in both lists is never
// limited in between; when a trie cannot hold both lists, its old-only
// entries go first: their sources are then limited a moment early, never
// exempted late.
func (f *Program) configure(c decide.Config, p *sketch.Params) (err error) {
	next := newAllowSet(c.Allow)
	var add, drop []allowEntry
	var total [2]int
	for e := range next {
		if !f.allow[e] {
			add = append(add, e)
		}
	}
	for e := range f.allow {
		if !next[e] {
			drop = append(drop, e)
		}
	}
	for e := range f.allow {
		total[e.family()]++
	}
	for _, e := range add {
		total[e.family()]++
	}
	early := total[0] > decide.MaxAllow || total[1] > decide.MaxAllow
	// The undo log: entries added and removed so far, and whether the
	// switch happened.
	var added, removed []allowEntry
	prevSlot, switched := f.active, false
	defer func() {
		if err == nil {
			return
		}
		var undo []error
		if switched {
			if e := f.objs.ActiveConfig.Update(uint32(0), prevSlot, ebpf.UpdateAny); e != nil {
				undo = append(undo, fmt.Errorf("switching back: %w", e))
			}
		}
		for _, e := range added {
			if uerr := f.allowDelete(e); uerr != nil {
				undo = append(undo, fmt.Errorf("removing a new allowlist entry: %w", uerr))
			}
		}
		for _, e := range removed {
			if uerr := f.allowAdd(e); uerr != nil {
				undo = append(undo, fmt.Errorf("restoring an allowlist entry: %w", uerr))
			}
		}
		if len(undo) > 0 {
			err = fmt.Errorf("%w; undoing it: %w", err, errors.Join(undo...))
		}
	}()
	removeOld := func() error {
		for _, e := range drop {
			if err := f.allowDelete(e); err != nil {
				return fmt.Errorf("removing %v from the allowlist: %w", e.prefix(), err)
			}
			removed = append(removed, e)
		}
		return nil
	}
	if early {
		if err := removeOld(); err != nil {
			return err
		}
	}
	for _, e := range add {
		if err := f.allowAdd(e); err != nil {
			return fmt.Errorf("adding %v to the allowlist: %w", e.prefix(), err)
		}
		added = append(added, e)
	}
	slot := 1 - f.active
	if err := f.objs.Configs.Update(slot, f.compiled(c, p, next), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the filter configuration: %w", err)
	}
	if err := f.objs.ActiveConfig.Update(uint32(0), slot, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("switching the filter configuration: %w", err)
	}
	switched = true
	if !early {
		if err := removeOld(); err != nil {
			return err
		}
	}
	f.active, f.params, f.cfg, f.allow = slot, p, c, next
	return nil
}

// ActiveSlot returns the configuration slot in force (0 or 1), as the
// kernel reads it.
func (f *Program) ActiveSlot() (uint32, error) {
	var slot uint32
	if err := f.objs.ActiveConfig.Lookup(uint32(0), &slot); err != nil {
		return 0, fmt.Errorf("reading the active configuration slot: %w", err)
	}
	return slot, nil
}

// AllowEntries counts the prefixes in the kernel's allowlists.
func (f *Program) AllowEntries() (int, error) {
	n := 0
	var k4 rakelimitAllow4Key
	var k6 rakelimitAllow6Key
	var v uint8
	it := f.objs.Allow4.Iterate()
	for it.Next(&k4, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading the IPv4 allowlist: %w", err)
	}
	it = f.objs.Allow6.Iterate()
	for it.Next(&k6, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading the IPv6 allowlist: %w", err)
	}
	return n, nil
}

// compiled is the kernel's configuration for c, p and the allowlist next.
func (f *Program) compiled(c decide.Config, p *sketch.Params, next allowSet) *rakelimitConfig {
	var k rakelimitConfig
	k.Thresh, k.Over, k.Lines, k.Base = p.Thresh, p.Over, p.Lines, p.Base
	k.G, k.W, k.Ginv = p.G, p.W, p.GInv
	k.D0, k.D1, k.D2 = p.D0, p.D1, p.D2
	k.HashA, k.HashB, k.RankA, k.RankB = f.hk.A, f.hk.B, f.hk.R, f.hk.RB
	k.LearnId, k.LearnAddr = f.hk.LearnID, f.hk.LearnAddr
	k.FamilyWord, k.Mask = p.FamilyWord, p.Mask
	for i, n := range p.Nodes {
		k.Nodes[i] = uint8(n)
	}
	for class, n := range p.Visited {
		k.Visited[class] = uint8(n)
		k.Screen[class] = p.Screen[class]
	}
	k.NumPrefixes = uint8(p.NumPrefixes)
	k.PerDport = boolByte(p.PerDstPort)
	k.FairNode, k.FairSource = nodeIndex(p.FairNode), nodeIndex(p.FairSource)
	k.TotalNode = nodeIndex(p.TotalNode)
	k.ReflectNode = nodeIndex(p.Reflect)
	k.Classify = boolByte(c.Classify)
	k.VerifyIds = boolByte(c.VerifyIDs)
	if c.BlockedPorts != nil {
		k.BlockedPorts = *c.BlockedPorts
	}
	pacing := decide.NewPacing(c.Negotiation)
	k.VnInterval, k.VnTau = pacing.Interval, pacing.Tau
	tick := coarseTick()
	k.CoarseClock = boolByte(coarseClockFits(tick, p.WindowNanos))
	k.TickNs = tick
	k.DryRun = boolByte(c.DryRun)
	k.AllowAny = boolByte(len(next) > 0)
	k.AllowFilter, k.AllowAlways = allowFilter(c.Allow)
	k.TrackMask = 1<<f.trackShift - 1
	track := decide.TrackPacing()
	k.TrackInterval, k.TrackTau = track.Interval, track.Tau
	proof := decide.ProofPacing()
	k.ProofInterval, k.ProofTau = proof.Interval, proof.Tau
	k.ReturningInterval, k.ReturningTau = p.Returning.Interval, p.Returning.Tau
	k.ReturningExempt, k.ReturningLine = p.ReturningExempt, p.ReturningLine
	return &k
}

// coarseTicks is how many ticks of the kernel's coarse clock a window must
// last for the filter to read that clock, once per tick and CPU, rather than
// the precise one, which costs more than the rest of a drop: a packet's time
// is then off by at most 1/coarseTicks of the window.
const coarseTicks = 100

// coarseClockFits reports whether a window of windowNanos lasts the
// coarseTicks ticks of tick ns (0: unknown) that the coarse clock needs.
func coarseClockFits(tick, windowNanos uint64) bool {
	return tick > 0 && tick*coarseTicks <= windowNanos
}

// coarseTick is the timer tick's length in ns (1 to 10 ms), the resolution
// of the kernel's coarse clock, or 0 when the kernel does not say.
func coarseTick() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil || ts.Nano() <= 0 {
		return 0
	}
	return uint64(ts.Nano())
}

// nodeIndex is a node index as the C program takes it: 0xff for none.
func nodeIndex(i int) uint8 {
	if i < 0 {
		return 0xff
	}
	return uint8(i)
}

// Config returns the configuration in force.
func (f *Program) Config() decide.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg
}

// Params returns the configuration in force.
func (f *Program) Params() *sketch.Params {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.params
}
