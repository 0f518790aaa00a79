// fair.h: the fair total, which shares the socket's total max-min fairly
// among networks, and the returning part of it. Go twin:
// internal/decide/sketch/fair.go (admitFair, fairCoin, Limiter.admitTotal,
// Limiter.rankRest, lessPart; the package doc's "The fair total").
#ifndef RAKELIMIT_FAIR_H
#define RAKELIMIT_FAIR_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cells.h"
#include "contract.h"
#include "fixed.h"
#include "hash.h"
#include "maps.h"
#include "node.h"
#include "pace.h"
#include "parse.h"

// One, as the fair total's fractions (Q16) hold it.
#define FAIR_ONE (1ULL << 16)
// The coin of the proportional floor: FAIR_COIN_BITS bits of the packet's
// random number from bit FAIR_COIN_SHIFT, under the dither (the top
// FRAC_BITS) and above the bits that sample drops (track_mask).
#define FAIR_COIN_MASK ((1U << FAIR_COIN_BITS) - 1)

// admit_fair (sketch admitFair) decides a packet at the fair total and moves
// the share: FAIR_RANK when the share admits its source, FAIR_FLOOR when the
// proportional floor admits the packet, FAIR_REFUSE to drop it. nw carries the
// total's offered and forwarded counts, the network's estimate and the
// packet's coin (as arguments they would pass the five a BPF function takes).
// A global function: verified once, and only reached by packets of a flood
// over the total's limit.
__noinline int admit_fair(__u64 *share, const struct node_work *nw, __u32 rank, __u64 thr)
{
	if (!share || !nw || nw->omin == 0 || nw->network == 0)
		return FAIR_RANK;
	__u64 network = nw->network, forwarded = nw->fmin;
	__u64 want = (__u64)rank * network;
	__u64 s = *share;
	__u64 bar = s;
	__u64 f = (thr << 16) / nw->omin;
	__u64 floor = f;
	__u64 slack = thr >> FAIR_SLACK;
	if (forwarded > thr && slack > 0) {
		__u64 k = ((thr + slack - min64(forwarded, thr + slack)) << 16) / slack;
		bar = (bar * k) >> 16;
		floor = (floor * k) >> 16;
	}
	__u64 step = (s >> FAIR_STEP) + 1;
	if (want <= s << 16)
		*share = s - ((step * (FAIR_ONE - f)) >> 16);
	else
		*share = min64(s + ((step * f) >> 16) + 1, FAIR_UNBOUNDED);
	if (want <= bar << 16)
		return FAIR_RANK;
	// Refused, so bar < network << 16: the products stay under 2^64.
	__u64 fl = floor * network;
	if (fl > bar && (__u64)nw->coin * ((network << 16) - bar) < (fl - bar) << 16)
		return FAIR_FLOOR;
	return FAIR_REFUSE;
}

// less_part (sketch lessPart): n less the returning part's count r, at
// least 1: the part passed at most what the total counted.
static __always_inline __u32 less_part(__u32 n, __u32 r)
{
	return n > r ? n - r : 1;
}

// returning_cell: the cell that counts what the returning part of the
// total passed (config.returning_line), or NULL.
static __always_inline struct cell *returning_cell(const struct config *cfg)
{
	__u32 idx = cfg->returning_line;
	struct line *ln = bpf_map_lookup_elem(&cells, &idx);

	return ln ? &ln->cells[0] : NULL;
}

// returning_count: what the returning part of the total passed, the
// forwarded count of its cell decayed to epoch. A subprogram of its own,
// called from the node loop and from the screen, and only by packets of a
// flood over the total's limit: the program's size is charged to each
// socket's option memory.
static __noinline __u32 returning_count(const struct config *cfg, __u32 epoch)
{
	struct cell *c = returning_cell(cfg);

	return c ? mulq32(c->budget[BUDGET_CLEAN].forwarded, idle_factor(cfg, c->epoch, epoch)) : 0;
}

// rank_rest (sketch Limiter.rankRest) ranks by admit_fair a packet over
// the fair total's limit t that the returning part does not pass, against
// what the part leaves: the total's offered and forwarded counts in nw and
// its limit, less what the part passed. nw's counts are changed in place:
// no caller reads them after (the Go twin ranks a copy).
static __always_inline int rank_rest(const struct config *cfg, __u64 *share, const struct key *k, struct node_work *nw,
				     __u64 t)
{
	__u32 r = returning_count(cfg, nw->epoch);

	nw->omin = less_part(nw->omin, r);
	nw->fmin = less_part(nw->fmin, r);
	return admit_fair(share, nw, rank(cfg, k, nw->now >> PERIOD_SHIFT), less_part(min64(t, U32_MAX), r));
}

// admit_total (sketch Limiter.admitTotal) decides a packet over the fair
// total's limit t, in nw's counts, at the end of the walk: a returning
// user's packet while the returning part of the total has room passes, and
// is counted in the part's cell; any other is ranked (rank_rest). Inlined
// in the node loop: as a subprogram of its own, its frame took the chain of
// the program's, the node loop's and admit_fair's past the 512 bytes that
// the verifier of Linux 6.1 allows (it rounds each frame up to 32 bytes).
static __always_inline int admit_total(const struct config *cfg, __u64 *share, const struct key *k, struct node_work *nw,
				       __u64 t)
{
	if (k->returning && gcra(PACER_RETURNING, cfg->returning_interval, cfg->returning_tau, nw->now)) {
		struct cell *c = returning_cell(cfg);
		if (c) {
			rescale(c, cfg, nw->epoch);
			// Every CPU's returning packets count here: no increment
			// lost.
			forward_one(&c->budget[BUDGET_CLEAN], nw->w, 1);
		}
		return FAIR_RANK;
	}
	return rank_rest(cfg, share, k, nw, t);
}

#endif
