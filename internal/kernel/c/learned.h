// learned.h: what the filter knows of the server, looked up to verify a
// datagram: the server IDs, each bound to the address it was sent to, the
// proven peers, the answered peers and their credits. Go twin:
// internal/decide/learned.go (the sets, their hashes and stamps, the
// credits, which userspace writes with the same code in the Go twin's
// memory or, through package kernel, in these maps, mapped).
#ifndef RAKELIMIT_LEARNED_H
#define RAKELIMIT_LEARNED_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"
#include "parse.h"

// HALF_STAMPS is half the range of stamps: an age at or past it is a stamp
// from the future, written by a clock a moment ahead (decide.halfStamps).
#define HALF_STAMPS (1U << (STAMP_BITS - 1))
// TAG_BITS is the width of a key's tag (decide.TagBits).
#define TAG_BITS (64 - TAG_SHIFT)

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

// id_word is a server ID as a big-endian number (decide.ServerID.Word).
static __always_inline __u32 id_word(const struct server_id *id)
{
	return (__u32)id->b[0] << 24 | (__u32)id->b[1] << 16 | (__u32)id->b[2] << 8 | id->b[3];
}

// known_family: whether the source has an address the learned sets key
// (decide.peerKey's ok).
static __always_inline int known_family(const struct key *k)
{
	return k->family == FAMILY_IPV4 || k->family == FAMILY_IPV6;
}

// addr_words_hash is the sum of the products of a[0..3] and the words of
// the source's peer key (decide.PeerKey): for IPv4 the words of ::ffff:a.b.c.d,
// whose first two are zero. The key is read from struct key, not copied to
// the stack: a copy kept live to the proof took the program's frame, with
// the node loop's, past the verifier's 512 bytes.
static __always_inline __u64 addr_words_hash(const __u64 *a, const struct key *k)
{
	if (k->family == FAMILY_IPV4)
		return a[2] * IPV4_MAPPED_WORD + a[3] * (__u64)k->words[0];
	return a[0] * (__u64)k->words[0] + a[1] * (__u64)k->words[1] + a[2] * (__u64)k->words[2] +
	       a[3] * (__u64)k->words[3];
}

// SET_BITS_MASK keeps the bits of a hash that pick its set.
#define SET_BITS_MASK (~((1ULL << (64 - LEARNED_SET_SHIFT)) - 1))

// bound_hash (decide.BoundHash): the hash of server ID w bound to the
// source of k, its key in server_ids: the set of the address alone, then
// the top bits of the hash of the ID and the address.
static __always_inline __u64 bound_hash(const struct config *cfg, __u32 w, const struct key *k)
{
	__u64 a = addr_words_hash(&cfg->learn_id[1], k) + cfg->learn_id[LEARN_ID_WORDS];
	__u64 h = cfg->learn_id[0] * (__u64)w + a;

	return (a & SET_BITS_MASK) | (h >> LEARNED_SET_SHIFT);
}

// peer_hash (decide.PeerHash): the hash of the source of k, its key in
// the sets of peers.
static __always_inline __u64 peer_hash(const struct config *cfg, const struct key *k)
{
	return addr_words_hash(cfg->learn_addr, k) + cfg->learn_addr[LEARN_ADDR_WORDS];
}

// stamp_of: decide.Stamp, a time as a slot holds it.
static __always_inline __u32 stamp_of(__u64 now)
{
	return (now >> STAMP_SHIFT) & STAMP_MASK;
}

// stamp_age: decide.StampAge, how many stamps st is after slot e's.
static __always_inline __u32 stamp_age(__u32 st, __u64 e)
{
	return (st - (__u32)e) & STAMP_MASK;
}

// slot_key: decide.slotKey, what a slot holding the key of hash h has in
// SLOT_KEY_MASK's bits: its tag, and SLOT_USED.
static __always_inline __u64 slot_key(__u64 h)
{
	return (h << LEARNED_SET_SHIFT >> (64 - TAG_BITS)) << TAG_SHIFT | SLOT_USED;
}

// maybe_in: decide.LearnedSet.MaybeIn, learned set which's quick-reject
// filter for a member's hash h: 0 means no member has h, and the set is
// not read.
static __always_inline int maybe_in(__u32 which, __u64 h)
{
	struct quick *q = bpf_map_lookup_elem(&quick, &which);
	__u32 b = h >> (64 - QUICK_SHIFT);

	if (!q)
		return 1;
	return (q->words[b / 64] >> (b % 64)) & 1;
}

// way_of: decide.LearnedSet.Find after maybe_in, in one set s of a learned
// set: the way that holds key (a slot_key), or -1.
static __always_inline int way_of(const struct learned_set *s, __u64 key)
{
#pragma unroll
	for (int i = 0; i < LEARNED_WAYS; i++)
		if ((s->slot[i] & SLOT_KEY_MASK) == key)
			return i;
	return -1;
}

