// screen.h: the screen, which drops a clean packet the reflection node or
// the fair total will drop before the walk. Go twin:
// internal/decide/sketch/screen.go (Limiter.noteScreen, noteReflect,
// screen, screenNetwork, screenReflect, screenFair; peekCells,
// countScreened; the package doc's "The screen").
#ifndef RAKELIMIT_SCREEN_H
#define RAKELIMIT_SCREEN_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cells.h"
#include "contract.h"
#include "fair.h"
#include "fixed.h"
#include "hash.h"
#include "lattice.h"
#include "maps.h"
#include "node.h"
#include "parse.h"
#include "total.h"

// note_screen (sketch Limiter.noteScreen) sets, for a packet at the fair
// total in budget, whether the screen runs for class's next packets: when
// this one is clean and the CPU's clean share is bounded.
static __always_inline void note_screen(const struct fair *fs, struct node_work *nw, __u32 class, __u32 budget)
{
	__u8 on = budget == BUDGET_CLEAN && fs->share[class][BUDGET_CLEAN] != FAIR_UNBOUNDED ? SCREEN_FAIR : 0;
	nw->screening[class] = (nw->screening[class] & ~SCREEN_FAIR) | on;
}

// note_reflect (sketch Limiter.noteReflect) sets whether the screen runs at
// the reflection node for class's next packets: from a clean packet dropped
// there, by the walk or the screen, until the screen finds one the node
// would not drop.
static __always_inline void note_reflect(struct node_work *nw, __u32 class, int on)
{
	nw->screening[class] = (nw->screening[class] & ~SCREEN_REFLECT) | (on ? SCREEN_REFLECT : 0);
}

// peek_cells (sketch peekCells) reads a node's cells cl as count_node would
// find them with the packet, without moving them: the minima over the rows
// of the clean offered count with the packet's weight, of the clean
// forwarded count and of the limited offered count, each decayed to the
// packet's epoch.
static __always_inline void peek_cells(const struct config *cfg, const struct node_work *nw, struct cell *cl[DEPTH],
				       __u32 *offered, __u32 *forwarded, __u32 *limited)
{
	__u32 o = U32_MAX, f = U32_MAX, l = U32_MAX;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		__u64 d = idle_factor(cfg, cl[r]->epoch, nw->epoch);
		o = min32(o, sat_add(decay32(cl[r]->budget[BUDGET_CLEAN].offered, d), nw->w));
		f = min32(f, decay32(cl[r]->budget[BUDGET_CLEAN].forwarded, d));
		l = min32(l, decay32(cl[r]->budget[BUDGET_LIMITED].offered, d));
	}
	*offered = o;
	*forwarded = f;
	*limited = l;
}

// count_screened (sketch countScreened) counts a clean packet the screen
// drops in a node's cells cl as the loop counts it there: offered, and
// forwarded too at a node it passes (its network's).
static __always_inline void count_screened(const struct config *cfg, struct node_work *nw, struct cell *cl[DEPTH],
					   int forwarded)
{
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		if (cl[r]->epoch != nw->epoch)
			rescale(cl[r], cfg, nw->epoch);
		struct counter *c = &cl[r]->budget[BUDGET_CLEAN];
		c->offered = sat_add(c->offered, nw->w);
		if (forwarded)
			forward_one(c, nw->w, 0);
	}
}

// screen_network (sketch Limiter.screenNetwork) reads the packet's network
// node for the screen without counting: its cells go to nc, and it returns
// the clean count the loop would find there with the packet, or 0 when the
// screen cannot judge the network alone: it holds limited traffic, or the
// count is over half its limit (SCREEN_HEADROOM_SHIFT).
static __always_inline __u32 screen_network(const struct config *cfg, const struct key *k, struct node_work *nw,
					    struct cell *nc[DEPTH])
{
	__u32 class = limiter_class(nw->class);
	__u32 ns = cfg->fair_source & (MAX_NODES - 1);
	__u8 n = cfg->nodes[ns];
	if (!applies(cfg, n, k))
		return 0;
	node_hashes(cfg, k, nw, ns, n);
	if (node_cells(nw, nc) < 0)
		return 0;
	__u32 network, forwarded, limited;
	peek_cells(cfg, nw, nc, &network, &forwarded, &limited);
	if (limited != 0 || network > scale(cfg->thresh[class][ns], nw->g) >> SCREEN_HEADROOM_SHIFT)
		return 0;
	return network;
}

