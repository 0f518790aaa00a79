package sketch

// One lattice node's part in a packet's decision: the node's hashes and
// cells, counting the packet there, its limit, and the verdict it leaves.
// The twin of internal/kernel/c/node.h.

// nodeWork is what Decide and visitNode share about one packet and one
// node: struct node_work in the C program, field for field (the C keeps it
// to give the verifier a node loop without state of its own; here it keeps
// the two programs alike).
type nodeWork struct {
	// Set by Decide for the packet: the time, the slot's threshold scale
	// and packet weight, the epoch, the dither, the coin of the
	// proportional floor and the class.
	now    uint64
	g      uint64
	epoch  uint32
	slot   uint64
	w      uint32
	dither uint32
	coin   uint32
	class  int
	// Set by Decide for the node: its index in Params.Nodes.
	node int
	// Set by visitNode: the budget, the node's rows, the address hashes
	// of prefix slot hashed - 1 (0: none yet) and the node's hashes.
	budget int
	lines  uint32
	base   uint32
	hashed int
	ah     [Depth]uint64
	hash   [Depth]uint64
	// Set by countNode: the offered and forwarded minima over the rows.
	omin uint32
	fmin uint32
	// Set by judgeNode: the network's estimate (carried from the network
	// node to the total) and the node's estimate of the stream.
	network  uint32
	estimate uint64
}

// nodeHashes sets in nw the hashes of the packet's key for node i, and where
// the node's rows lie (node_hashes in the C program). The address part is
// hashed once per prefix slot and kept in nw.
func (l *Limiter) nodeHashes(k *Key, nw *nodeWork, i int) {
	p := l.p
	n := p.Nodes[i]
	if s := n.Prefix(); s+1 != nw.hashed {
		l.hk.addrHashes(p, k, s, &nw.ah)
		nw.hashed = s + 1
	}
	pw := portWord(n, k, p.PerDstPort)
	for r := range Depth {
		nw.hash[r] = l.hk.nodeHash(r, nw.ah[r], pw)
	}
	nw.lines = p.Lines[nw.class][i]
	nw.base = p.Base[nw.class][i]
}

// cell returns the cell of row r of a node's sketch, whose rows of lines
// lines each start at line base, for the row's full hash h (see nodeHash).
func (l *Limiter) cell(base, lines uint32, r int, h uint64) *Cell {
	line, slot := column(h, lines)
	return &l.lines[base+uint32(r)*lines+uint32(line)].Cells[slot]
}

// nodeCells returns the node's cell in each row, by the hashes nodeHashes
// set in nw (node_cells in the C program).
func (l *Limiter) nodeCells(nw *nodeWork) (cl [Depth]*Cell) {
	for r := range Depth {
		cl[r] = l.cell(nw.base, nw.lines, r, nw.hash[r])
	}
	return cl
}

// countNode counts the packet at one node (count_node in the C program): in
// each row, the cell its hash selects is brought to this epoch and its
// offered count of the packet's budget grows by the packet's weight; rows
// gets the counters, nw the minima over the rows.
func (l *Limiter) countNode(nw *nodeWork, rows *[Depth]*Counter) {
	nw.omin, nw.fmin = maxU32, maxU32
	for r := range Depth {
		c := l.cell(nw.base, nw.lines, r, nw.hash[r])
		refresh(l.p, c, nw.epoch)
		ctr := &c.Budget[nw.budget]
		ctr.Offered = satAdd(ctr.Offered, nw.w)
		nw.omin = min(nw.omin, ctr.Offered)
		nw.fmin = min(nw.fmin, ctr.Forwarded)
		rows[r] = ctr
	}
}

// forwardNode counts a forwarded packet in the counters countNode found
// (forward_node in the C program, which adds atomically over the limit).
func forwardNode(rows *[Depth]*Counter, w uint32) {
	for _, ctr := range rows {
		forwardOne(ctr, w)
	}
}

// forwardOne counts a forwarded packet in one counter (forward_one in the C
// program).
func forwardOne(ctr *Counter, w uint32) {
	ctr.Forwarded = satAdd(ctr.Forwarded, w)
}

// enforcing reports whether node i of class enforces its limit, its offered
// count omin being over its enforcing threshold at threshold scale g.
func (p *Params) enforcing(class, i int, omin uint32, g uint64) bool {
	return p.Thresh[class][i] != ThreshUnlimited && uint64(omin) > scale(p.Over[class][i], g)
}

// setVerdict records in v the node n that limits the packet (set_verdict in
// the C program): the node that drops it or, for a packet that passes, the
// most specific node over its limit.
func setVerdict(v *Verdict, drop bool, n Node, estimate uint64) {
	*v = Verdict{Drop: drop, Limited: true, Level: n.Level(), Node: n, Estimate: estimate}
}