// find_way: the way of the key of hash h in its set of map (server_ids,
// proven_peers or answered_peers), or -1.
static __always_inline int find_way(void *map, __u64 h)
{
	__u32 set = h >> (64 - LEARNED_SET_SHIFT);
	struct learned_set *s = bpf_map_lookup_elem(map, &set);

	return s ? way_of(s, slot_key(h)) : -1;
}

// find_slot: find_way's slot of the key of hash h in map, or NULL.
static __always_inline __u64 *find_slot(void *map, __u64 h)
{
	__u32 set = h >> (64 - LEARNED_SET_SHIFT);
	struct learned_set *s = bpf_map_lookup_elem(map, &set);

	if (!s)
		return NULL;
	int way = way_of(s, slot_key(h));
	// Bounds the index for the verifier: way is 0 to LEARNED_WAYS - 1.
	return way < 0 ? NULL : &s->slot[way & (LEARNED_WAYS - 1)];
}

// spend_credit: decide.Credit.Spend, one credit of the answered peer of
// hash h in way `way` of its set: 0 when it has none, or when another
// writer changed the counter since it was read (it tries once, as the Go
// twin does).
static __always_inline int spend_credit(__u64 h, int way)
{
	__u32 set = h >> (64 - LEARNED_SET_SHIFT);
	struct credit_set *cs = bpf_map_lookup_elem(&answered_credit, &set);

	if (!cs)
		return 0;
	// Bounds the index for the verifier: way is 0 to LEARNED_WAYS - 1.
	__u32 *c = &cs->credit[way & (LEARNED_WAYS - 1)];
	__u32 v = *c;
	return v != 0 && __sync_val_compare_and_swap(c, v, v - 1) == v;
}

// refresh_slot: decide.LearnedSet.Refresh, the slot's stamp moved on to st
// when it is behind: at most one write per key and stamp, from whichever
// CPU sees it first. The compare-and-swap leaves alone a slot that another
// writer gave to another key, or stamped, since it was read.
static __always_inline void refresh_slot(__u64 *slot, __u32 st)
{
	__u64 e = *slot;
	__u32 age = stamp_age(st, e);

	if (age != 0 && age < HALF_STAMPS)
		__sync_val_compare_and_swap(slot, e, (e & ~(__u64)STAMP_MASK) | st);
}

// set_quick sets the bit of hash h in learned set which's quick-reject
// filter (decide.LearnedSet.setQuick).
static __always_inline void set_quick(__u32 which, __u64 h)
{
	struct quick *q = bpf_map_lookup_elem(&quick, &which);
	__u32 b = h >> (64 - QUICK_SHIFT);

	if (q)
		__sync_fetch_and_or(&q->words[b / 64], 1ULL << (b % 64));
}

// learn_slot: decide.LearnedSet.Learn, the key of hash h put into map at
// stamp st: into its own slot (stamped), else the set's first empty slot,
// else the slot of its stalest key; its bit set in learned set which's
// quick-reject filter. Returns 0 when the set changed under it: it tries
// once, where userspace tries again.
static __always_inline int learn_slot(void *map, __u32 which, __u64 h, __u32 st)
{
	__u32 set = h >> (64 - LEARNED_SET_SHIFT);
	struct learned_set *s = bpf_map_lookup_elem(map, &set);
	__u64 key = slot_key(h);
	__u64 old = 0;
	__u32 old_age = 0;
	int victim = -1;

	if (!s)
		return 0;
#pragma unroll
	for (int i = 0; i < LEARNED_WAYS; i++) {
		__u64 e = s->slot[i];
		__u32 age = stamp_age(st, e);

		if ((e & SLOT_KEY_MASK) == key) {
			if (age != 0 && age < HALF_STAMPS)
				__sync_val_compare_and_swap(&s->slot[i], e, (e & ~(__u64)STAMP_MASK) | st);
			return 1;
		}
		if (!(e & SLOT_USED)) {
			if (victim < 0 || (old & SLOT_USED)) {
				victim = i;
				old = e;
				old_age = 0;
			}
		} else if (age >= HALF_STAMPS) {
			// From the future: the freshest.
		} else if (victim < 0 || ((old & SLOT_USED) && age > old_age)) {
			victim = i;
			old = e;
			old_age = age;
		}
	}
	if (victim < 0) { // every slot's stamp is from the future
		victim = 0;
		old = s->slot[0];
	}
	// Bounds the index for the verifier: victim is 0 to LEARNED_WAYS - 1.
	victim &= LEARNED_WAYS - 1;
	if (__sync_val_compare_and_swap(&s->slot[victim], old, key | st) != old)
		return 0;
	set_quick(which, h);
	return 1;
}

#endif
