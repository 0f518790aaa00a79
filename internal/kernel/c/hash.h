// hash.h: the hashes of a packet's key. Go twin:
// internal/decide/sketch/hash.go (HashKey.addrHashes, portWord, mix,
// HashKey.rank; the keys are config.hash_a, hash_b, rank_a and rank_b).
#ifndef RAKELIMIT_HASH_H
#define RAKELIMIT_HASH_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "lattice.h"
#include "maps.h"
#include "parse.h"

// The hash word of the ports: the last of HASH_WORDS.
#define PORT_WORD (HASH_WORDS - 1)

// addr_hash: the address part of row r's hash for prefix slot s, over the
// first `words` address words (a constant, so that the loop unrolls).
static __always_inline __u64 addr_hash(const struct config *cfg, const struct key *k, int fi, int s, int r,
				       const int words)
{
	__u64 h = cfg->hash_a[r][0] * cfg->family_word[fi][s];

#pragma unroll
	for (int i = 0; i < words; i++)
		h += cfg->hash_a[r][1 + i] * (__u64)(k->words[i] & cfg->mask[fi][s][i]);
	return h;
}

// addr_hashes: the address part of prefix slot s's hash, for every row. The
// tables make a /0 prefix hash neither address nor family, so IPv4 and IPv6
// share the all-sources nodes; a packet of unknown family reaches only those.
static __always_inline void addr_hashes(const struct config *cfg, const struct key *k, int s, __u64 ah[DEPTH])
{
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		if (k->family == FAMILY_IPV6)
			ah[r] = addr_hash(cfg, k, 1, s, r, 4);
		else
			ah[r] = addr_hash(cfg, k, 0, s, r, 1);
	}
}

// mix: sketch.mix, which spreads keys in arithmetic progression.
static __always_inline __u64 mix(__u64 h)
{
	h ^= h >> 32;
	return h * MIX_MUL;
}

// rank: the rank of the packet's source in the current period.
static __always_inline __u32 rank(const struct config *cfg, const struct key *k, __u64 period)
{
	__u64 h = cfg->rank_a[0] * period + cfg->rank_a[PORT_WORD] * (__u64)k->sport + cfg->rank_b;

#pragma unroll
	for (int i = 0; i < 4; i++)
		h += cfg->rank_a[1 + i] * (__u64)k->words[i];
	return mix(h) >> 32;
}

static __always_inline __u64 port_word(const struct config *cfg, __u8 n, const struct key *k)
{
	__u64 w = 0;

	if (!node_sport_any(n))
		w = (__u64)k->sport << 16;
	if (cfg->per_dport && !node_dport_any(n))
		w |= k->dport;
	return w;
}

#endif
