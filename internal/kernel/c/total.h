// total.h: the socket's total, counted on each CPU apart and added to the
// shared cells once an epoch. Go twin: internal/decide/sketch/total.go
// (flushPending, flushTotal, totalMinima, Limiter.countTotal).
#ifndef RAKELIMIT_TOTAL_H
#define RAKELIMIT_TOTAL_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cells.h"
#include "contract.h"
#include "fixed.h"
#include "maps.h"
#include "node.h"

// flush_pending (sketch flushPending) adds a CPU's pending counts p, counted
// from the start of epoch p->epoch, to the shared cell s, decayed first to
// s's epoch when another CPU has moved s on since. CPUs flush into s at
// once, so the adds are atomic; each is bounded by the room s had when
// read, which a concurrent add can overtake only near 2^32 (a count of
// 16 million packets a second over a one-second window).
static __always_inline void flush_pending(const struct config *cfg, const struct cell *p, struct cell *s)
{
	__u32 idle = s->epoch - p->epoch;
	int decays = decaying(idle);
	__u64 d = decays ? decay(cfg, idle) : 0;

#pragma unroll
	for (int b = 0; b < 2; b++) {
		__u32 o = p->budget[b].offered, f = p->budget[b].forwarded;
		if (decays) {
			o = decay32(o, d);
			f = decay32(f, d);
		}
		o = min32(o, U32_MAX - s->budget[b].offered);
		f = min32(f, U32_MAX - s->budget[b].forwarded);
		if (o)
			__sync_fetch_and_add(&s->budget[b].offered, o);
		if (f)
			__sync_fetch_and_add(&s->budget[b].forwarded, f);
	}
}

// flush_total (the flush in sketch countTotal) moves the CPU's pending counts
// p of the socket's total into the shared cells and brings them to the
// packet's epoch, once per epoch and CPU. A global function: verified once,
// and kept out of the code every packet runs. Returns -1 when a cell cannot
// be reached.
__noinline int flush_total(const struct config *cfg, const struct node_work *nw, struct cell *p)
{
	struct cell *cl[DEPTH];

	if (!cfg || !nw || !p || node_cells(nw, cl) < 0)
		return -1;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		flush_pending(cfg, p, cl[r]);
		if (cl[r]->epoch != nw->epoch)
			rescale(cl[r], cfg, nw->epoch);
	}
	// The shared cells' epoch, not the packet's: a reading older than the
	// cells' epoch leaves them alone (see rescale), and the pending counts
	// are then counted in the cells' epoch too.
	__builtin_memset(p->budget, 0, sizeof(p->budget));
	p->epoch = cl[0]->epoch;
	return 0;
}

// total_minima (sketch totalMinima) sets in nw the offered and forwarded
// minima over the rows of the socket's total: its cells cl in budget, plus
// the CPU's pending counts offered and forwarded.
static __always_inline void total_minima(struct cell *cl[DEPTH], __u32 budget, __u32 offered, __u32 forwarded,
					 struct node_work *nw)
{
	nw->omin = U32_MAX;
	nw->fmin = U32_MAX;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		const struct counter *sh = &cl[r]->budget[budget & 1];
		nw->omin = min32(nw->omin, sat_add(sh->offered, offered));
		nw->fmin = min32(nw->fmin, sat_add(sh->forwarded, forwarded));
	}
}

// count_total (sketch countTotal) is count_node for the socket's total: the
// one stream that every packet of the class counts, whose shared cells every
// CPU would otherwise write on every packet, moving their cache line from
// CPU to CPU and losing increments. Each CPU counts in a pending cell of
// its own (the per-CPU map totals) and moves the pending counts into the
// shared cells when the epoch changes, before the shared cells are brought
// to the new epoch (flush_total); the estimate is the shared count plus the
// CPU's own pending. So on one CPU the counts are exactly those of a single
// cell (a saturating add is associative), and on several what the other
// CPUs counted in the current epoch is missing: at most one epoch (1.05 ms)
// of their packets, counted once their next packet arrives. *pending gets
// the pending counter, where forwarded packets are counted too, by this CPU
// alone: no atomic add is needed. Returns 0, or -1 when a cell cannot be
// reached.
static __always_inline int count_total(const struct config *cfg, struct node_work *nw, struct counter **pending)
{
	__u32 zero = 0;
	struct pending *pd = bpf_map_lookup_elem(&totals, &zero);
	struct cell *cl[DEPTH];

	if (!pd)
		return -1;
	struct cell *p = &pd->cell[limiter_class(nw->class)];
	if (p->epoch != nw->epoch && flush_total(cfg, nw, p) < 0)
		return -1;
	if (node_cells(nw, cl) < 0)
		return -1;
	struct counter *ctr = &p->budget[nw->budget & 1];
	ctr->offered = sat_add(ctr->offered, nw->w);
	total_minima(cl, nw->budget, ctr->offered, ctr->forwarded, nw);
	*pending = ctr;
	return 0;
}

#endif
