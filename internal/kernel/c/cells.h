// cells.h: a count-min cell brought to a packet's epoch, its counts decayed
// by the time it was idle. Go twin: internal/decide/sketch/cells.go
// (Params.decay, decaying, idleFactor, refresh); struct cell is in maps.h.
#ifndef RAKELIMIT_CELLS_H
#define RAKELIMIT_CELLS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "fixed.h"
#include "maps.h"

// A decay table's index: DECAY_BITS of the idle time.
#define DECAY_MASK (DECAY_ENTRIES - 1)
// A cell's 32-bit epoch may be up to SKEW_EPOCHS ahead of a packet's (another
// CPU moved it on): an idle time above SKEW_WRAP is such a packet, not a wrap.
#define SKEW_WRAP (U32_MAX - SKEW_EPOCHS)

static __always_inline __u64 decay(const struct config *cfg, __u32 k)
{
	if (k < DECAY_ENTRIES)
		return cfg->d0[k];
	if (k >= DECAY_HORIZON)
		return 0;
	__u64 d = mulq32(cfg->d0[k & DECAY_MASK], cfg->d1[(k >> DECAY_BITS) & DECAY_MASK]);
	return mulq32(d, cfg->d2[(k >> (2 * DECAY_BITS)) & DECAY_MASK]);
}

// decaying (sketch decaying): whether a cell idle for `idle` epochs is
// decayed to the reading's epoch: not one read in its own epoch (0), nor one
// older than the cell's (over SKEW_WRAP).
static __always_inline int decaying(__u32 idle)
{
	return idle != 0 && idle <= SKEW_WRAP;
}

// idle_factor (sketch idleFactor): the Q32 factor by which rescale would
// decay a cell last moved to epoch `last` to bring it to `epoch`, one
// (Q32_ONE) when rescale leaves the cell alone. The screen reads cells
// through it without moving them.
static __always_inline __u64 idle_factor(const struct config *cfg, __u32 last, __u32 epoch)
{
	__u32 idle = epoch - last;
	return decaying(idle) ? decay(cfg, idle) : Q32_ONE;
}

// rescale (refresh in internal/decide/sketch) brings a cell last touched in an older
// epoch to `epoch`, decaying its counters by the idle time; a reading older
// than the cell's own epoch (SKEW_WRAP) leaves it alone. The hot path, a cell
// already touched in this epoch, does not call it.
//
// Two CPUs may find the same cell stale at once; the compare-and-swap on the
// epoch lets only one of them decay it.
static __always_inline void rescale(struct cell *c, const struct config *cfg, __u32 epoch)
{
	__u32 last = c->epoch;
	__u32 idle = epoch - last;
	if (!decaying(idle) || __sync_val_compare_and_swap(&c->epoch, last, epoch) != last)
		return;
	__u64 d = decay(cfg, idle);
	c->budget[0].offered = decay32(c->budget[0].offered, d);
	c->budget[0].forwarded = decay32(c->budget[0].forwarded, d);
	c->budget[1].offered = decay32(c->budget[1].offered, d);
	c->budget[1].forwarded = decay32(c->budget[1].forwarded, d);
}

#endif
