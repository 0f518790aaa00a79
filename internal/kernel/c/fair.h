// fair.h: the fair total, which shares the socket's total max-min fairly
// among networks. Go twin: internal/decide/sketch/fair.go (admitFair,
// fairCoin; the package doc's "The fair total").
#ifndef RAKELIMIT_FAIR_H
#define RAKELIMIT_FAIR_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "fixed.h"
#include "node.h"

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

#endif
