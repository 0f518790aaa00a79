package sketch

// The socket's total, whose counts the C program keeps on each CPU apart
// and adds to the shared cells once an epoch: the twin of
// internal/kernel/c/total.h.

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
