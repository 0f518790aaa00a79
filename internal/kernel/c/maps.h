// maps.h: the maps, and the structures userspace reads and writes through
// them.
//
// Go twins: in internal/decide/sketch, config.go (Params, which struct
// config carries), cells.go (Cell, Line) and limiter.go (the limiter's
// state: the cells, the fair shares, the pending totals); in
// internal/decide, config.go (Config), datagram.go (Stats), learned.go
// (the learned sets) and stream.go (Stream). internal/kernel reads and writes the maps
// through the types bpf2go generates from these structures.
#ifndef RAKELIMIT_MAPS_H
#define RAKELIMIT_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"

// The size of the ring buffer of stream events (map events).
#define EVENTS_BYTES (64 * 1024)

// A budget's counts in a cell (sketch.Counter).
struct counter {
	__u32 offered;
	__u32 forwarded;
};

// One count-min cell: see Cell in internal/decide/sketch/cells.go.
struct cell {
	__u32 epoch;
	struct counter budget[2];
};

// Three cells in a 64-byte cache line: no cell straddles two lines.
struct line {
	struct cell cells[CELLS_PER_LINE];
	__u32 pad;
};

// The compiled configuration (decide.Config, sketch.Params) and the hash
// keys. Userspace writes the inactive one of two copies and then flips
// active_config, so a packet never sees half an update.
struct config {
	__u32 thresh[NUM_CLASSES][MAX_NODES];
	__u32 over[NUM_CLASSES][MAX_NODES];
	// Each node's rows: their length in lines and the first line's index.
	__u32 lines[NUM_CLASSES][MAX_NODES];
	__u32 base[NUM_CLASSES][MAX_NODES];
	__u64 g[SLOTS];
	__u32 w[SLOTS];
	__u64 ginv[SLOTS];
	__u64 d0[DECAY_ENTRIES];
	__u64 d1[DECAY_ENTRIES];
	__u64 d2[DECAY_ENTRIES];
	__u64 hash_a[DEPTH][HASH_WORDS];
	__u64 hash_b[DEPTH];
	// The rank of a source at the fair total.
	__u64 rank_a[HASH_WORDS];
	__u64 rank_b;
	// The learned sets' hash keys (sketch.HashKey.LearnID, LearnAddr):
	// a server ID's word and an address's four words, then the offset;
	// an address's four words, then the offset.
	__u64 learn_id[LEARN_ID_WORDS + 1];
	__u64 learn_addr[LEARN_ADDR_WORDS + 1];
	// By family (0 IPv4, 1 IPv6) and prefix slot: the family word hashed
	// (0 for a /0 prefix) and the mask of each address word.
	__u64 family_word[2][MAX_PREFIXES];
	__u32 mask[2][MAX_PREFIXES][4];
	// allow_filter, by family: a bit per bucket of allow_bucket() values
	// that an allowlisted prefix covers. A packet whose bucket is clear is
	// not in the allowlist, and the trie is not looked up.
	__u64 allow_filter[2][ALLOW_FILTER_BITS / 64];
	// Blocked source ports, a bit per port.
	__u64 blocked_ports[65536 / 64];
	// The version negotiation pacer: one datagram per vn_interval ns, a
	// burst tolerance of vn_tau ns; vn_interval 0 drops them all.
	__u64 vn_interval;
	__u64 vn_tau;
	// The tracking pacer: streams start being tracked (a map entry and an
	// event) at most one per track_interval ns, with a burst tolerance of
	// track_tau ns (decide.TrackPacing).
	__u64 track_interval;
	__u64 track_tau;
	// The proof pacer (decide.ProofPacing): attempts at a proof pay one
	// token each.
	__u64 proof_interval;
	__u64 proof_tau;
	// The returning part of the opening class's fair total
	// (sketch.Params.Returning).
	__u64 returning_interval;
	__u64 returning_tau;
	// The timer tick's length in ns (the coarse clock's resolution), or 0
	// when it is unknown (see tick_clock).
	__u64 tick_ns;
	// returning_line: the line whose first cell counts what the returning
	// part of the opening class's fair total passed
	// (sketch.Params.ReturningLine).
	__u32 returning_line;
	// returning_exempt: bit i for each node that a returning user's packet
	// passes as if under its limit (sketch.Params.ReturningExempt).
	__u16 returning_exempt;
	__u8 nodes[MAX_NODES];
	// visited: how many of the nodes, from the first, each class visits
	// (sketch.Params.Visited): up to its last limited node.
	__u8 visited[NUM_CLASSES];
	// screen: where each class's clean packets are screened before the
	// node loop, SCREEN_FAIR and SCREEN_REFLECT bits (sketch.Params.Screen).
	__u8 screen[NUM_CLASSES];
	__u8 num_prefixes;
	__u8 per_dport;
	// dry_run: decide and count as usual, but deliver every packet.
	__u8 dry_run;
	// allow_any: the allowlist has entries (otherwise it is not looked up).
	__u8 allow_any;
	// allow_always, by family: an allowlisted prefix is too short for
	// allow_filter, so every packet of the family is looked up.
	__u8 allow_always[2];
	// classify: sort datagrams into QUIC classes; otherwise every datagram
	// is of the opening class.
	__u8 classify;
	// The fair total's node and its network node, or 0xff for none.
	__u8 fair_node;
	__u8 fair_source;
	// The socket's total node, counted per CPU (count_total), or 0xff.
	__u8 total_node;
	// The reflection node (all sources from one source port) the screen
	// asks, or 0xff (sketch.Params.Reflect).
	__u8 reflect_node;
	// coarse_clock: read the kernel's coarse clock, whose resolution is
	// the timer tick, when the window is long enough for it (see clock).
	__u8 coarse_clock;
	// verify_ids: when classifying, verify datagrams against the learned
	// server IDs and peers, and check long headers' lengths.
	__u8 verify_ids;
	// A drop is tracked when a random number has none of these bits set:
	// 2^k - 1 tracks one drop in 2^k, 0 every drop.
	__u32 track_mask;
};

