// pace.h: the pacers, a theoretical arrival time each in the map pacer. Go
// twin: internal/decide/sketch/pace.go (Pacing.Admit, and the returning
// part's rate), internal/decide/pace.go (the other pacers' rates).
#ifndef RAKELIMIT_PACE_H
#define RAKELIMIT_PACE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"

// gcra admits an event at now to the pacer in slot which: at most one per
// interval ns with a burst tolerance of tau ns (sketch.Pacing.Admit).
// Returns 1 when it conforms. Two CPUs racing for one slot: the loser's
// compare-and-swap fails and its event is refused.
static __always_inline int gcra(__u32 which, __u64 interval, __u64 tau, __u64 now)
{
	__u64 *tat = bpf_map_lookup_elem(&pacer, &which);

	if (!tat || interval == 0)
		return 0;
	__u64 t = *tat;
	if (t > now + tau)
		return 0;
	__u64 next = (t > now ? t : now) + interval;
	return __sync_val_compare_and_swap(tat, t, next) == t;
}

#endif
