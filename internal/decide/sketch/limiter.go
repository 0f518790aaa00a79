package sketch

import (
	"fmt"
	"unsafe"
)

// Budgets within a cell. A packet is clean until it survives a node that is
// over its limit; from the next level on it is counted as limited, against a
// budget of its own.
const (
	Clean   = 0
	Limited = 1
)

// Counter is a pair of exponentially decayed packet counts (FracBits
// fractional bits), each a weighted sum relative to the start of the cell's
// epoch (see Cell).
type Counter struct {
	// Offered counts every packet of the budget that reached the node.
	Offered uint32
	// Forwarded counts the packets the node let through.
	Forwarded uint32
}

// Cell is one count-min cell. Its counters are scaled to the start of epoch
// Epoch (the low 32 bits of the epoch number): the count as of time t is
// counter * GInv[slot(t)] once the cell has been brought to t's epoch. The
// layout matches struct cell in the C program.
type Cell struct {
	Epoch  uint32
	Budget [2]Counter
}

// Line is the unit of a sketch row in memory: three cells in one 64-byte
// cache line, so that no cell straddles two lines.
type Line struct {
	Cells [CellsPerLine]Cell
	_     uint32
}

// Sizes of the sketch memory, shared with the C program.
const (
	// CellBytes is the size of one cell.
	CellBytes = int(unsafe.Sizeof(Cell{}))
	// LineBytes is the size of one line.
	LineBytes = int(unsafe.Sizeof(Line{}))
)

// Verdict is the limiter's decision on one packet.
type Verdict struct {
	// Drop is true when the packet must be dropped.
	Drop bool
	// Limited is true when some node was over its limit: the node that
	// dropped the packet or, for a packet that passed, the most specific
	// node that was over its limit and let it through.
	Limited bool
	// Level and Node name that node; Level is -1 when Limited is false.
	Level int
	Node  Node
	// Estimate is the node's estimated rate for the packet's stream as a
	// decayed count over one window (see Limiter.PPS).
	Estimate uint64
}

// Limiter is the hierarchical fair-share limiter, with one lattice of
// sketches per traffic class. It is deterministic: time and randomness are
// arguments. It is not safe for concurrent use.
type Limiter struct {
	p     *Params
	hk    HashKey
	lines []Line
	// fair is the fair share of the total, by class and budget (see
	// admitFair).
	fair [NumClasses][2]uint64
	// screening says, by class, where the screen runs (see screen), a bit
	// each as in Params.Screen: at the fair total while the last packet
	// there was clean and the clean share bounded (noteScreen), at the
	// reflection node from a clean packet the walk drops there until the
	// screen leaves one to the walk (noteReflect). A flood the walk limits
	// below the total reaches it as limited traffic and turns the fair
	// total's screen off, which would only walk its packets at a cost.
	// node_work.screening in the C program, one per CPU.
	screening [NumClasses]uint8
	// pending is the socket's total's counts not yet added to its cells,
	// by class (see countTotal): the one CPU's pending cells the C
	// program keeps for each CPU.
	pending [NumClasses]Cell
}

// New returns a limiter for c with hash key hk.
func New(c Config, hk HashKey) (*Limiter, error) {
	p, err := Compile(c)
	if err != nil {
		return nil, err
	}
	l := &Limiter{p: p, hk: hk, lines: make([]Line, p.TotalLines)}
	for c := range l.fair {
		l.fair[c] = [2]uint64{FairUnbounded, FairUnbounded}
	}
	return l, nil
}

// Update replaces the configuration and keeps every count. The lattice shape
// (prefix count and PerDstPort) must not change.
func (l *Limiter) Update(c Config) error {
	p, err := Compile(c)
	if err != nil {
		return err
	}
	if !l.p.SameShape(p) {
		return fmt.Errorf("cannot change the lattice (prefix count or per-destination-port) of a live limiter: %d nodes to %d",
			len(l.p.Nodes), len(p.Nodes))
	}
	l.p = p
	return nil
}

// Params returns the compiled configuration.
func (l *Limiter) Params() *Params { return l.p }

