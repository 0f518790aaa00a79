package sketch

import "fmt"

// The limiter: its state and what reads it. Its state is the C program's
// maps (internal/kernel/c/maps.h): the cells, the fair shares, the pending
// totals and node_work.screening; its decision is Decide (walk.go).

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
	// returningTAT is the theoretical arrival time of the returning part
	// of the opening class's fair total (Params.Returning): the C
	// program's pacer slot PACER_RETURNING.
	returningTAT uint64
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

// ReturningTAT returns the theoretical arrival time of the returning part
// of the opening class's fair total (Params.Returning); for tests that
// compare state with the BPF program.
func (l *Limiter) ReturningTAT() uint64 { return l.returningTAT }

// PPS converts an estimate (a decayed count over one window) to packets per
// second.
func (l *Limiter) PPS(estimate uint64) float64 { return l.p.PPS(estimate) }

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
// cells (kernel.Program.Sweep). It returns the number of cells swept.
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
