package sketch

// The screen, which drops before the walk a clean packet that the
// reflection node or the fair total will drop: the twin of
// internal/kernel/c/screen.h.

// ScreenHeadroomShift bounds the networks the screen judges alone to those
// whose clean count, with the packet, is at most their limit >>
// ScreenHeadroomShift: half of it.
// The packets the screen drops are not counted at the nodes more specific
// than the network's, so a stream's estimate there falls short by at most
// what the network counted of them; the headroom keeps that shortfall under
// half a limit, so that a network that grows past it is walked again well
// before its specific nodes reach their limits, and they limit it where the
// walk alone would (see "The screen" in the package doc).
const ScreenHeadroomShift = 1 // C: SCREEN_HEADROOM_SHIFT

// noteScreen sets, for a packet at the fair total in budget, whether the
// screen runs at the total for class's next packets (Limiter.screening):
// when this one is clean and the clean share is bounded (note_screen in the
// C program).
func (l *Limiter) noteScreen(class, budget int) {
	l.screening[class] &^= ScreenFair
	if budget == Clean && l.fair[class][Clean] != FairUnbounded {
		l.screening[class] |= ScreenFair
	}
}

// noteReflect sets whether the screen runs at the reflection node for
// class's next packets (Limiter.screening): from a clean packet dropped
// there, by the walk or the screen, until the screen finds one the node
// would not drop (note_reflect in the C program).
func (l *Limiter) noteReflect(class int, on bool) {
	l.screening[class] &^= ScreenReflect
	if on {
		l.screening[class] |= ScreenReflect
	}
}

// screen decides, before the walk, a clean packet that the reflection node
// or the fair total will drop (screen in the C program; see "The screen" in
// the package doc), where Limiter.screening says the screen runs: it asks
// the reflection node (screenReflect), then the fair total (screenFair),
// what the walk would ask them with the same counts, for a packet whose
// network node shows no limited traffic and stays under its headroom, half
// its limit (ScreenHeadroomShift), with it (screenNetwork). A packet one of
// them drops is counted where the walk would have counted it at the
// network's node and that node, and dropped: the nodes the walk visits on
// the way, those more specific than the network's (and, at the fair total,
// the reflection node), do not count it. A packet neither drops is walked
// as before. on is where the screen runs for the packet's class, which
// Decide reads once. It reports whether the packet is dropped; Decide
// starts the walk afresh from nw's hashes and network after it.
func (l *Limiter) screen(k *Key, nw *nodeWork, v *Verdict, on uint8) bool {
	class := nw.class
	if on&ScreenReflect != 0 {
		l.noteReflect(class, false)
		if l.screenReflect(k, nw, v) {
			return true
		}
	}
	return on&ScreenFair != 0 && l.screenFair(k, nw, v)
}

// screenNetwork reads the packet's network node for the screen without
// counting (screen_network in the C program): its cells go to nc, and it
// returns the clean count the walk would find there with the packet, or 0
// when the screen cannot judge the network alone: it holds limited traffic,
// or the count is over its headroom.
func (l *Limiter) screenNetwork(k *Key, nw *nodeWork, nc *[Depth]*Cell) uint32 {
	p, class, ns := l.p, nw.class, l.p.FairSource
	if !applies(p, p.Nodes[ns], k) {
		return 0
	}
	l.nodeHashes(k, nw, ns)
	*nc = l.nodeCells(nw)
	network, _, limited := peekCells(p, nw, nc)
	if limited != 0 || uint64(network) > scale(p.Thresh[class][ns], nw.g)>>ScreenHeadroomShift {
		return 0
	}
	return network
}