// MemoryBytes is the size of the sketches of all classes.
func (l *Limiter) MemoryBytes() int { return len(l.lines) * LineBytes }

// Lines exposes the sketches, class by class, then node by node in
// Params.Nodes order, then row, then line; for tests that compare state with
// the BPF program.
func (l *Limiter) Lines() []Line { return l.lines }

// Pending returns the socket's total's pending counts, by class (see
// countTotal).
func (l *Limiter) Pending() [NumClasses]Cell { return l.pending }

// FairShares returns the fair shares of the total, by class and budget;
// for tests that compare state with the BPF program.
func (l *Limiter) FairShares() [NumClasses][2]uint64 { return l.fair }

// PPS converts an estimate (a decayed count over one window) to packets per
// second.
func (l *Limiter) PPS(estimate uint64) float64 { return l.p.PPS(estimate) }

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

// applies reports whether node n counts packets with key k: a packet without
// ports only reaches port-wildcard nodes, and one without an address only the
// all-sources nodes.
func applies(p *Params, n Node, k *Key) bool {
	if !k.HasPorts && (!n.SrcPortAny() || (p.PerDstPort && !n.DstPortAny())) {
		return false
	}
	return k.Family != Unknown || n.Prefix() == p.NumPrefixes-1
}

// decaying reports whether a cell idle for idle epochs is decayed to the
// reading's epoch: not one read in its own epoch (0), nor one older than
// the cell's (see SkewEpochs); decaying in the C program.
func decaying(idle uint32) bool {
	return idle != 0 && idle <= maxU32-SkewEpochs
}

// refresh brings cell c to epoch e (the low 32 bits of the epoch number),
// decaying its counters by the idle time. A reading slightly older than the
// cell's epoch leaves the cell alone (see SkewEpochs).
func refresh(p *Params, c *Cell, e uint32) {
	idle := e - c.Epoch
	if !decaying(idle) {
		return
	}
	d := p.decay(idle)
	for i := range c.Budget {
		c.Budget[i].Offered = uint32(mulQ32(uint64(c.Budget[i].Offered), d))
		c.Budget[i].Forwarded = uint32(mulQ32(uint64(c.Budget[i].Forwarded), d))
	}
	c.Epoch = e
}

// idleFactor is the factor, Q32, by which refresh would decay a cell last
// moved to epoch last to bring it to epoch e: one (1 << 32) when refresh
// leaves the cell alone (idle_factor in the C program). The screen reads a
// cell through it without moving the cell.
func idleFactor(p *Params, last, e uint32) uint64 {
	if idle := e - last; decaying(idle) {
		return p.decay(idle)
	}
	return 1 << 32
}

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

// The fair total. When the socket's total enforces its limit, a packet
// passes if its source (address and port, ranked anew every period) is
// admitted: rank * network <= share * 2^16, where network is the rate of the
// packet's network (/24, /48) as a count, rank is uniform in [0, 2^32), and
// share is the fair share as a count times 2^16. A network sending r is so
// admitted at min(r, fair share): max-min fairness. Core-stateless fair
// queueing finds the fair share from the accepted rate; here it is found
// from the packets themselves, by stochastic approximation: the share
// should admit the fraction f = thr/total of what arrives (total, the
// total's offered rate, thr its limit), so every admitted packet shrinks it
// by 1/2^FairStep of itself times 1 - f, and every refused one grows it by
// 1/2^FairStep times f; the two balance exactly when the admitted fraction
// is f. Below the limit the share is FairUnbounded. A network under the fair
// share loses nothing, and over it whole sources are refused rather than a
// random share of everyone's packets, so that the handshakes let through
// complete (RFC 9312, section 4.4).
//
// The share sees a network through its estimate, and under a spoofed flood
// (a new random source on every packet) every network's estimate is the
// count of a cell that many networks share: a quiet network's is its own
// rate plus that, higher than a flooding network's, so the share admits it
// less than a proportional drop would. A packet the rank refuses is
// therefore still admitted, with the probability that brings its network up
// to f (the proportional floor, see admitFair), so that no network keeps
// less than f of its packets. A network the share admits at f or more never
// needs the floor.
const FairStep = 8

