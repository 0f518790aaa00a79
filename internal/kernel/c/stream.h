// stream.h: the version negotiation cap, and the tracking of the streams
// the filter drops. Go twins: internal/decide/datagram.go (the negotiation
// pacer in Filter.Decide), internal/decide/contract.go (TrackPacing),
// internal/decide/stream.go
// (Stream), and internal/kernel/streams.go, which reads the tracked streams
// and their events. Only a sample of drops (config.track_mask) looks up
// the tracking map, which keeps the drop path's cost flat under a flood.
#ifndef RAKELIMIT_STREAM_H
#define RAKELIMIT_STREAM_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "lattice.h"
#include "maps.h"
#include "pace.h"
#include "parse.h"

// pace: the version negotiation cap.
static __always_inline int pace(const struct config *cfg, __u64 now)
{
	return gcra(PACER_NEGOTIATION, cfg->vn_interval, cfg->vn_tau, now);
}

// record remembers a drop of the stream sk and tells userspace when the
// stream is new. New streams are paced (the tracking pacer): a flood from a
// new source on every packet would otherwise make one map insertion and
// one event per sampled drop, which costs userspace more than the flood.
static __always_inline void record(const struct config *cfg, struct stream_key *sk,
				   const struct stream_state *init, __u64 now)
{
	struct stream_state *st = bpf_map_lookup_elem(&streams, sk);
	if (st) {
		st->last_ns = now;
		st->sampled_drops++;
		st->estimate = init->estimate;
		return;
	}
	if (!gcra(PACER_TRACKING, cfg->track_interval, cfg->track_tau, now)) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&untracked, &zero);
		if (n)
			(*n)++;
		return;
	}
	struct stream_event ev = {.key = *sk, .state = *init};
	// Only the CPU that creates the entry reports it.
	if (bpf_map_update_elem(&streams, sk, init, BPF_NOEXIST) == 0)
		bpf_ringbuf_output(&events, &ev, sizeof(ev), 0);
}

// track records a drop of the stream that node v->node saw. A global
// function, like track_invalid: their stream keys, states and events would
// otherwise take room in the program's own stack frame, which the node
// loop's functions add to.
__noinline int track(const struct config *cfg, int class, const struct key *k, const struct verdict *v, __u64 now)
{
	if (!cfg || !k || !v)
		return 0;
	__u8 n = v->node;
	int fi = k->family == FAMILY_IPV6;
	int p = node_prefix(n) & (MAX_PREFIXES - 1);
	struct stream_key sk = {.family = k->family, .node = n, .class = class, .dport = k->dport};

#pragma unroll
	for (int i = 0; i < 4; i++)
		sk.words[i] = k->words[i] & cfg->mask[fi][p][i];
	if (!node_sport_any(n))
		sk.sport = k->sport;
	struct stream_state init = {.first_ns = now, .last_ns = now, .sampled_drops = 1, .estimate = v->estimate,
				    .level = v->level, .dry_run = cfg->dry_run};
	record(cfg, &sk, &init, now);
	return 0;
}

// track_invalid records an invalid datagram from the packet's source.
__noinline int track_invalid(const struct config *cfg, const struct key *k, int reason, __u64 now)
{
	if (!cfg || !k)
		return 0;
	struct stream_key sk = {.family = k->family, .node = INVALID_NODE, .class = CLASS_INVALID, .dport = k->dport};

#pragma unroll
	for (int i = 0; i < 4; i++)
		sk.words[i] = k->words[i];
	struct stream_state init = {.first_ns = now, .last_ns = now, .sampled_drops = 1, .reason = reason,
				    .dry_run = cfg->dry_run};
	record(cfg, &sk, &init, now);
	return 0;
}

#endif
