// learned.h: the server's connection IDs and peers the filter learned,
// looked up to verify a datagram. Go twins: internal/decide/learned.go
// (peerKey, IDStamp, ServerID.Word; the sets themselves), and
// internal/kernel/learned.go, which writes the kernel's sets (server_ids,
// peers, quick) and their hashes (idHash, peerHash).
#ifndef RAKELIMIT_LEARNED_H
#define RAKELIMIT_LEARNED_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"
#include "parse.h"

// A connection ID the server issued, as on the wire.
struct server_id {
	__u8 b[SERVER_ID_LEN];
};

// server_id_of: the first SERVER_ID_LEN bytes of the destination connection
// ID, in the probe where the check says the header has it (constant offsets:
// a variable offset into the stack is one more thing for the verifier to
// bound).
static __always_inline void server_id_of(const struct key *k, int check, struct server_id *id)
{
	if (check == CHECK_SHORT)
		__builtin_memcpy(id->b, &k->probe[SHORT_ID_OFFSET], SERVER_ID_LEN);
	else
		__builtin_memcpy(id->b, &k->probe[LONG_ID_OFFSET], SERVER_ID_LEN);
}

// maybe_in consults learned set which's quick-reject filter for a member's
// hash h: 0 means h is certainly not a member's, and the set's hash map,
// whose buckets a new source's lookup finds in no cache, is not looked up.
static __always_inline int maybe_in(__u32 which, __u64 h)
{
	struct quick *q = bpf_map_lookup_elem(&quick, &which);
	__u32 b = h >> (64 - QUICK_SHIFT);

	if (!q)
		return 1;
	return (q->words[b / 64] >> (b % 64)) & 1;
}

// peer_hash (kernel.peerHash) is a peer's hash for its quick-reject filter.
static __always_inline __u64 peer_hash(const struct config *cfg, const struct peer_key *pk)
{
	__u64 h = 0;

#pragma unroll
	for (int i = 0; i < 4; i++)
		h += cfg->hash_a[0][1 + i] * (__u64)pk->words[i];
	return h;
}

// id_word is a server ID as a big-endian number (decide.ServerID.Word).
static __always_inline __u32 id_word(const struct server_id *id)
{
	return (__u32)id->b[0] << 24 | (__u32)id->b[1] << 16 | (__u32)id->b[2] << 8 | id->b[3];
}

// id_hash (kernel.idHash) is a server ID's hash for its quick-reject filter
// and its set in the table.
static __always_inline __u64 id_hash(const struct config *cfg, __u32 w)
{
	return cfg->hash_a[1][1] * (__u64)w;
}

// id_stamp: decide.IDStamp, a time as a slot of the server IDs' table
// holds it.
static __always_inline __u64 id_stamp(__u64 now)
{
	return (now >> ID_STAMP_SHIFT) & ID_STAMP_MASK;
}

// find_server_id returns the slot of the server ID w, whose hash is h, or
// NULL when the table does not hold it.
static __always_inline __u64 *find_server_id(__u32 w, __u64 h)
{
	__u32 set = h >> (64 - ID_SET_SHIFT);
	struct id_set *s = bpf_map_lookup_elem(&server_ids, &set);
	__u64 tag = (__u64)w << 32 | ID_USED;

	if (!s)
		return NULL;
#pragma unroll
	for (int i = 0; i < ID_WAYS; i++)
		if ((s->slot[i] & ID_TAG_MASK) == tag)
			return &s->slot[i];
	return NULL;
}

// refresh_server_id moves the stamp of the ID in slot on to now's when it is
// behind (decide.Filter.Decide): at most one write per ID and stamp, from
// whichever CPU sees it first. The compare-and-swap leaves alone a slot
// that userspace gave to another ID, or stamped, since it was read.
static __always_inline void refresh_server_id(__u64 *slot, __u64 now)
{
	__u64 e = *slot;
	__u64 st = id_stamp(now);

	if ((e & ID_STAMP_MASK) < st)
		__sync_val_compare_and_swap(slot, e, (e & ID_TAG_MASK) | st);
}

// known_peer: whether the source address is a peer (decide.peerKey).
static __always_inline int known_peer(const struct config *cfg, const struct key *k)
{
	struct peer_key pk = {};

	if (k->family == FAMILY_IPV4) {
		pk.words[2] = IPV4_MAPPED_WORD;
		pk.words[3] = k->words[0];
	} else if (k->family == FAMILY_IPV6) {
#pragma unroll
		for (int i = 0; i < 4; i++)
			pk.words[i] = k->words[i];
	} else {
		return 0;
	}
	if (!maybe_in(QUICK_PEERS, peer_hash(cfg, &pk)))
		return 0;
	return bpf_map_lookup_elem(&peers, &pk) != NULL;
}

#endif
