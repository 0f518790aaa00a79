package sketch

import (
	"fmt"
	"unsafe"
)

// Traffic classes within a cell. A packet is clean until it survives a node
// that is over its limit; from the next level on it is limited.
const (
	Clean   = 0
	Limited = 1
)

// Counter is a pair of exponentially decayed packet counts, Q24, each a
// weighted sum relative to the start of the cell's epoch (see Cell).
type Counter struct {
	// Offered counts every packet of the class that reached the node.
	Offered uint64
	// Forwarded counts the packets the node let through.
	Forwarded uint64
}

// Cell is one count-min cell. Its counters are scaled to the start of epoch
// Epoch: the count as of time t is counter * GInv[slot(t)] once the cell has
// been brought to t's epoch. The layout matches struct cell in the C program.
type Cell struct {
	Epoch uint64
	Class [2]Counter
}

// CellBytes is the size of one cell.
const CellBytes = int(unsafe.Sizeof(Cell{}))

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
	// decayed count over one window, Q24 (see Limiter.PPS).
	Estimate uint64
}

// Limiter is the hierarchical fair-share limiter. It is deterministic: time
// and randomness are arguments. It is not safe for concurrent use.
type Limiter struct {
	p     *Params
	hk    HashKey
	cells []Cell
}

// New returns a limiter for c with hash key hk.
func New(c Config, hk HashKey) (*Limiter, error) {
	p, err := Compile(c)
	if err != nil {
		return nil, err
	}
	return &Limiter{p: p, hk: hk, cells: make([]Cell, len(p.Nodes)*Depth*Width)}, nil
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

// MemoryBytes is the size of the sketches.
func (l *Limiter) MemoryBytes() int { return len(l.cells) * CellBytes }

// Cells exposes the sketches, node by node in Params.Nodes order, then row,
// then column; for tests that compare state with the BPF program.
func (l *Limiter) Cells() []Cell { return l.cells }

// PPS converts an estimate (a decayed count over one window, Q24) to packets
// per second.
func (l *Limiter) PPS(estimate uint64) float64 { return l.p.PPS(estimate) }

// cell returns the cell of row r of the sketch of the i-th node for a key
// whose address hash in that row is ah and whose port word is pw.
func (l *Limiter) cell(i, r int, ah, pw uint64) *Cell {
	h := ah + l.hk.A[r][HashWords-1]*pw + l.hk.B[r]
	return &l.cells[(i*Depth+r)*Width+int(column(h))]
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

// refresh brings cell c to epoch e, decaying its counters by the idle time.
func refresh(p *Params, c *Cell, e uint64) {
	if c.Epoch == e {
		return
	}
	d := p.decay(e - c.Epoch) // a clock going backwards wraps to "long idle"
	for i := range c.Class {
		c.Class[i].Offered = mulQ32(c.Class[i].Offered, d)
		c.Class[i].Forwarded = mulQ32(c.Class[i].Forwarded, d)
	}
	c.Epoch = e
}

// Decide counts a packet with key k arriving at time now (nanoseconds on a
// monotonic clock) and decides its fate. rnd is a uniformly random 32-bit
// number; its top 24 bits dither the forwarding threshold.
//
// Walking the lattice from the most specific level to the most general, each
// node counts the packet in its class (clean or limited) and compares the
// class's offered rate with the node's limit. Over the limit, the node
// forwards only while its forwarded count is below the limit: the packet is
// dropped, and not counted further up, or it survives and is counted as
// limited from the next level on.
func (l *Limiter) Decide(k *Key, now int64, rnd uint32) Verdict {
	p := l.p
	t := uint64(now)
	epoch := t >> EpochShift
	slot := (t >> SlotShift) & (Slots - 1)
	g := p.G[slot]
	dither := uint64(rnd >> (32 - FracBits))

	// Nodes come in prefix order: hash each prefix once, when first needed.
	var ah [Depth]uint64
	hashed := -1

	v := Verdict{Level: -1}
	class, pending, level := Clean, false, 0
	for i, n := range p.Nodes {
		if n.Level() != level {
			level = n.Level()
			if pending {
				class = Limited
			}
		}
		if !applies(p, n, k) {
			continue
		}
		if n.Prefix() != hashed {
			hashed = n.Prefix()
			l.hk.addrHashes(p, k, hashed, &ah)
		}
		pw := portWord(n, k, p.PerDstPort)
		var rows [Depth]*Counter
		omin, fmin := maxU64, maxU64
		for r := range Depth {
			c := l.cell(i, r, ah[r], pw)
			refresh(p, c, epoch)
			ctr := &c.Class[class]
			ctr.Offered = satAdd(ctr.Offered, g)
			omin = min(omin, ctr.Offered)
			fmin = min(fmin, ctr.Forwarded)
			rows[r] = ctr
		}
		thr := p.Thresh[i]
		if thr != maxU64 && omin > mulQ24(thr, g) {
			over := Verdict{Limited: true, Level: level, Node: n, Estimate: mulQ32(omin, p.GInv[slot])}
			if omin > mulQ24(p.Over[i], g) && fmin >= mulQ24(thr-dither, g) {
				over.Drop = true
				return over
			}
			if !v.Limited {
				v = over
			}
			pending = true
		}
		for _, ctr := range rows {
			ctr.Forwarded = satAdd(ctr.Forwarded, g)
		}
	}
	return v
}

// Estimate returns node n's current estimate for key k's stream in class
// class without counting a packet: the minimum over the rows of the decayed
// offered count, Q24 per window.
func (l *Limiter) Estimate(k *Key, n Node, class int, now int64) uint64 {
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
	epoch, slot := t>>EpochShift, (t>>SlotShift)&(Slots-1)
	var ah [Depth]uint64
	l.hk.addrHashes(p, k, n.Prefix(), &ah)
	pw := portWord(n, k, p.PerDstPort)
	est := maxU64
	for r := range Depth {
		c := *l.cell(i, r, ah[r], pw) // a copy: estimating changes nothing
		refresh(p, &c, epoch)
		est = min(est, mulQ32(c.Class[class].Offered, p.GInv[slot]))
	}
	return est
}
