// lattice.h: a lattice node's descriptor, and which nodes count a packet.
// Go twin: internal/decide/sketch/lattice.go (Node.Prefix, SrcPortAny,
// DstPortAny, Level; applies).
#ifndef RAKELIMIT_LATTICE_H
#define RAKELIMIT_LATTICE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"
#include "parse.h"

static __always_inline int node_prefix(__u8 n)
{
	return n >> 2;
}

static __always_inline int node_sport_any(__u8 n)
{
	return (n >> 1) & 1;
}

static __always_inline int node_dport_any(__u8 n)
{
	return n & 1;
}

static __always_inline int node_level(__u8 n)
{
	return node_prefix(n) + node_sport_any(n) + node_dport_any(n);
}

static __always_inline int applies(const struct config *cfg, __u8 n, const struct key *k)
{
	if (!k->has_ports && (!node_sport_any(n) || (cfg->per_dport && !node_dport_any(n))))
		return 0;
	return k->family != FAMILY_UNKNOWN || node_prefix(n) == cfg->num_prefixes - 1;
}

#endif
