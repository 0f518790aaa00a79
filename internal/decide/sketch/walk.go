package sketch

// The walk of a packet through the lattice, node by node, with the screen
// before it: the limiter's decision. The twin of internal/kernel/c/walk.h.

// Decide counts a packet of the limiter class class (quicclass.Opening,
// Established or Unverified) with key k arriving at time now (nanoseconds on a
// monotonic clock) and decides its fate; decide in the C program. rnd is a
// uniformly random 32-bit number; its top FracBits bits dither the forwarding
// threshold, and the FairCoinBits under them are the coin of the fair total's
// proportional floor.
//
// Walking the lattice from the most specific level to the most general, each
// node counts the packet in its budget (clean or limited) and compares the
// budget's offered rate with the node's limit. Over the limit, the node
// forwards only while its forwarded count is below the limit: the packet is
// dropped, and not counted further up, or it survives and is counted as
// limited from the next level on. At the socket's total the limit is shared
// max-min fairly among networks, and whole sources rather than random
// packets are dropped (see the package doc). While the total enforces that
// share, a clean packet it refuses is screened: counted at its network's
// node and the total only, and dropped before the walk; so is one that the
// reflection node drops while it drops clean packets (see screen).
func (l *Limiter) Decide(k *Key, class int, now int64, rnd uint32) Verdict {
	p := l.p
	t := uint64(now)
	slot := (t >> SlotShift) & (Slots - 1)
	nw := nodeWork{
		now:    t,
		g:      p.G[slot],
		epoch:  uint32(t >> EpochShift),
		slot:   slot,
		w:      p.W[slot],
		dither: rnd >> (32 - FracBits),
		coin:   fairCoin(rnd),
		class:  class,
	}
	v := Verdict{Level: -1}
	// A returning user's packet is walked: the screen judges a packet by
	// its network alone, which a returning one passes.
	if on := p.Screen[class] & l.screening[class]; on != 0 && !k.Returning {
		if l.screen(k, &nw, &v, on) {
			return v
		}
		nw.hashed, nw.network = 0, 0
	}
	for i, n := range p.Nodes[:p.Visited[class]] {
		if !applies(p, n, k) {
			continue
		}
		nw.node = i
		if l.visitNode(k, &nw, &v) {
			break
		}
	}
	return v
}

// visitNode walks the packet through node nw.node (visit_node in the C
// program): it hashes the packet's key for the node (the address part once
// per prefix slot, kept in nw), counts it in the budget v says (limited from
// the level after the first node over its limit, which v records), judges
// it against the node's limit, records in v the most specific node over its
// limit, and counts it forwarded unless it is dropped or passes by the
// proportional floor. It reports whether the packet is dropped.
func (l *Limiter) visitNode(k *Key, nw *nodeWork, v *Verdict) bool {
	p := l.p
	n := p.Nodes[nw.node]
	nw.budget = Clean
	if v.Limited && n.Level() > v.Level {
		nw.budget = Limited
	}
	l.nodeHashes(k, nw, nw.node)
	// The socket's total is counted in the pending counter, the other
	// nodes in a counter of each row.
	var rows [Depth]*Counter
	var pending *Counter
	if nw.node == p.TotalNode {
		pending = l.countTotal(nw)
	} else {
		l.countNode(nw, &rows)
	}
	j := l.judgeNode(k, nw)
	if j == judgeDrop {
		if nw.node == p.Reflect && nw.budget == Clean {
			l.noteReflect(nw.class, true)
		}
		setVerdict(v, true, n, nw.estimate)
		return true
	}
	if j != judgePass && !v.Limited {
		setVerdict(v, false, n, nw.estimate)
	}
	if j != judgeFloor {
		if pending != nil {
			forwardOne(pending, nw.w)
		} else {
			forwardNode(&rows, nw.w)
		}
	}
	return false
}

// Verdicts of judgeNode. A packet the proportional floor admits at the fair
// total passes, over the limit, but is not counted as forwarded there: the
// forwarded count is what the share admits, which the share holds at the
// limit.
const (
	judgePass  = iota // C: JUDGE_PASS
	judgeOver         // C: JUDGE_OVER
	judgeDrop         // C: JUDGE_DROP
	judgeFloor        // C: JUDGE_FLOOR
)

// judgeNode compares what countNode found with the node's limit (judge_node
// in the C program): under it the packet passes (judgePass); over it, it
// passes counted as limited (judgeOver) until the node enforces its limit,
// which lets it through only while the forwarded count is under the
// dithered threshold or, at the fair total, when its source is admitted
// (judgeDrop otherwise) or the proportional floor admits the packet
// (judgeFloor).
func (l *Limiter) judgeNode(k *Key, nw *nodeWork) int {
	p := l.p
	i, class, budget := nw.node, nw.class, nw.budget
	omin, fmin := nw.omin, nw.fmin
	if i == p.FairSource {
		nw.network = omin
	}
	thr := p.Thresh[class][i]
	fair := i == p.FairNode
	// A packet under the limit passes, and needs the enforcing threshold
	// only at the fair total, whose share it resets when the total does
	// not enforce. A returning user's packet passes its network's nodes
	// as if under their limits.
	under := thr == ThreshUnlimited || uint64(omin) <= scale(thr, nw.g) ||
		k.Returning && p.ReturningExempt>>i&1 != 0
	enforcing := (!under || fair) && p.enforcing(class, i, omin, nw.g)
	if fair {
		if !enforcing && l.fair[class][budget] != FairUnbounded {
			l.fair[class][budget] = FairUnbounded
		}
		l.noteScreen(class, budget)
	}
	if under {
		return judgePass
	}
	nw.estimate = mulQ32(uint64(omin), p.GInv[nw.slot])
	if !enforcing {
		return judgeOver
	}
	if fair && nw.network != 0 {
		// While the total forwards less than its limit there is room:
		// the packet passes, and the share, which is what fills the
		// limit, does not move. The offered rate, smoothed over the
		// window, stays over the limit for a while after a flood stops;
		// learning from the few packets of the quiet that follows would
		// shrink the share to a fraction of them. Only a packet over the
		// limit is ranked.
		t := scale(thr, nw.g)
		if uint64(fmin) < t {
			return judgeOver
		}
		a := l.admitTotal(&l.fair[class][budget], k, nw, t)
		l.noteScreen(class, budget)
		switch a {
		case fairRank:
			return judgeOver
		case fairFloor:
			return judgeFloor
		}
		return judgeDrop
	}
	if uint64(fmin) >= scale(thr-nw.dither, nw.g) {
		return judgeDrop
	}
	return judgeOver
}