// FairUnbounded is the fair share that admits every packet.
const FairUnbounded = 1<<48 - 1

// The coin of the proportional floor is FairCoinBits bits of the packet's
// random number, from bit FairCoinShift: under its top FracBits bits (the
// dither) and above the low bits that sample drops for tracking.
const (
	FairCoinBits  = 16
	FairCoinShift = 32 - FracBits - FairCoinBits
)

// fairCoin is the coin of the proportional floor, uniform in
// [0, 2^FairCoinBits), from the packet's random number rnd.
func fairCoin(rnd uint32) uint32 {
	return rnd >> FairCoinShift & (1<<FairCoinBits - 1)
}

// Verdicts of admitFair (FAIR_REFUSE, FAIR_RANK and FAIR_FLOOR in the C
// program).
const (
	fairRefuse = iota // the packet is dropped
	fairRank          // the share admits the packet's source
	fairFloor         // the proportional floor admits the packet
)

// admitFair decides a packet at the fair total and moves the share
// (admit_fair in the C program). The total's offered count nw.omin is over
// its limit thr (scaled to the packet's slot), and so is its forwarded count
// nw.fmin: under it there is room, and judgeNode lets the packet pass without
// asking. rank is the rank of the packet's source, nw.network the estimate
// of its network (not zero) and nw.coin the packet's coin.
//
// The rank admits the packet when rank * network <= bar * 2^16, where bar is
// the share scaled down while the forwarded count is over the limit (see
// FairSlack): its network keeps p = bar / (network * 2^16) of its packets.
// The floor is f = thr/total, scaled alike. When p is under it, a packet the
// rank refuses is admitted with probability (floor - p) / (1 - p), so that
// its network keeps the floor in all: coin * (network*2^16 - bar) <
// (floor*network - bar) * 2^16, with the floor as a fraction times 2^16
// (bar < network*2^16, or the rank would have admitted the packet; every
// product stays under 2^64). The share learns from the rank alone.
func admitFair(share *uint64, nw *nodeWork, rank uint32, thr uint64) int {
	network, total, forwarded := uint64(nw.network), uint64(nw.omin), uint64(nw.fmin)
	want := uint64(rank) * network
	bar := *share
	f := thr << 16 / total
	floor := f
	if slack := thr >> FairSlack; forwarded > thr && slack > 0 {
		k := (thr + slack - min(forwarded, thr+slack)) << 16 / slack
		bar = bar * k >> 16
		floor = floor * k >> 16
	}
	// The share learns from whether it admits the packet, not from what
	// the forwarded count or the floor make of that.
	step := *share>>FairStep + 1
	if want <= *share<<16 {
		*share -= step * (1<<16 - f) >> 16
	} else {
		*share = min(*share+step*f>>16+1, FairUnbounded)
	}
	if want <= bar<<16 {
		return fairRank
	}
	if fl := floor * network; fl > bar && uint64(nw.coin)*(network<<16-bar) < (fl-bar)<<16 {
		return fairFloor
	}
	return fairRefuse
}

// FairSlack bounds the fair total while its share settles: as a flood
// starts, the offered rate is still ramping up and the share admits too
// much. Once the forwarded count is over the limit, the share and the floor
// admit less in proportion, down to nothing at thr + thr/2^FairSlack: twice
// the limit. The forwarded count counts what the share admits, not what the
// floor adds (see judgeFloor): the share holds it at the limit, and so the
// floor is not scaled once the share has settled, however much it adds.
// That scaling cuts every network alike, one under the fair share too, so
// its range is wide: with a range of a quarter of the limit, a network near
// the fair share lost packets in every pulse of a flood that stops and
// starts (scenario quiet-network-pulse, and the end-to-end benchmark's
// pulse).
const FairSlack = 0

// setVerdict records in v the node n that limits the packet (set_verdict in
// the C program): the node that drops it or, for a packet that passes, the
// most specific node over its limit.
func setVerdict(v *Verdict, drop bool, n Node, estimate uint64) {
	*v = Verdict{Drop: drop, Limited: true, Level: n.Level(), Node: n, Estimate: estimate}
}

