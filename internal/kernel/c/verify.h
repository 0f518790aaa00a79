// verify.h: a datagram verified against what the filter learned of the
// server, and the proofs. Go twin: internal/decide/datagram.go
// (Filter.verify, Filter.peers, Filter.prove).
#ifndef RAKELIMIT_VERIFY_H
#define RAKELIMIT_VERIFY_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "learned.h"
#include "maps.h"
#include "pace.h"
#include "parse.h"
#include "quicclass.h"

// What peers_of returns besides a way of the answered peers' set.
#define PEER_NONE (-1)
#define PEER_PROVEN (-2)

// peers_of (decide.Filter.peers): PEER_PROVEN when the source of peer hash
// h is a proven peer, else its way in its set of the answered peers, else
// PEER_NONE. A subprogram of its own, called from two places in verify:
// the program's size is charged to each socket's option memory.
static __noinline int peers_of(__u64 h)
{
	if (maybe_in(LEARNED_PROVEN, h) && find_way(&proven_peers, h) >= 0)
		return PEER_PROVEN;
	if (!maybe_in(LEARNED_ANSWERED, h))
		return PEER_NONE;
	return find_way(&answered_peers, h);
}

// prove: decide.Filter.prove, the source of k proved its address through a
// server ID bound to it at stamp st: it becomes a proven peer. Returns 1
// when it is one; the caller then marks the ID's slot, so that the next
// datagrams through it skip this, and counts the proof.
static __always_inline int prove(const struct config *cfg, const struct key *k, __u32 st)
{
	return learn_slot(&proven_peers, LEARNED_PROVEN, peer_hash(cfg, k), st);
}

// verify: decide.Filter.verify. Looks up what the check of classify asks
// for (check_id: the check, and HDR_HAS_ID when the header has an ID that
// may be a server's) and returns resolve's class, reason and verification.
// A short header's ID is looked up first, and the source among the proven
// peers and then the answered ones only if the ID does not verify it. An
// attempt at a proof (attempts) looks the peers up first: from an answered
// peer that is not proven it pays a token of the proof pacer at now before
// its ID is looked up (and counts in st when there is none). A server ID
// that verifies the datagram is refreshed at now, and a paid attempt
// through it proves the source (once: the slot is marked then). A datagram
// that the answered tier decides spends a credit of its source.
//
// A global function: verified once, and its locals (learn_slot's among
// them) are not in the program's own frame, which the node loop's call
// adds to (the verifier's limit is 512 bytes for the two).
__noinline int verify(const struct config *cfg, const struct key *k, int check_id, __u64 now, struct stats *st)
{
	int check = check_id & HDR_FIELD_MASK;
	int has_id = (check_id & HDR_HAS_ID) != 0;

	if (!cfg || !k || !st)
		return resolve(check, 0, 0, 0, 0);
	if (!known_family(k))
		return resolve(check, 0, 0, 0, 0);
	// The source's peer hash, computed where the peers are looked up: a
	// short header verified by its ID (most of an established
	// connection's) needs none.
	__u64 ha = 0;
	int peer = PEER_NONE, paid = 0;
	int attempt = attempts(check, has_id);
	if (attempt) {
		ha = peer_hash(cfg, k);
		peer = peers_of(ha);
		if (peer >= 0) {
			paid = gcra(PACER_PROOF, cfg->proof_interval, cfg->proof_tau, now);
			if (!paid)
				st->unpaced_attempts++;
		}
	}
	__u64 *id_slot = NULL;
	if (has_id) {
		struct server_id id;
		server_id_of(k, check, &id);
		__u64 h = bound_hash(cfg, id_word(&id), k);
		if (maybe_in(LEARNED_IDS, h))
			id_slot = find_slot(&server_ids, h);
	}
	if (id_slot) {
		__u32 stamp = stamp_of(now);

		refresh_slot(id_slot, stamp);
		__u64 e = *id_slot;
		if (paid && !(e & SLOT_MARK) && prove(cfg, k, stamp)) {
			__sync_val_compare_and_swap(id_slot, e, e | SLOT_MARK);
			st->proofs++;
		}
		return resolve(check, 1, 0, 0, 0);
	}
	if (!attempt && needs_peer(check, 0)) {
		ha = peer_hash(cfg, k);
		peer = peers_of(ha);
	}
	int credited = peer >= 0 && spend_credit(ha, peer);
	return resolve(check, 0, peer == PEER_PROVEN, peer >= 0, credited);
}

#endif