// Per-CPU datagram counters (decide.Stats), by class of the limiter and
// family (unknown, IPv4, IPv6). limited counts packets that passed although a
// node at that level found their stream over its limit; dropped counts drops
// by the level of the node that dropped.
struct stats {
	__u64 passed[NUM_CLASSES][FAMILY_SLOTS];
	__u64 limited[NUM_CLASSES][FAMILY_SLOTS][MAX_LEVELS];
	__u64 dropped[NUM_CLASSES][FAMILY_SLOTS][MAX_LEVELS];
	// would_drop: drops a dry run delivered.
	__u64 would_drop[NUM_CLASSES][FAMILY_SLOTS][MAX_LEVELS];
	__u64 negotiation[FAMILY_SLOTS][3];
	// invalid, by dry run (0 dropped, 1 delivered), family and reason.
	__u64 invalid[2][FAMILY_SLOTS][NUM_REASONS];
	// allowed: allowlisted packets of the limiter's classes, not counted
	// by the limiter (an allowlisted invalid or negotiation datagram is
	// counted as such).
	__u64 allowed[FAMILY_SLOTS];
	// verified: datagrams verified, by family and how.
	__u64 verified[FAMILY_SLOTS][NUM_VERIFICATIONS];
	__u64 errors;
	// proofs: addresses that became proven peers (prove).
	__u64 proofs;
	// unpaced_attempts: attempts at a proof the proof pacer had no room
	// for (verify).
	__u64 unpaced_attempts;
};

// The fair share of the total, by class and budget (sketch.admitFair).
struct fair {
	__u64 share[NUM_CLASSES][2];
};

// A CPU's counts of the socket's total not yet added to the shared cells,
// by class: cells of their own, scaled to the start of their epoch.
struct pending {
	struct cell cell[NUM_CLASSES];
};

// A stream as a lattice node sees it: the packet's key reduced to what the
// node counts (address masked to the node's prefix, wildcard ports zero), or
// for an invalid datagram its source address (node INVALID_NODE).
struct stream_key {
	__u32 words[4];
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 node;
	__u8 class;
	__u8 pad;
};

