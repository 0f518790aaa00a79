// node.h: one lattice node's part in a packet's decision: the node's
// hashes and cells, counting the packet there, its limit, and the verdict
// it leaves. Go twin: internal/decide/sketch/node.go (nodeWork,
// Limiter.nodeHashes, Limiter.nodeCells, Limiter.countNode, forwardNode,
// forwardOne, Params.enforcing, setVerdict).
#ifndef RAKELIMIT_NODE_H
#define RAKELIMIT_NODE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cells.h"
#include "contract.h"
#include "fixed.h"
#include "hash.h"
#include "lattice.h"
#include "maps.h"
#include "parse.h"

// node_work (sketch nodeWork) is what visit_nodes and visit_node share about
// one packet and one node. It lives in a per-CPU map value (node_scratch), not
// on the stack: the verifier tracks no value it loads from a map, so each
// pass through the node loop starts from the same state, where values kept
// on the stack would make it walk the loop once for every combination they
// can take, past its limit.
struct node_work {
	// Set by visit_nodes for the packet: the time, the slot's threshold scale
	// and packet weight, the epoch, the dither, the coin of the
	// proportional floor and the class.
	__u64 now;
	__u64 g;
	__u32 epoch;
	__u32 slot;
	__u32 w;
	__u32 dither;
	__u32 coin;
	__u32 class;
	// Set by visit_nodes for the node.
	__u32 node;
	__u32 pad1; // keeps ah 8-byte aligned without implicit padding
	// Set by visit_node: the budget, the node's rows, the address hashes
	// of prefix slot hashed - 1 (0: none yet) and the node's hashes.
	__u32 budget;
	__u32 lines;
	__u32 base;
	__u32 hashed;
	__u64 ah[DEPTH];
	__u64 hash[DEPTH];
	// Set by count_node: the offered and forwarded minima over the rows.
	__u32 omin;
	__u32 fmin;
	// Set by judge_node: the network's estimate (carried from the
	// network node to the total) and the node's estimate of the stream.
	__u32 network;
	__u32 pad2;
	__u64 estimate;
	// Kept from packet to packet, unlike the rest: by class, where the
	// screen runs (sketch Limiter.screening), SCREEN_FAIR set at the fair
	// total by note_screen, SCREEN_REFLECT by note_reflect. decide reads
	// it from the line it has just written instead of looking the shares
	// up for every packet. Zero in a new map: the screen starts off.
	__u8 screening[NUM_CLASSES];
	__u8 pad3[8 - NUM_CLASSES];
};

// The node loop's node_work, one per CPU (see struct node_work).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct node_work);
	__uint(max_entries, 1);
} node_scratch SEC(".maps");

// limiter_class bounds a limiter class index for the verifier, which cannot
// tell that it is below NUM_CLASSES already (NUM_CLASSES is not a power of
// two, so a mask will not do). Verifier workaround: the barrier makes clang
// keep the bounded value, not the one it read. Left alone, clang spills the
// value read before the comparison and overwrites the spill only where the
// value is too large; the verifier of Linux 6.1 does not carry the
// comparison's bound to that stack slot (6.12's does), so the reload
// indexes cfg->lines unbounded ("R4 unbounded memory access", in
// screen_reflect's node_hashes).
static __always_inline __u32 limiter_class(__u32 c)
{
	if (c >= NUM_CLASSES)
		c = NUM_CLASSES - 1;
	barrier_var(c);
	return c;
}

// node_hashes (sketch Limiter.nodeHashes) sets in nw the hashes of the
// packet's key for node i, whose descriptor n the caller has read (a store
// to nw between the two reads would make clang load it again), and where
// the node's rows lie. The address part is hashed once per prefix slot and
// kept in nw.
static __always_inline void node_hashes(const struct config *cfg, const struct key *k, struct node_work *nw, __u32 i,
					__u8 n)
{
	int p = node_prefix(n) & (MAX_PREFIXES - 1);
	if (p + 1 != nw->hashed) {
		addr_hashes(cfg, k, p, nw->ah);
		nw->hashed = p + 1;
	}
	__u64 pw = port_word(cfg, n, k);
#pragma unroll
	for (int r = 0; r < DEPTH; r++)
		nw->hash[r] = nw->ah[r] + cfg->hash_a[r][PORT_WORD] * pw + cfg->hash_b[r];
	__u32 class = limiter_class(nw->class);
	nw->lines = cfg->lines[class][i & (MAX_NODES - 1)];
	nw->base = cfg->base[class][i & (MAX_NODES - 1)];
}

