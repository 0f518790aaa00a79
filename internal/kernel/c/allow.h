// allow.h: the allowlist. Go twins: internal/decide/allow.go
// (allowlist.has) and internal/kernel/streams.go, which fills the tries and
// their quick-reject filter (allowFilter, allowBucket): 2^ALLOW_FILTER_SHIFT
// buckets per family, keyed by a multiplicative hash of the address's top
// 16 (IPv4) or 32 (IPv6) bits.
#ifndef RAKELIMIT_ALLOW_H
#define RAKELIMIT_ALLOW_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "contract.h"
#include "maps.h"
#include "parse.h"

// allow_candidate consults the quick-reject filter: 0 means the address is
// certainly not in the allowlist.
static __always_inline int allow_candidate(const struct config *cfg, const struct key *k)
{
	if (k->family == FAMILY_UNKNOWN)
		return 0;
	int fi = k->family == FAMILY_IPV6;
	if (cfg->allow_always[fi])
		return 1;
	__u32 top = fi ? k->words[0] : k->words[0] >> 16;
	__u32 b = (top * ALLOW_HASH_MUL) >> (32 - ALLOW_FILTER_SHIFT);
	return (cfg->allow_filter[fi][b / 64] >> (b % 64)) & 1;
}

// allowlisted looks the source address up in its family's allowlist.
static __always_inline int allowlisted(const struct key *k)
{
	if (k->family == FAMILY_IPV4) {
		struct allow4_key ak = {.prefixlen = 32};

		*(__u32 *)ak.addr = bpf_htonl(k->words[0]);
		return bpf_map_lookup_elem(&allow4, &ak) != NULL;
	}
	if (k->family == FAMILY_IPV6) {
		struct allow6_key ak = {.prefixlen = 128};

#pragma unroll
		for (int i = 0; i < 4; i++)
			*(__u32 *)&ak.addr[4 * i] = bpf_htonl(k->words[i]);
		return bpf_map_lookup_elem(&allow6, &ak) != NULL;
	}
	return 0;
}

#endif