// screenReflect asks the reflection node about a packet whose network the
// screen can judge alone (screenNetwork; screen_reflect in the C program):
// it reads the node's clean counts with the packet without counting, and
// drops the packet as judgeNode would there, over the node's enforcing
// threshold and its forwarded count at or over the dithered limit. A
// dropped packet is counted offered at the node, and at the network's node
// offered and forwarded, and keeps the screen on at the node (noteReflect);
// it reports whether the packet is dropped.
func (l *Limiter) screenReflect(k *Key, nw *nodeWork, v *Verdict) bool {
	var nc [Depth]*Cell
	if l.screenNetwork(k, nw, &nc) == 0 {
		return false
	}
	p, class, nr := l.p, nw.class, l.p.Reflect
	if !applies(p, p.Nodes[nr], k) {
		return false
	}
	l.nodeHashes(k, nw, nr)
	rc := l.nodeCells(nw)
	omin, fmin, _ := peekCells(p, nw, &rc)
	thr := p.Thresh[class][nr]
	if uint64(omin) <= scale(thr, nw.g) || !p.enforcing(class, nr, omin, nw.g) ||
		uint64(fmin) < scale(thr-nw.dither, nw.g) {
		return false
	}
	countScreened(p, nw, &nc, true)
	countScreened(p, nw, &rc, false)
	l.noteReflect(class, true)
	setVerdict(v, true, p.Nodes[nr], mulQ32(uint64(omin), p.GInv[nw.slot]))
	return true
}

// screenFair asks the fair total about a packet whose network the screen
// can judge alone (screenNetwork; screen_fair in the C program): it reads
// the total's counts with the packet without counting, and asks admitFair
// what the walk would ask it. A refused packet is counted offered at the
// total and at the network's node offered and forwarded, the share keeps
// what admitFair made of it, and the packet is dropped; for one the total
// admits, by rank or by the floor, the share is put back, and the walk
// finds the same counts and asks the same question. It reports whether the
// packet is dropped.
func (l *Limiter) screenFair(k *Key, nw *nodeWork, v *Verdict) bool {
	p, class, nt := l.p, nw.class, l.p.FairNode
	if !applies(p, p.Nodes[nt], k) {
		return false
	}
	// The pending counts of the total are flushed by the first packet of
	// an epoch, which the walk counts.
	pending := &l.pending[class]
	if pending.Epoch != nw.epoch {
		return false
	}
	var nc [Depth]*Cell
	network := l.screenNetwork(k, nw, &nc)
	if network == 0 {
		return false
	}
	l.nodeHashes(k, nw, nt)
	ctr := &pending.Budget[Clean]
	offered := satAdd(ctr.Offered, nw.w)
	tc := l.nodeCells(nw)
	totalMinima(&tc, Clean, offered, ctr.Forwarded, nw)
	omin, fmin := nw.omin, nw.fmin
	thr := scale(p.Thresh[class][nt], nw.g)
	if uint64(omin) <= thr || !p.enforcing(class, nt, omin, nw.g) || uint64(fmin) < thr {
		return false
	}
	nw.network = network
	share := &l.fair[class][Clean]
	was := *share
	if l.rankRest(share, k, nw, thr) != fairRefuse {
		*share = was
		return false
	}
	countScreened(p, nw, &nc, true)
	ctr.Offered = offered
	setVerdict(v, true, p.Nodes[nt], mulQ32(uint64(omin), p.GInv[nw.slot]))
	return true
}

// peekCells reads a node's cells cl as countNode would find them with the
// packet, without moving them (peek_cells in the C program): the minima over
// the rows of the clean offered count with the packet's weight, of the clean
// forwarded count and of the limited offered count, each decayed to the
// packet's epoch.
func peekCells(p *Params, nw *nodeWork, cl *[Depth]*Cell) (offered, forwarded, limited uint32) {
	offered, forwarded, limited = maxU32, maxU32, maxU32
	for _, c := range cl {
		d := idleFactor(p, c.Epoch, nw.epoch)
		offered = min(offered, satAdd(uint32(mulQ32(uint64(c.Budget[Clean].Offered), d)), nw.w))
		forwarded = min(forwarded, uint32(mulQ32(uint64(c.Budget[Clean].Forwarded), d)))
		limited = min(limited, uint32(mulQ32(uint64(c.Budget[Limited].Offered), d)))
	}
	return offered, forwarded, limited
}

// countScreened counts a clean packet the screen drops in a node's cells cl
// as the walk counts it there (count_screened in the C program): offered,
// and forwarded too at a node it passes (its network's).
func countScreened(p *Params, nw *nodeWork, cl *[Depth]*Cell, forwarded bool) {
	for _, c := range cl {
		refresh(p, c, nw.epoch)
		c.Budget[Clean].Offered = satAdd(c.Budget[Clean].Offered, nw.w)
		if forwarded {
			forwardOne(&c.Budget[Clean], nw.w)
		}
	}
}
