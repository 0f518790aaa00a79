// walk.h: the walk of a packet through the lattice, node by node, with the
// screen before it: the limiter's decision. Go twin:
// internal/decide/sketch/walk.go (Limiter.Decide, visitNode, judgeNode).
#ifndef RAKELIMIT_WALK_H
#define RAKELIMIT_WALK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "fair.h"
#include "fixed.h"
#include "hash.h"
#include "lattice.h"
#include "maps.h"
#include "node.h"
#include "pace.h"
#include "parse.h"
#include "screen.h"
#include "total.h"

// judge_node (sketch judgeNode) compares what count_node found with the node's
// limit: under it the packet passes (JUDGE_PASS); over it, it passes counted
// as limited (JUDGE_OVER) until the node enforces its limit, which lets it
// through only while the forwarded count is under the dithered threshold or,
// at the fair total, when its source is admitted (JUDGE_DROP otherwise) or
// the proportional floor admits the packet (JUDGE_FLOOR).
static __always_inline int judge_node(const struct config *cfg, const struct key *k, struct node_work *nw,
				      const int last)
{
	__u32 i = nw->node & (MAX_NODES - 1);
	__u32 class = limiter_class(nw->class);
	__u32 budget = nw->budget & 1;
	__u32 omin = nw->omin, fmin = nw->fmin;
	if (i == cfg->fair_source)
		nw->network = omin;
	__u32 thr = cfg->thresh[class][i];
	__u32 zero = 0;
	struct fair *fs = last && i == cfg->fair_node ? bpf_map_lookup_elem(&fair_shares, &zero) : NULL;
	// A packet under the limit passes, and needs the enforcing threshold
	// only at the fair total, whose share it resets when the total does
	// not enforce. A returning user's packet passes its network's nodes as
	// if under their limits.
	int under = thr == THRESH_UNLIMITED || omin <= scale(thr, nw->g) ||
		    (k->returning && ((cfg->returning_exempt >> i) & 1));
	int enf = (!under || fs) && enforcing(cfg, class, i, omin, nw->g);
	if (fs) {
		if (!enf && fs->share[class][budget] != FAIR_UNBOUNDED)
			fs->share[class][budget] = FAIR_UNBOUNDED;
		note_screen(fs, nw, class, budget);
	}
	if (under)
		return JUDGE_PASS;
	__u32 slot = nw->slot & (SLOTS - 1);
	nw->estimate = mulq32(omin, cfg->ginv[slot]);
	if (!enf)
		return JUDGE_OVER;
	if (fs && nw->network) {
		// Room under the total's limit: pass, and leave the share as
		// it is (see sketch judgeNode). Only a packet over it is ranked.
		__u64 t = scale(thr, nw->g);
		if (fmin < t)
			return JUDGE_OVER;
		int a = admit_total(cfg, &fs->share[class][budget], k, nw, t);
		note_screen(fs, nw, class, budget);
		if (a == FAIR_RANK)
			return JUDGE_OVER;
		return a == FAIR_FLOOR ? JUDGE_FLOOR : JUDGE_DROP;
	}
	return fmin >= scale(thr - nw->dither, nw->g) ? JUDGE_DROP : JUDGE_OVER;
}

// visit_node (sketch visitNode) walks the packet through node i: it hashes the
// packet's key for the node (the address part once per prefix slot, kept in
// nw), counts it in the budget v says (limited from the level after the first
// node over its limit, which v records), judges it against the node's limit,
// records in v the most specific node over its limit, and counts it forwarded
// unless it is dropped or passes by the proportional floor. Returns 1 to drop,
// 0 to go on, -1 when a cell cannot be reached. last (a constant) says
// whether i may be the last node, the only one that can be the socket's
// total (sketch.Params.TotalNode) or the fair total (FairNode): the copy the
// node loop inlines for the other nodes has neither's code.
static __always_inline int visit_node(const struct config *cfg, const struct key *k, struct node_work *nw, struct verdict *v,
				      const int last)
{
	__u32 i = nw->node & (MAX_NODES - 1);
	__u8 n = cfg->nodes[i];
	nw->budget = v->limited && node_level(n) > v->level ? BUDGET_LIMITED : BUDGET_CLEAN;
	node_hashes(cfg, k, nw, i, n);
	// The socket's total is counted in the CPU's pending counter, the
	// other nodes in a counter of each row.
	struct counter *rows[DEPTH] = {};
	struct counter *pending = NULL;
	int counted = last && i == cfg->total_node ? count_total(cfg, nw, &pending) : count_node(cfg, nw, rows);
	if (counted < 0)
		return -1;
	int j = judge_node(cfg, k, nw, last);
	if (j == JUDGE_DROP) {
		if (i == cfg->reflect_node && nw->budget == BUDGET_CLEAN)
			note_reflect(nw, limiter_class(nw->class), 1);
		set_verdict(v, 1, n, nw->estimate);
		return 1;
	}
	if (j != JUDGE_PASS && !v->limited)
		set_verdict(v, 0, n, nw->estimate);
	if (j != JUDGE_FLOOR)
	{
		// The CPU's own counter: no other CPU adds to it.
		if (pending)
			forward_one(pending, nw->w, 0);
		else
			forward_node(rows, nw->w, j == JUDGE_OVER);
	}
	return 0;
}