// What the kernel remembers of a stream it has dropped packets of.
struct stream_state {
	__u64 first_ns;
	__u64 last_ns;
	// sampled_drops counts the drops that were sampled (track_mask).
	__u64 sampled_drops;
	// estimate is the node's rate estimate at the last sampled drop, a
	// decayed count per window.
	__u64 estimate;
	__u8 level;
	__u8 dry_run;
	__u8 reason;
	__u8 pad[5];
};

// The event sent to userspace when the kernel starts tracking a stream.
struct stream_event {
	struct stream_key key;
	struct stream_state state;
};

// Allowlist keys: one trie per family, so that no IPv6 prefix (::/0 among
// them) covers an IPv4 source.
struct allow4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct allow6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

// The last verdict, which only the test entries write (test_verdict). drop
// is the decision before a dry run delivers the datagram anyway.
struct verdict {
	__u8 drop;
	__u8 limited;
	__u8 level;
	__u8 node;
	__u8 class;
	__u8 reason;
	__u8 paced;
	__u8 allowlisted;
	__u8 verified;
	__u8 pad[7];
	__u64 estimate;
};

// A learned set's quick-reject filter (decide.LearnedSet): the bit of every
// member's hash (the top QUICK_SHIFT bits) is set. Whoever adds a member
// sets its bit after adding it (userspace, and the program for a proven
// peer), and userspace rebuilds the bits when members expire.
struct quick {
	__u64 words[QUICK_WORDS];
};

// A set of a learned set (decide.LearnedSet): LEARNED_WAYS slots, one cache
// line. A key's set is the top LEARNED_SET_SHIFT bits of its hash; a slot
// holds the next bits of the hash (its tag) from TAG_SHIFT up, SLOT_USED,
// SLOT_MARK (a server ID whose address proved itself through it) and the
// key's stamp: the time it was learned or last used, in units of
// 2^STAMP_SHIFT ns (1.07 s), modulo 2^STAMP_BITS.
struct learned_set {
	__u64 slot[LEARNED_WAYS];
};
// The credits of a set of the answered peers, way by way.
struct credit_set {
	__u32 credit[LEARNED_WAYS];
};

// Sized by the loader: the lines of every node's rows, for every class.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct line);
	__uint(max_entries, 1);
	// Mapped into userspace, which resets stale cells one at a time with
	// atomic operations (Program.Sweep): a write of a whole line through
	// the map would undo what packets counted in its live cells meanwhile.
	__uint(map_flags, BPF_F_MMAPABLE);
} cells SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct config);
	__uint(max_entries, 2);
} configs SEC(".maps");

// The quick-reject filters of the learned sets, indexed LEARNED_IDS,
// LEARNED_PROVEN, LEARNED_ANSWERED. Mapped into userspace; every writer
// sets bits with atomic operations.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct quick);
	__uint(max_entries, NUM_LEARNED);
	__uint(map_flags, BPF_F_MMAPABLE);
} quick SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} active_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct stats);
	__uint(max_entries, 1);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct fair);
	__uint(max_entries, 1);
} fair_shares SEC(".maps");

// Each CPU's pending counts of the socket's total, by class: see
// count_total.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct pending);
	__uint(max_entries, 1);
} totals SEC(".maps");

// The pacers' theoretical arrival times (ns): PACER_NEGOTIATION, the
// version negotiation cap; PACER_TRACKING, new tracked streams;
// PACER_PROOF, attempts at a proof; PACER_RETURNING, the returning part of
// the opening class's fair total.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, NUM_PACERS);
} pacer SEC(".maps");

// Sampled drops of streams that were not tracked because the tracking
// pacer had no room (per CPU).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} untracked SEC(".maps");

// Streams with recent drops. The key dedups: only a stream's first sampled
// drop creates an entry and an event, however fast it floods. Userspace
// expires quiet entries; LRU eviction only matters past max_entries
// simultaneous streams.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct stream_key);
	__type(value, struct stream_state);
	__uint(max_entries, MAX_TRACKED_STREAMS);
} streams SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EVENTS_BYTES);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct allow4_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_ALLOW);
} allow4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct allow6_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_ALLOW);
} allow6 SEC(".maps");