// screen_reflect (sketch Limiter.screenReflect) asks the reflection node
// about a packet whose network the screen can judge alone (screen_network):
// it reads the node's clean counts with the packet without counting, and
// drops the packet as judge_node would there, over the node's enforcing
// threshold and its forwarded count at or over the dithered limit. A
// dropped packet is counted offered at the node, and at the network's node
// offered and forwarded, and keeps the screen on at the node
// (note_reflect). Returns 1 when it drops the packet. A global function of
// its own, beside screen_fair: one frame holding both would put the
// program's stack over its 512 bytes.
__noinline int screen_reflect(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw)
{
	if (!cfg || !k || !v || !nw)
		return 0;
	struct cell *nc[DEPTH];
	if (screen_network(cfg, k, nw, nc) == 0)
		return 0;
	__u32 class = limiter_class(nw->class);
	__u32 nr = cfg->reflect_node & (MAX_NODES - 1);
	__u8 n = cfg->nodes[nr];
	if (!applies(cfg, n, k))
		return 0;
	struct cell *rc[DEPTH];
	node_hashes(cfg, k, nw, nr, n);
	if (node_cells(nw, rc) < 0)
		return 0;
	__u32 omin, fmin, limited;
	peek_cells(cfg, nw, rc, &omin, &fmin, &limited);
	__u32 thr = cfg->thresh[class][nr];
	if (omin <= scale(thr, nw->g) || !enforcing(cfg, class, nr, omin, nw->g) ||
	    fmin < scale(thr - nw->dither, nw->g))
		return 0;
	count_screened(cfg, nw, nc, 1);
	count_screened(cfg, nw, rc, 0);
	note_reflect(nw, class, 1);
	set_verdict(v, 1, n, mulq32(omin, cfg->ginv[nw->slot & (SLOTS - 1)]));
	return 1;
}

// screen_fair (sketch Limiter.screenFair) asks the fair total about a
// packet whose network the screen can judge alone (screen_network): it
// reads the total's counts with the packet without counting, and asks
// admit_fair what the loop would ask it. A refused packet is counted
// offered at the total and at the network's node offered and forwarded,
// the share keeps what admit_fair made of it, and the packet is dropped;
// for one the total admits, by rank or by the floor, the share is put back,
// and the loop finds the same counts and asks the same question. Returns 1
// when it drops the packet. A global function: verified once.
__noinline int screen_fair(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw)
{
	__u32 zero = 0;

	if (!cfg || !k || !v || !nw)
		return 0;
	__u32 class = limiter_class(nw->class);
	__u32 nt = cfg->fair_node & (MAX_NODES - 1);
	__u8 n = cfg->nodes[nt];
	if (!applies(cfg, n, k))
		return 0;
	struct fair *fs = bpf_map_lookup_elem(&fair_shares, &zero);
	struct pending *pd = bpf_map_lookup_elem(&totals, &zero);
	if (!fs || !pd)
		return 0;
	// The CPU's pending counts of the total are flushed by the first
	// packet of an epoch, which the loop counts.
	struct cell *p = &pd->cell[class];
	if (p->epoch != nw->epoch)
		return 0;
	struct cell *nc[DEPTH];
	__u32 network = screen_network(cfg, k, nw, nc);
	if (network == 0)
		return 0;
	struct cell *tc[DEPTH];
	node_hashes(cfg, k, nw, nt, n);
	if (node_cells(nw, tc) < 0)
		return 0;
	struct counter *ctr = &p->budget[BUDGET_CLEAN];
	__u32 offered = sat_add(ctr->offered, nw->w);
	total_minima(tc, BUDGET_CLEAN, offered, ctr->forwarded, nw);
	__u32 omin = nw->omin, fmin = nw->fmin;
	__u64 thr = scale(cfg->thresh[class][nt], nw->g);
	if (omin <= thr || !enforcing(cfg, class, nt, omin, nw->g) || fmin < thr)
		return 0;
	nw->network = network;
	__u64 *share = &fs->share[class][BUDGET_CLEAN];
	__u64 was = *share;
	if (rank_rest(cfg, share, k, nw, thr) != FAIR_REFUSE) {
		*share = was;
		return 0;
	}
	count_screened(cfg, nw, nc, 1);
	ctr->offered = offered;
	set_verdict(v, 1, n, mulq32(omin, cfg->ginv[nw->slot & (SLOTS - 1)]));
	return 1;
}

// screen (sketch Limiter.screen) decides, before the node loop, a clean
// packet that the reflection node or the fair total will drop, where the
// screen runs for the class (node_work.screening, masked by config.screen):
// it asks the reflection node (screen_reflect), then the fair total
// (screen_fair), what the loop would ask them, for a packet whose network
// node shows no limited traffic and stays under half its limit with it. A
// dropped packet is counted at the network's node and the node that drops
// it, as the loop would have counted it there; a packet neither drops is
// walked as before. on is where the screen runs for the packet's class,
// which decide reads once. Returns 1 when it drops the packet, 0 to walk it.
static __always_inline int screen(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw,
				  __u8 on)
{
	__u32 class = limiter_class(nw->class);
	if (on & SCREEN_REFLECT) {
		note_reflect(nw, class, 0);
		if (screen_reflect(cfg, k, v, nw))
			return 1;
	}
	return (on & SCREEN_FAIR) && screen_fair(cfg, k, v, nw);
}

#endif
