// fixed.h: fixed-point arithmetic. Go twin: internal/decide/sketch/fixed.go
// (mulQ32, scale, satAdd), whose comment gives the formats and bounds.
#ifndef RAKELIMIT_FIXED_H
#define RAKELIMIT_FIXED_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"

static __always_inline __u64 mulq32(__u64 a, __u64 b)
{
	return (a >> 32) * b + (((a & LOW32) * b) >> 32);
}

// decay32 scales a 32-bit count by a Q32 factor (at most 2^32): mulq32 with a
// high half of zero, in one multiplication, which the product's 64 bits hold.
static __always_inline __u32 decay32(__u32 c, __u64 d)
{
	return ((__u64)c * d) >> 32;
}

// scale: a count scaled by a Q24 slot weight (sketch.scale).
static __always_inline __u64 scale(__u32 c, __u64 g)
{
	return ((__u64)c * g) >> WEIGHT_BITS;
}

static __always_inline __u32 sat_add(__u32 a, __u32 b)
{
	__u32 s = a + b;

	return s < a ? U32_MAX : s;
}

static __always_inline __u32 min32(__u32 a, __u32 b)
{
	return a < b ? a : b;
}

static __always_inline __u64 min64(__u64 a, __u64 b)
{
	return a < b ? a : b;
}

#endif
