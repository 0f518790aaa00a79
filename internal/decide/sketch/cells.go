package sketch

import "unsafe"

// A count-min cell, and its decay: the twin of internal/kernel/c/cells.h
// (struct cell is in internal/kernel/c/maps.h).

// Budgets within a cell. A packet is clean until it survives a node that is
// over its limit; from the next level on it is counted as limited, against a
// budget of its own.
const (
	Clean   = 0 // C: BUDGET_CLEAN
	Limited = 1 // C: BUDGET_LIMITED
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

// decay returns exp(-k epochs / window) as a Q32 fraction.
func (p *Params) decay(k uint32) uint64 {
	if k < DecayEntries {
		return p.D0[k]
	}
	if k >= decayHorizon {
		return 0
	}
	d := mulQ32(p.D0[k&(DecayEntries-1)], p.D1[(k>>decayBits)&(DecayEntries-1)])
	return mulQ32(d, p.D2[k>>(2*decayBits)])
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

// Stale reports whether a cell last moved to epoch cell is, at epoch now, idle
// for the decay horizon or longer (and not merely ahead of now by clock skew).
func Stale(cell, now uint32) bool {
	idle := now - cell
	return idle >= decayHorizon && idle <= maxU32-SkewEpochs
}
