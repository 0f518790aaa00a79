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
// PEER_NONE.
static __always_inline int peers_of(__u64 h)
{
	if (maybe_in(LEARNED_PROVEN, h) && find_way(&proven_peers, h) >= 0)
		return PEER_PROVEN;
	if (!maybe_in(LEARNED_ANSWERED, h))
		return PEER_NONE;
	return find_way(&answered_peers, h);
}

// bound_slot: the slot of the server ID the header of check carries, bound
// to the source of k, or NULL (the lookup of decide.Filter.boundID).
static __always_inline __u64 *bound_slot(const struct config *cfg, const struct key *k, int check)
{
	struct server_id id;

	server_id_of(k, check, &id);
	__u64 h = bound_hash(cfg, id_word(&id), k);
	return maybe_in(LEARNED_IDS, h) ? find_slot(&server_ids, h) : NULL;
}

// prove: decide.Filter.prove, the source of k proved its address through a
// server ID bound to it at stamp st: it becomes a proven peer. Returns 1
// when it is one; the caller then marks the ID's slot, so that the next
// datagrams through it skip this, and counts the proof. A global function,
// called once per ID: learn_slot's locals stay out of verify's frame.
__noinline int prove(const struct config *cfg, const struct key *k, __u32 st)
{
	if (!cfg || !k)
		return 0;
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
// The peers are looked up in one place and the ID in two (the ID's lookup
// is the smaller), inlined: a datagram verified by its ID or its peer
// makes this one call. A global function: verified once, and its locals
// are not in the program's own frame, which the node loop's call adds to
// (the verifier's limit is 512 bytes for the two).
__noinline int verify(const struct config *cfg, const struct key *k, int check_id, __u64 now, struct stats *st)
{
	int check = check_id & HDR_FIELD_MASK;
	int has_id = (check_id & HDR_HAS_ID) != 0;
	int id_known = 0, peer = PEER_NONE, credited = 0;

	if (cfg && k && st && known_family(k)) {
		int attempt = attempts(check, has_id);
		__u64 *id_slot = NULL;
		// A short header's ID first: an established connection's
		// datagrams verify by it, and need no peer hash.
		if (has_id && !attempt)
			id_slot = bound_slot(cfg, k, check);
		__u64 ha = 0;
		int paid = 0;
		if (!id_slot) {
			ha = peer_hash(cfg, k);
			peer = peers_of(ha);
			if (attempt) {
				if (peer >= 0) {
					paid = gcra(PACER_PROOF, cfg->proof_interval, cfg->proof_tau, now);
					if (!paid)
						st->unpaced_attempts++;
				}
				id_slot = bound_slot(cfg, k, check);
			}
		}
		if (id_slot) {
			__u32 stamp = stamp_of(now);

			id_known = 1;
			refresh_slot(id_slot, stamp);
			__u64 e = *id_slot;
			if (paid && !(e & SLOT_MARK) && prove(cfg, k, stamp)) {
				__sync_val_compare_and_swap(id_slot, e, e | SLOT_MARK);
				st->proofs++;
			}
		} else {
			credited = peer >= 0 && spend_credit(ha, peer);
		}
	}
	return resolve(check, id_known, peer == PEER_PROVEN, peer >= 0, credited);
}

#endif