// Verdicts of judgeNode (JUDGE_PASS, JUDGE_OVER, JUDGE_DROP and
// JUDGE_FLOOR in the C program). A packet the proportional floor admits at
// the fair total passes, over the limit, but is not counted as forwarded
// there: the forwarded count is what the share admits, which the share
// holds at the limit.
const (
	judgePass = iota
	judgeOver
	judgeDrop
	judgeFloor
)

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

// flushPending adds pending counts p, counted from the start of epoch
// p.Epoch, to the shared cell s, decayed first to s's epoch when s has moved
// on since (flush_pending in the C program, where another CPU may have
// moved it; its adds are atomic, and saturate as here but for concurrent
// adds near 2^32).
func flushPending(params *Params, p *Cell, s *Cell) {
	idle := s.Epoch - p.Epoch
	decays := decaying(idle)
	var d uint64
	if decays {
		d = params.decay(idle)
	}
	for b := range s.Budget {
		o, f := p.Budget[b].Offered, p.Budget[b].Forwarded
		if decays {
			o, f = uint32(mulQ32(uint64(o), d)), uint32(mulQ32(uint64(f), d))
		}
		s.Budget[b].Offered = satAdd(s.Budget[b].Offered, o)
		s.Budget[b].Forwarded = satAdd(s.Budget[b].Forwarded, f)
	}
}

// flushTotal moves the pending counts p of the socket's total into its cells
// cl and brings the cells to epoch (flush_total in the C program, where it
// runs once per epoch and CPU).
func flushTotal(params *Params, epoch uint32, cl *[Depth]*Cell, p *Cell) {
	for _, c := range cl {
		flushPending(params, p, c)
		refresh(params, c, epoch)
	}
	// The cells' epoch, not the packet's: a reading older than the cells'
	// epoch leaves them alone (see refresh), and the pending counts are
	// then counted in the cells' epoch too.
	*p = Cell{Epoch: cl[0].Epoch}
}

// totalMinima sets in nw the offered and forwarded minima over the rows of
// the socket's total: its cells cl in budget, plus the pending counts
// offered and forwarded (total_minima in the C program).
func totalMinima(cl *[Depth]*Cell, budget int, offered, forwarded uint32, nw *nodeWork) {
	nw.omin, nw.fmin = maxU32, maxU32
	for r := range Depth {
		sh := &cl[r].Budget[budget]
		nw.omin = min(nw.omin, satAdd(sh.Offered, offered))
		nw.fmin = min(nw.fmin, satAdd(sh.Forwarded, forwarded))
	}
}

// countTotal is countNode for the socket's total (count_total in the C
// program): the one stream that every packet of the class counts. The C
// program counts it on each CPU in a pending cell of that CPU's, so that
// CPUs do not write one cache line on every packet, and moves the pending
// counts into the shared cells when the epoch changes, before the cells
// are brought to the new epoch; the estimate is the shared count plus the
// CPU's own pending. This limiter is the one CPU. On one CPU the counts are
// exactly those of a single cell; on several, what the other CPUs counted
// in the current epoch is missing from a CPU's estimate, at most one epoch
// (1.05 ms) of their packets. It returns the pending counter, where
// forwarded packets are counted too.
func (l *Limiter) countTotal(nw *nodeWork) *Counter {
	cl := l.nodeCells(nw)
	p := &l.pending[nw.class]
	if p.Epoch != nw.epoch {
		flushTotal(l.p, nw.epoch, &cl, p)
	}
	ctr := &p.Budget[nw.budget]
	ctr.Offered = satAdd(ctr.Offered, nw.w)
	totalMinima(&cl, nw.budget, ctr.Offered, ctr.Forwarded, nw)
	return ctr
}

// enforcing reports whether node i of class enforces its limit, its offered
// count omin being over its enforcing threshold at threshold scale g.
func (p *Params) enforcing(class, i int, omin uint32, g uint64) bool {
	return p.Thresh[class][i] != ThreshUnlimited && uint64(omin) > scale(p.Over[class][i], g)
}

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
	// not enforce.
	under := thr == ThreshUnlimited || uint64(omin) <= scale(thr, nw.g)
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
		a := admitFair(&l.fair[class][budget], nw, l.hk.rank(k, nw.now>>PeriodShift), t)
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