// packet_work sets up the CPU's node_work for a packet at time now of the
// class in the high half of rnd_class, whose low half is the packet's random
// number (the start of sketch Limiter.Decide). Only what the node loop and
// the screen read before they write needs a reset, not the whole of
// node_work. Returns NULL when the map cannot be reached.
static __always_inline struct node_work *packet_work(const struct config *cfg, __u64 now, __u64 rnd_class)
{
	__u32 zero = 0;
	struct node_work *nw = bpf_map_lookup_elem(&node_scratch, &zero);
	if (!nw)
		return NULL;
	__u32 rnd = rnd_class;
	__u32 slot = (now >> SLOT_SHIFT) & (SLOTS - 1);
	nw->hashed = 0;
	nw->network = 0;
	nw->now = now;
	nw->g = cfg->g[slot];
	nw->epoch = now >> EPOCH_SHIFT;
	nw->slot = slot;
	nw->w = cfg->w[slot];
	nw->dither = rnd >> (32 - FRAC_BITS);
	nw->coin = (rnd >> FAIR_COIN_SHIFT) & FAIR_COIN_MASK;
	nw->class = rnd_class >> 32;
	return nw;
}

// visit_nodes: sketch Limiter.Decide for the class in the high half of
// rnd_class, whose low half is the packet's random number. Returns 1 to drop,
// 0 to pass, -1 when the sketch cannot be reached; fills v.
//
// A global function, verified once, with every node visit inlined: one call
// per packet rather than one per node, which matters on CPUs that return
// through a return thunk (AMD's SRSO mitigation: about 7 ns a call). The
// nodes but the last share one loop body without the total's code; the
// last node is visited after the loop.
__noinline int visit_nodes(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw)
{
	if (!cfg || !k || !v || !nw)
		return -1;
	__u32 visited = cfg->visited[limiter_class(nw->class)];
	if (visited == 0)
		return 0;

	// visited is at most MAX_NODES; the mask bounds it for the verifier.
	__u32 last = (visited - 1) & (MAX_NODES - 1);
	// A real loop, not unrolled: unrolling makes the program several
	// times larger, and a socket filter's size is charged to the socket's
	// optmem (net.core.optmem_max).
#pragma clang loop unroll(disable)
	for (int i = 0; i < MAX_NODES - 1; i++) {
		if (i >= last)
			break;
		if (!applies(cfg, cfg->nodes[i], k))
			continue;
		nw->node = i;
		int drop = visit_node(cfg, k, nw, v, 0);
		if (drop)
			return drop;
	}
	if (!applies(cfg, cfg->nodes[last], k))
		return 0;
	nw->node = last;
	return visit_node(cfg, k, nw, v, 1);
}

// decide: sketch Limiter.Decide for class `class`: the screen, then
// visit_nodes, on the CPU's node_work for the packet.
static __always_inline int decide(const struct config *cfg, int class, const struct key *k, __u64 now, __u32 rnd,
				  struct verdict *v)
{
	struct node_work *nw = packet_work(cfg, now, (__u64)class << 32 | rnd);
	if (!nw)
		return -1;
	// The screen, only where it runs (note_screen, note_reflect): the call
	// costs even when it walks the packet. A call
	// beside visit_nodes, not in it, for the stack: the two frames would
	// add up over what the verifier allows. One the screen leaves to the
	// walk starts it afresh, as in Limiter.Decide.
	__u32 c = limiter_class(class);
	__u8 on = cfg->screen[c] & nw->screening[c];
	// A returning user's packet is walked: the screen judges a packet by
	// its network alone, which a returning one passes.
	if (on && !k->returning) {
		if (screen(cfg, k, v, nw, on))
			return 1;
		nw->hashed = 0;
		nw->network = 0;
	}
	return visit_nodes(cfg, k, v, nw);
}

#endif