// The learned sets (decide.LearnedSet), arrays rather than hash maps: a
// lookup reads one line, with no call (the kernel inlines an array's
// lookup; an LRU hash's lookup cost a verified datagram 25 ns on AMD EPYC).
// Mapped into userspace; every writer writes slots with atomic operations.
//
// server_ids: the server's connection IDs, each bound to the address it was
// sent to, as userspace learns them from what the server sends.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct learned_set);
	__uint(max_entries, LEARNED_SETS);
	__uint(map_flags, BPF_F_MMAPABLE);
} server_ids SEC(".maps");

// proven_peers: the peers that proved their address by sending back a server ID
// bound to it, added by the program (prove), kept by userspace while the
// server sends to them.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct learned_set);
	__uint(max_entries, LEARNED_SETS);
	__uint(map_flags, BPF_F_MMAPABLE);
} proven_peers SEC(".maps");

// answered_peers: the addresses the server sends a connection's packets to, as
// userspace learns them.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct learned_set);
	__uint(max_entries, LEARNED_SETS);
	__uint(map_flags, BPF_F_MMAPABLE);
} answered_peers SEC(".maps");
// The answered peers' credits (decide.Credit): a counter beside each slot
// of answered_peers, set by set. Mapped into userspace, which grants them
// and resets a slot's when a new address takes it; the program spends
// them with a compare-and-swap.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct credit_set);
	__uint(max_entries, LEARNED_SETS);
	__uint(map_flags, BPF_F_MMAPABLE);
} answered_credit SEC(".maps");

// A CPU's own state on the packet path: its xorshift state, seeded with a
// random non-zero value by the loader, and the coarse clock's reading at its
// last tick (tick_clock).
struct cpu_state {
	__u64 rng;
	// The jiffies count of the last tick this CPU read the coarse clock
	// in (0: none yet), and that reading.
	__u64 tick;
	__u64 tick_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct cpu_state);
	__uint(max_entries, 1);
} cpu_state SEC(".maps");

// The XDP program's listeners (c/listen.h), written by userspace
// (internal/kernel/xdp.go) as it attaches the program: by destination port,
// the families whose datagrams it decides there (LISTEN_* bits): to the
// host's addresses (a wildcard listener: LISTEN_HOST*, the addresses in
// host4 and host6, at most MAX_HOST_ADDRS of each, host4_n and host6_n in
// use), or to some addresses, listed in listen_addrs (LISTEN_SOME*).
struct listen_table {
	__u8 kinds[65536];
	__u32 host4[MAX_HOST_ADDRS];
	__u32 host6[MAX_HOST_ADDRS][4];
	__u32 host4_n;
	__u32 host6_n;
};

// A listener's address: its family, port and address in network byte order
// (an IPv4 address in addr[0], the rest zero).
struct listen_key {
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct listen_table);
	__uint(max_entries, 1);
} listen_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct listen_key);
	__type(value, __u8);
	__uint(max_entries, MAX_LISTEN_ADDRS);
} listen_addrs SEC(".maps");

// The datagrams the XDP program passed and the socket filter has not read
// yet, in each CPU's table of slots (c/listen.h).
struct xdp_passed {
	__u64 slot[XDP_PASSED_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct xdp_passed);
	__uint(max_entries, 1);
} xdp_passed SEC(".maps");

// test_verdict: the verdict of the datagram last decided, which only the
// test entries write (TEST_VERDICT, c/pkt.h): the production entries never
// refer to it.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct verdict);
	__uint(max_entries, 1);
} test_verdict SEC(".maps");

// xdp_interfaces: how many interfaces the XDP program runs on, set by
// userspace; 0 spares the socket filter the lookup of xdp_passed.
volatile __u32 xdp_interfaces = 0;
// xdp_stacked: set by userspace while the XDP program runs on two
// interfaces of one path (a bridge and its port, a VLAN and its parent),
// where a datagram may meet it twice: only then does it look for a record
// of its datagram before deciding (c/listen.h).
volatile __u32 xdp_stacked = 0;
// mark_key: the key of the marks of the datagrams the XDP program passed
// (c/listen.h, passed_mark), random for each load, which userspace writes
// before loading: a sender who does not know it cannot build a datagram
// with another's mark.
const volatile __u32 mark_key[2 * PASSED_MARK_WORDS] = {};

#endif