// ScreenHeadroomShift bounds the networks the screen judges alone to those
// whose clean count, with the packet, is at most their limit >>
// ScreenHeadroomShift (SCREEN_HEADROOM_SHIFT in the C program): half of it.
// The packets the screen drops are not counted at the nodes more specific
// than the network's, so a stream's estimate there falls short by at most
// what the network counted of them; the headroom keeps that shortfall under
// half a limit, so that a network that grows past it is walked again well
// before its specific nodes reach their limits, and they limit it where the
// walk alone would (see "The screen" in the package doc).
const ScreenHeadroomShift = 1

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
	if admitFair(share, nw, l.hk.rank(k, nw.now>>PeriodShift), thr) != fairRefuse {
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

// Decide counts a packet of class class (0 or 1) with key k arriving at time
// now (nanoseconds on a monotonic clock) and decides its fate; decide in the
// C program. rnd is a uniformly random 32-bit number; its top FracBits bits
// dither the forwarding threshold, and the FairCoinBits under them are the
// coin of the fair total's proportional floor.
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
	if on := p.Screen[class] & l.screening[class]; on != 0 {
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

// Estimate returns node n's current estimate for key k's stream in class
// class and budget budget without counting a packet: the minimum over the
// rows of the decayed offered count.
func (l *Limiter) Estimate(k *Key, class int, n Node, budget int, now int64) uint64 {
	p := l.p
	i := -1
	for j, m := range p.Nodes {
		if m == n {
			i = j
		}
	}
	if i < 0 || !applies(p, n, k) {
		return 0
	}
	t := uint64(now)
	epoch, slot := uint32(t>>EpochShift), (t>>SlotShift)&(Slots-1)
	var ah [Depth]uint64
	l.hk.addrHashes(p, k, n.Prefix(), &ah)
	pw := portWord(n, k, p.PerDstPort)
	est := maxU64
	for r := range Depth {
		h := l.hk.nodeHash(r, ah[r], pw)
		c := *l.cell(p.Base[class][i], p.Lines[class][i], r, h) // a copy: estimating changes nothing
		var pending uint32
		if i == p.TotalNode {
			pc := l.pending[class]
			if pc.Epoch != epoch {
				flushPending(p, &pc, &c)
			} else {
				pending = pc.Budget[budget].Offered
			}
		}
		refresh(p, &c, epoch)
		est = min(est, mulQ32(uint64(satAdd(c.Budget[budget].Offered, pending)), p.GInv[slot]))
	}
	return est
}

// Sweep forgets the cells idle for the decay horizon or longer (about 39 h;
// their counts have decayed to nothing) and moves them to now's epoch, so
// that no cell idles long enough for its 32-bit epoch to wrap. Run it at
// least once a day; the BPF filter's owner does the same to the kernel's
// cells (bpf.Filter.Sweep). It returns the number of cells swept.
func (l *Limiter) Sweep(now int64) int {
	epoch := uint32(uint64(now) >> EpochShift)
	n := 0
	for i := range l.lines {
		for j := range l.lines[i].Cells {
			c := &l.lines[i].Cells[j]
			if Stale(c.Epoch, epoch) {
				*c = Cell{Epoch: epoch}
				n++
			}
		}
	}
	// The total's pending cells (see countTotal), which are not counted:
	// a class without packets for the horizon leaves one stale.
	for c := range l.pending {
		if Stale(l.pending[c].Epoch, epoch) {
			l.pending[c] = Cell{Epoch: epoch}
		}
	}
	return n
}

// Stale reports whether a cell last moved to epoch cell is, at epoch now, idle
// for the decay horizon or longer (and not merely ahead of now by clock skew).
func Stale(cell, now uint32) bool {
	idle := now - cell
	return idle >= decayHorizon && idle <= maxU32-SkewEpochs
}