// node_cells (sketch Limiter.nodeCells) finds the node's cell in each row, by the
// hashes visit_node computed. Returns -1 when a cell cannot be reached.
static __always_inline int node_cells(const struct node_work *nw, struct cell *cl[DEPTH])
{
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		__u64 t = (mix(nw->hash[r]) >> 32) * nw->lines;
		__u32 idx = nw->base + r * nw->lines + (__u32)(t >> 32);
		__u32 c = ((t & LOW32) * CELLS_PER_LINE) >> 32;
		struct line *ln = bpf_map_lookup_elem(&cells, &idx);
		if (!ln)
			return -1;
		// c is below 3 by construction; the verifier cannot tell
		// through the multiplication that made it.
		if (c >= CELLS_PER_LINE)
			c = CELLS_PER_LINE - 1;
		cl[r] = &ln->cells[c];
	}
	return 0;
}

// count_node (sketch countNode) counts the packet at one node: in each row,
// the cell its hash selects is brought to this epoch and its offered count of
// the packet's budget grows by the packet's weight; rows gets the counters.
// Returns the number of rows (DEPTH), or -1 when a cell cannot be reached.
static __always_inline int count_node(const struct config *cfg, struct node_work *nw, struct counter *rows[DEPTH])
{
	struct cell *cl[DEPTH];
	__u32 epochs[DEPTH];

	if (node_cells(nw, cl) < 0)
		return -1;
	// Read both rows' epochs first: the two reads, independent, miss the
	// cache together when the source is new.
#pragma unroll
	for (int r = 0; r < DEPTH; r++)
		epochs[r] = cl[r]->epoch;
	// nw's fields in locals: a store to a cell might, for all the compiler
	// knows, write nw too, and would make it load them again.
	__u32 epoch = nw->epoch, budget = nw->budget & 1, w = nw->w;
	__u32 omin = U32_MAX, fmin = U32_MAX;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		if (epochs[r] != epoch)
			rescale(cl[r], cfg, epoch);
		struct counter *ctr = &cl[r]->budget[budget];
		ctr->offered = sat_add(ctr->offered, w);
		omin = min32(omin, ctr->offered);
		fmin = min32(fmin, ctr->forwarded);
		rows[r] = ctr;
	}
	nw->omin = omin;
	nw->fmin = fmin;
	return DEPTH;
}

// forward_node (sketch forwardNode) counts a forwarded packet in the
// counters count_node found (forward_one: in one counter). Over the limit the forwarded
// count decides, so no increment may be lost to another CPU: atomic adds it
// atomically (a CPU's own pending counter needs no atomic add). It stays
// near the threshold then, far from overflowing, so the saturating add would
// give the same sum.
static __always_inline void forward_one(struct counter *c, __u32 w, int atomic)
{
	if (atomic)
		__sync_fetch_and_add(&c->forwarded, w);
	else
		c->forwarded = sat_add(c->forwarded, w);
}

static __always_inline void forward_node(struct counter *rows[DEPTH], __u32 w, int atomic)
{
#pragma unroll
	for (int r = 0; r < DEPTH; r++)
		forward_one(rows[r], w, atomic);
}

// enforcing (sketch Params.enforcing): whether node i of class enforces its
// limit, its offered count omin being over its enforcing threshold at
// threshold scale g.
static __always_inline int enforcing(const struct config *cfg, __u32 class, __u32 i, __u32 omin, __u64 g)
{
	return cfg->thresh[class][i] != THRESH_UNLIMITED && omin > scale(cfg->over[class][i], g);
}

// set_verdict (sketch setVerdict) records the node that limits the packet. The
// level is computed from the node, not taken from the node loop's variable:
// the counters are indexed by it, which makes the verifier track its exact
// value, and a loop variable tracked exactly keeps the loop's states apart.
static __always_inline void set_verdict(struct verdict *v, int drop, __u8 n, __u64 estimate)
{
	v->drop = drop;
	v->limited = 1;
	v->level = node_level(n);
	v->node = n;
	v->estimate = estimate;
}

#endif
