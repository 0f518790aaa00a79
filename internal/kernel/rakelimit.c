//go:build ignore

// rakelimit.c: the hierarchical fair-share rate limiter as a BPF socket filter,
// for the UDP socket of an HTTP/3 server.
//
// The program performs, operation for operation, what Filter.Decide in
// internal/decide does: the QUIC class of the datagram (internal/decide/quicclass),
// verified against the connection IDs the server issued and the addresses it
// sends to (which userspace learns from the server's own datagrams and writes
// to the server_ids and peers maps), then the version negotiation cap, or the
// allowlist and the class's limiter (Limiter.Decide in
// internal/decide/sketch, where the algorithm, its parameters and error bounds are
// documented). Tests run packet traces through both and compare verdicts,
// counters, learned times and every sketch cell bit for bit, so any change
// here must be made there too (and the other way round).
//
// On a real UDP socket skb->data points at the UDP header; under
// BPF_PROG_TEST_RUN it points at the IP header. Every header is therefore read
// with bpf_skb_load_bytes_relative(..., BPF_HDR_START_NET), which means the
// same in both, and the address family comes from skb->protocol, never from
// the socket, so that one program serves AF_INET, AF_INET6 and dual-stack
// sockets.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Fixed point and time, as in internal/decide/sketch/fixed.go and config.go.
#define FRAC_BITS 8
#define WEIGHT_BITS 24
#define LOW32 0xffffffffULL
#define Q32_ONE (1ULL << 32)
#define U32_MAX 0xffffffffU
#define EPOCH_SHIFT 20
#define SLOT_SHIFT 12
#define SLOTS (1 << (EPOCH_SHIFT - SLOT_SHIFT))
#define DECAY_BITS 9
#define DECAY_ENTRIES (1 << DECAY_BITS)
#define DECAY_MASK (DECAY_ENTRIES - 1)
#define DECAY_HORIZON (1U << (3 * DECAY_BITS))
// A cell's 32-bit epoch may be up to SKEW_EPOCHS ahead of a packet's (another
// CPU moved it on): an idle time above SKEW_WRAP is such a packet, not a wrap.
#define SKEW_EPOCHS (1U << 10)
#define SKEW_WRAP (U32_MAX - SKEW_EPOCHS)
#define PERIOD_SHIFT 32
#define THRESH_UNLIMITED U32_MAX
// The fair total (sketch.FairStep, FairSlack, FairUnbounded).
#define FAIR_STEP 8
#define FAIR_SLACK 0
#define FAIR_UNBOUNDED ((1ULL << 48) - 1)
#define FAIR_ONE (1ULL << 16)
// The coin of the proportional floor: FAIR_COIN_BITS bits of the packet's
// random number from bit FAIR_COIN_SHIFT, under the dither (the top
// FRAC_BITS) and above the bits that sample drops (track_mask).
#define FAIR_COIN_BITS 16
#define FAIR_COIN_SHIFT (32 - FRAC_BITS - FAIR_COIN_BITS)
#define FAIR_COIN_MASK ((1U << FAIR_COIN_BITS) - 1)
// The screen judges a network alone only while its clean count, with the
// packet, is at most its limit >> SCREEN_HEADROOM_SHIFT (sketch
// ScreenHeadroomShift): the nodes more specific than the network's miss
// what the screen drops, and the headroom bounds that shortfall.
#define SCREEN_HEADROOM_SHIFT 1
// Where the screen asks (sketch.ScreenFair, ScreenReflect): a bit each in
// config.screen and node_work.screening.
#define SCREEN_FAIR 1
#define SCREEN_REFLECT 2
// Verdicts of admit_fair.
#define FAIR_REFUSE 0
#define FAIR_RANK 1
#define FAIR_FLOOR 2

// Lattice and sketch dimensions, as in internal/decide/sketch.
#define NUM_CLASSES 3
#define MAX_PREFIXES 4
#define MAX_NODES (MAX_PREFIXES * 4)
#define MAX_LEVELS (MAX_PREFIXES + 2)
#define DEPTH 2
#define CELLS_PER_LINE 3
#define HASH_WORDS 6
#define PORT_WORD (HASH_WORDS - 1)
#define MIX_MUL 0x9E3779B97F4A7C15ULL

// QUIC, as in internal/decide/quicclass: classes, reasons and wire format.
#define CLASS_OPENING 0
#define CLASS_ESTABLISHED 1
#define CLASS_UNVERIFIED 2
#define CLASS_NEGOTIATION 3
#define CLASS_INVALID 4
#define REASON_NONE 0
#define REASON_EMPTY 1
#define REASON_SOURCE_PORT 2
#define REASON_FIXED_BIT 3
#define REASON_TRUNCATED 4
#define REASON_CID_LENGTH 5
#define REASON_SMALL_INITIAL 6
#define REASON_SMALL_UNKNOWN_VERSION 7
#define REASON_SERVER_ONLY 8
#define REASON_UNPARSED 9
#define REASON_UNKNOWN_CONNECTION_ID 10
#define REASON_LENGTH 11
#define NUM_REASONS 12
// What the entry point must look up to finish a class (quicclass.Check).
#define CHECK_NONE 0
#define CHECK_SHORT 1
#define CHECK_OPENING 2
#define CHECK_HANDSHAKE 3
// How a datagram was verified (quicclass.Verification).
#define VERIFIED_NONE 0
#define VERIFIED_SHORT_BY_ID 1
#define VERIFIED_SHORT_BY_PEER 2
#define VERIFIED_OPENING_BY_ID 3
#define VERIFIED_OPENING_FROM_PEER 4
#define VERIFIED_HANDSHAKE_FROM_PEER 5
#define NUM_VERIFICATIONS 6
// classify's result: the class in bits 0-7, the reason in 8-15, the check
// in 16-23 and whether the destination ID can be a server's in bit 24;
// resolve's: the class, the reason and the verification.
#define HDR_REASON_SHIFT 8
#define HDR_CHECK_SHIFT 16
#define HDR_VERIFIED_SHIFT 16
#define HDR_HAS_ID (1 << 24)
#define PROBE_BYTES 27
// A mask that keeps a probe index inside struct key (see probe_byte).
#define PROBE_MASK 31
#define MAX_CID_LEN 20
#define MIN_INITIAL_DATAGRAM 1200
#define MIN_SHORT_HEADER_PACKET 21
#define HEADER_FORM 0x80
#define FIXED_BIT 0x40
#define LONG_TYPE_MASK 0x30
#define LONG_TYPE_SHIFT 4
#define LONG_FIXED_LEN 7
#define QUIC_V1 0x00000001
#define QUIC_V2 0x6b3343cf
#define LONG_TYPE_INITIAL 0
#define LONG_TYPE_HANDSHAKE 2
#define LONG_TYPE_RETRY 3
// The smallest Length field: a packet number's first 4 bytes and the 16-byte
// header protection sample.
#define MIN_LONG_PACKET_LENGTH 20
// A variable-length integer: its size is 1 << (first byte >> 6), at most 8.
#define VARINT_MAX_BYTES 8
#define VARINT_OK 0
#define VARINT_PAST 1
#define VARINT_UNREAD 2

// What the filter learns of the server (datagram.ServerIDLen, MaxServerIDs,
// MaxPeers): quic-go's 4-byte connection IDs, where its client's short and
// long headers carry them, and how many IDs and peer addresses are kept.
#define SERVER_ID_LEN 4
#define SHORT_ID_OFFSET 1
#define LONG_ID_OFFSET 6
#define MAX_SERVER_IDS (1 << 17)
#define MAX_PEERS (1 << 17)
// The server IDs' table (map server_ids, datagram.IDWays and IDSetShift):
// sets of ID_WAYS slots, one cache line each, an ID's set the top
// ID_SET_SHIFT bits of its hash (id_hash). A slot holds the ID in its top 32
// bits, ID_USED, and the ID's stamp: the time it was learned or last used
// by a verified datagram, in units of 2^ID_STAMP_SHIFT ns (1.07 s;
// datagram.IDStamp), which a verified datagram moves on when it is behind.
#define ID_WAYS 8
#define ID_SET_SHIFT 15
#define ID_SETS (1 << ID_SET_SHIFT)
#define ID_USED (1ULL << 31)
#define ID_STAMP_MASK (ID_USED - 1)
#define ID_TAG_MASK (~ID_STAMP_MASK)
#define ID_STAMP_SHIFT 30
// The quick-reject filters of the learned sets (map quick): a bit per hash
// bucket, 2^QUICK_SHIFT of them, set for every learned member.
#define QUICK_SHIFT 18
#define QUICK_WORDS ((1 << QUICK_SHIFT) / 64)
#define QUICK_PEERS 0
#define QUICK_IDS 1
#define NUM_QUICK 2
#define IPV4_MAPPED_WORD 0xffff

// Stream tracking: only a sample of drops (config.track_mask) looks up the
// tracking map, which keeps the drop path's cost flat under a flood.
#define MAX_TRACKED_STREAMS 1024
// The pacers' slots in the pacer map.
#define PACER_NEGOTIATION 0
#define PACER_TRACKING 1
#define NUM_PACERS 2
#define EVENTS_BYTES (64 * 1024)
// The stream key's node of an invalid datagram's source.
#define INVALID_NODE 0xff
#define MAX_ALLOW 1024
// The allowlist's quick-reject filter: 2^10 buckets per family, keyed by a
// multiplicative hash of the address's top 16 (IPv4) or 32 (IPv6) bits.
#define ALLOW_FILTER_SHIFT 10
#define ALLOW_FILTER_BITS (1 << ALLOW_FILTER_SHIFT)
#define ALLOW_HASH_MUL 0x9E3779B1U

// Budgets within a cell.
#define BUDGET_CLEAN 0
#define BUDGET_LIMITED 1

// Families as the limiter names them, and their index in struct stats.
#define FAMILY_UNKNOWN 0
#define FAMILY_IPV4 4
#define FAMILY_IPV6 6
#define FAMILY_SLOTS 3

// Header sizes and fields the parser needs.
#define IPV4_MIN_HDR_LEN 20
#define IPV4_FRAG_OFFSET_MASK 0x1fff
#define IPV6_HDR_LEN 40
#define IPV6_FRAG_OFFSET_MASK 0xfff8
#define IPV6_EXT_UNIT 8
#define IPV6_AH_UNIT 4
#define IPV6_FRAG_HDR_LEN 8
#define UDP_HDR_LEN 8
// Extension headers walked before the parser gives up looking for UDP. No
// QUIC client sends any; a datagram behind more is invalid (unparsed) when
// the filter classifies, and counted at the port-wildcard nodes when not.
#define IPV6_MAX_EXT 6

// Negotiation counters: passed, dropped, over the cap in a dry run.
#define NEG_PASSED 0
#define NEG_DROPPED 1
#define NEG_WOULD_DROP 2

// One count-min cell: see Cell in internal/decide/sketch/limiter.go.
struct counter {
	__u32 offered;
	__u32 forwarded;
};

struct cell {
	__u32 epoch;
	struct counter budget[2];
};

// Three cells in a 64-byte cache line: no cell straddles two lines.
struct line {
	struct cell cells[CELLS_PER_LINE];
	__u32 pad;
};

// The compiled configuration (datagram.Config, sketch.Params) and the hash
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
	// track_tau ns (datagram.TrackPacing).
	__u64 track_interval;
	__u64 track_tau;
	// The timer tick's length in ns (the coarse clock's resolution), or 0
	// when it is unknown (see tick_clock).
	__u64 tick_ns;
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
	// is of class 0.
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

// Per-CPU datagram counters (datagram.Stats), by class of the limiter and
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

// The last verdict, written in test mode only. drop is the decision before a
// dry run delivers the datagram anyway.
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

// What the filter reads of a datagram: the key of the limiter (as
// sketch.Key, rank_first included), the UDP payload's length, its first
// bytes and its offset from skb->data.
struct key {
	__u32 words[4];
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 has_ports;
	__u16 length;
	__u8 probe[PROBE_BYTES];
	__u8 rank_first;
	__u16 payload_at;
	__u8 pad[2];
};
_Static_assert(__builtin_offsetof(struct key, probe) + PROBE_MASK < sizeof(struct key),
	       "a masked probe index stays inside struct key");
_Static_assert(PROBE_BYTES <= PROBE_MASK + 1, "the mask keeps every probe index");

// A connection ID the server issued, as on the wire.
struct server_id {
	__u8 b[SERVER_ID_LEN];
};

// A peer address (datagram.PeerKey): the address's 16 bytes as four
// big-endian words (held in host order, as struct key holds them), an IPv4
// address IPv4-mapped.
struct peer_key {
	__u32 words[4];
};

// A learned set's quick-reject filter: bit h of a member's hash (peer_hash,
// id_hash) is set. Userspace sets a member's bit after adding it to the set,
// and rebuilds the bits when members expire (bpf.Filter.expireLearned).
struct quick {
	__u64 words[QUICK_WORDS];
};

// Sized by the loader: the lines of every node's rows, for every class.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct line);
	__uint(max_entries, 1);
	// Mapped into userspace, which resets stale cells one at a time with
	// atomic operations (Filter.Sweep): a write of a whole line through
	// the map would undo what packets counted in its live cells meanwhile.
	__uint(map_flags, BPF_F_MMAPABLE);
} cells SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct config);
	__uint(max_entries, 2);
} configs SEC(".maps");

// The quick-reject filters of the learned peers (QUICK_PEERS) and server
// IDs (QUICK_IDS). Mapped into userspace, which sets bits with atomic
// operations.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct quick);
	__uint(max_entries, NUM_QUICK);
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
// version negotiation cap; PACER_TRACKING, new tracked streams.
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

// A set of the server IDs' table: ID_WAYS slots (see ID_WAYS).
struct id_set {
	__u64 slot[ID_WAYS];
};
_Static_assert(ID_SETS * ID_WAYS == 2 * MAX_SERVER_IDS, "the table is half full with MAX_SERVER_IDS");

// The server's connection IDs, as userspace learns them. An array, not a
// hash map: a lookup reads one line, with no call (the kernel inlines an
// array's lookup), where an LRU hash's lookup cost a verified datagram 25 ns on
// AMD EPYC. Mapped into userspace, which writes slots with atomic
// operations: a new ID takes a free slot of its set, or the one of the
// stalest ID; IDs unused for their lifetime are cleared.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct id_set);
	__uint(max_entries, ID_SETS);
	__uint(map_flags, BPF_F_MMAPABLE);
} server_ids SEC(".maps");

// The addresses the server sends to, as userspace learns them, each with the
// time it was last learned (monotonic ns). An LRU map: when full, a new
// entry evicts the least recently used rather than being refused.
// Userspace deletes the entries unused for their lifetime.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct peer_key);
	__type(value, __u64);
	__uint(max_entries, MAX_PEERS);
} peers SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct verdict);
	__uint(max_entries, 1);
} test_verdict SEC(".maps");

// Load-time switches. The verifier knows their values and removes the
// branches they disable, so production pays nothing for them.
//
// test_mode: time and the random number come from skb->cb (cb[0] low and
// cb[1] high half of the time, cb[2] the random number), as injected by
// BPF_PROG_TEST_RUN, and the verdict is written to test_verdict.
const volatile __u8 test_mode = 0;
// bench_random_source: XOR the source address and port with a random
// number, so that a benchmark repeating one packet sees a new source every
// time, as a spoofed flood sends (a fixed port would make the all-sources
// node of that port a cell every packet writes).
const volatile __u8 bench_random_source = 0;

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

// next_random: xorshift64* (Vigna). The number only dithers which packet
// takes a freed slot, so speed matters more than unpredictability:
// bpf_get_prandom_u32 costs several times as much.
static __always_inline __u32 next_random(__u64 *state)
{
	__u64 x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return (x * 0x2545F4914F6CDD1DULL) >> 32;
}

static __always_inline int is_udp(__u8 proto)
{
	return proto == IPPROTO_UDP || proto == IPPROTO_UDPLITE;
}

// udp_length (datagram.UDPPayloadLength): the length of the payload of a
// UDP header at off, whose length field is ulen, in an IP datagram of ip_len
// bytes. It is what the kernel delivers to a UDP socket, which trims the
// packet to the UDP length before any socket filter runs: the length field
// less the header, bounded by the IP datagram. A field of 0 (an IPv6
// jumbogram's) means the rest of the IP datagram, and so does UDP-Lite
// (lite), whose field is the checksum's coverage; a field under the header's
// size leaves no payload.
static __always_inline __u32 udp_length(__u32 ulen, __u32 off, __u32 ip_len, int lite)
{
	__u32 avail = ip_len > off ? ip_len - off : 0;

	if (lite || ulen == 0 || ulen > avail)
		ulen = avail;
	return ulen > UDP_HDR_LEN ? ulen - UDP_HDR_LEN : 0;
}

// set_udp fills the ports, the payload length and the payload's offset from
// a UDP header found at off in a packet whose IP datagram is ip_len bytes
// long (datagram.parseUDP).
//
// The payload's offset is from skb->data, where bpf_skb_load_bytes reads:
// the UDP header on a socket, whose skb->len is the UDP datagram, shorter
// than the IP datagram of ip_len bytes; the network header under
// BPF_PROG_TEST_RUN, whose frames (test mode aside, which may cut them
// short) are whole.
//
// The length is the UDP payload's as a UDP socket receives it (see
// udp_length), bounded by the bytes the skb holds past the offset: the same
// length the userspace mode takes from the bytes it reads.
static __always_inline void set_udp(struct __sk_buff *skb, struct key *k, const struct udphdr *udp, __u32 off,
				    __u32 ip_len, int lite)
{
	k->has_ports = 1;
	k->sport = bpf_ntohs(udp->source);
	k->dport = bpf_ntohs(udp->dest);
	__u32 at = test_mode || skb->len >= ip_len ? off + UDP_HDR_LEN : UDP_HDR_LEN;
	__u32 n = udp_length(bpf_ntohs(udp->len), off, ip_len, lite);
	__u32 present = skb->len > at ? skb->len - at : 0;
	k->length = n < present ? n : present;
	k->payload_at = at;
}

// load_probe reads the first bytes of the UDP payload when the one load of
// the headers could not: the payload is shorter than the probe, or lies
// outside the skb's linear part. A GSO batch segmented on receive (quic-go
// sends them on loopback) keeps its headers linear and its payload in
// pages, which bpf_skb_load_bytes_relative cannot read; bpf_skb_load_bytes
// can, from skb->data (see set_udp).
static __always_inline void load_probe(struct __sk_buff *skb, struct key *k)
{
	__u32 n = k->length;

	// Verifier workaround: k->length is 16 bits, and without the barrier
	// clang tests the wider value set_udp computed it from and truncates
	// it later, which may make it 0 after the test.
	barrier_var(n);
	// The verifier wants the length of a load bounded and non-zero.
	if (n == 0)
		return;
	if (n > PROBE_BYTES)
		n = PROBE_BYTES;
	bpf_skb_load_bytes(skb, k->payload_at, k->probe, n);
}

// load_udp reads the UDP header at off and the probe after it.
static __always_inline void load_udp(struct __sk_buff *skb, struct key *k, __u32 off, __u32 ip_len, int lite)
{
	struct {
		struct udphdr udp;
		__u8 probe[PROBE_BYTES];
	} h;

	if (bpf_skb_load_bytes_relative(skb, off, &h, sizeof(h), BPF_HDR_START_NET) == 0) {
		set_udp(skb, k, &h.udp, off, ip_len, lite);
		__builtin_memcpy(k->probe, h.probe, PROBE_BYTES);
		return;
	}
	if (bpf_skb_load_bytes_relative(skb, off, &h.udp, sizeof(h.udp), BPF_HDR_START_NET) < 0)
		return;
	set_udp(skb, k, &h.udp, off, ip_len, lite);
	load_probe(skb, k);
}

// parse_ipv4 fills the key from an IPv4 packet. One load covers the header
// without options, the UDP header and the probe; options or a short packet
// cost more.
static __always_inline void parse_ipv4(struct __sk_buff *skb, struct key *k)
{
	struct {
		struct iphdr ip;
		struct udphdr udp;
		__u8 probe[PROBE_BYTES];
	} h;
	int full = bpf_skb_load_bytes_relative(skb, 0, &h, sizeof(h), BPF_HDR_START_NET) == 0;

	if (!full && bpf_skb_load_bytes_relative(skb, 0, &h.ip, sizeof(h.ip), BPF_HDR_START_NET) < 0)
		return; // no address: counted as unknown
	k->family = FAMILY_IPV4;
	k->words[0] = bpf_ntohl(h.ip.saddr);
	// A non-first fragment carries no transport header.
	if (!is_udp(h.ip.protocol) || (h.ip.frag_off & bpf_htons(IPV4_FRAG_OFFSET_MASK)))
		return;
	__u32 off = h.ip.ihl * 4;
	__u32 ip_len = bpf_ntohs(h.ip.tot_len);
	if (off < IPV4_MIN_HDR_LEN)
		return;
	if (off == IPV4_MIN_HDR_LEN && full) {
		set_udp(skb, k, &h.udp, off, ip_len, h.ip.protocol == IPPROTO_UDPLITE);
		__builtin_memcpy(k->probe, h.probe, PROBE_BYTES);
		return;
	}
	load_udp(skb, k, off, ip_len, h.ip.protocol == IPPROTO_UDPLITE);
}

// parse_ipv6 fills the key from an IPv6 packet, walking up to IPV6_MAX_EXT
// extension headers to the UDP header. As in parse_ipv4, one load covers
// the header, the UDP header and the probe when no extension header comes
// between them; extension headers or a short packet cost more.
static __always_inline void parse_ipv6(struct __sk_buff *skb, struct key *k)
{
	struct {
		struct ipv6hdr ip;
		struct udphdr udp;
		__u8 probe[PROBE_BYTES];
	} h;
	int full = bpf_skb_load_bytes_relative(skb, 0, &h, sizeof(h), BPF_HDR_START_NET) == 0;

	if (!full && bpf_skb_load_bytes_relative(skb, 0, &h.ip, sizeof(h.ip), BPF_HDR_START_NET) < 0)
		return;
	k->family = FAMILY_IPV6;
#pragma unroll
	for (int i = 0; i < 4; i++)
		k->words[i] = bpf_ntohl(h.ip.saddr.in6_u.u6_addr32[i]);

	__u32 ip_len = IPV6_HDR_LEN + bpf_ntohs(h.ip.payload_len);
	__u8 next = h.ip.nexthdr;
	__u32 off = IPV6_HDR_LEN;
	if (full && is_udp(next)) {
		set_udp(skb, k, &h.udp, off, ip_len, next == IPPROTO_UDPLITE);
		__builtin_memcpy(k->probe, h.probe, PROBE_BYTES);
		return;
	}
#pragma unroll
	for (int i = 0; i < IPV6_MAX_EXT; i++) {
		// The first four bytes of every extension header: next header,
		// length and, for a fragment header, the fragment offset.
		struct {
			__u8 next;
			__u8 len;
			__be16 frag_off;
		} ext;
		if (next != IPPROTO_HOPOPTS && next != IPPROTO_ROUTING && next != IPPROTO_DSTOPTS &&
		    next != IPPROTO_FRAGMENT && next != IPPROTO_AH)
			break;
		if (bpf_skb_load_bytes_relative(skb, off, &ext, sizeof(ext), BPF_HDR_START_NET) < 0)
			return;
		if (next == IPPROTO_FRAGMENT) {
			if (ext.frag_off & bpf_htons(IPV6_FRAG_OFFSET_MASK))
				return;
			off += IPV6_FRAG_HDR_LEN;
		} else if (next == IPPROTO_AH) {
			off += (ext.len + 2) * IPV6_AH_UNIT;
		} else {
			off += (ext.len + 1) * IPV6_EXT_UNIT;
		}
		next = ext.next;
	}
	if (is_udp(next))
		load_udp(skb, k, off, ip_len, next == IPPROTO_UDPLITE);
}

// parse fills the key from the packet's headers; a field it cannot read is
// left zero (family unknown, no ports). Inlined: on CPUs that return through
// a return thunk (AMD's SRSO mitigation), every call costs about 7 ns, more
// than the checks it makes. What follows it in main is short, so the
// verifier's walk of main stays small (TestVerifierBudget).
static __always_inline int parse(struct __sk_buff *skb, struct key *k)
{
	if (!k)
		return 0;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		parse_ipv4(skb, k);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		parse_ipv6(skb, k);
	return 0;
}

static __always_inline int invalid(int reason)
{
	return CLASS_INVALID | reason << 8;
}

// long_type returns the v1 number of a long header's packet type field of
// version v: v2 (RFC 9369) numbers Initial 1, 0-RTT 2, Handshake 3, Retry 0.
static __always_inline __u8 long_type(__u8 field, __u32 v)
{
	return v == QUIC_V2 ? (field + 3) & 3 : field;
}

// probe_byte is byte i of the probe, for an i below PROBE_BYTES. Verifier
// workaround: the verifier cannot always bound a variable index by the
// comparisons that kept it below PROBE_BYTES, so the index is masked to
// PROBE_MASK, which keeps it inside struct key (asserted after it) and
// changes no index below PROBE_BYTES.
static __always_inline __u8 probe_byte(const struct key *k, __u32 i)
{
	return k->probe[i & PROBE_MASK];
}

// probe_varint decodes the size-byte variable-length integer at offset at
// of the probe, which holds all of it (at + size <= PROBE_BYTES).
static __always_inline __u64 probe_varint(const struct key *k, __u32 at, __u32 size)
{
	__u64 x = probe_byte(k, at) & 0x3f;

#pragma unroll
	for (__u32 i = 1; i < VARINT_MAX_BYTES; i++)
		if (i < size)
			x = x << 8 | probe_byte(k, at + i);
	return x;
}

// read_varint: quicclass.varint. Reads the variable-length integer at
// offset at of k's payload into *v and its size into *n: from the probe,
// which parse loaded already, when the probe holds it (an Initial's token
// length and a 2-byte Length field with connection IDs of 8 and 4 bytes, as
// clients send: no helper call), else with loads. Returns VARINT_OK,
// VARINT_PAST when it runs past the datagram, or VARINT_UNREAD when a load
// fails although the datagram holds the bytes (the Go twin's bytes beyond
// those it was given): not checked.
static __always_inline int read_varint(struct __sk_buff *skb, const struct key *k, __u32 at, __u64 *v, __u32 *n)
{
	__u8 b[VARINT_MAX_BYTES] = {};
	__u32 len = k->length;

	if (at >= len)
		return VARINT_PAST;
	if (at < PROBE_BYTES) {
		__u32 size = 1U << (probe_byte(k, at) >> 6);
		if (size > len - at)
			return VARINT_PAST;
		if (at + size <= PROBE_BYTES) {
			*v = probe_varint(k, at, size);
			*n = size;
			return VARINT_OK;
		}
	}
	// The offset of a load is not checked by the verifier (the helper
	// checks it against the packet); its size must be a constant.
	if (bpf_skb_load_bytes(skb, k->payload_at + at, b, 1) < 0)
		return VARINT_UNREAD;
	__u32 size = 1U << (b[0] >> 6);
	if (size > len - at)
		return VARINT_PAST;
	int err = 0;
	// One load of a constant size for each size of integer: the verifier
	// wants the size of a load known, and a size computed by a shift it
	// cannot bound.
	if (size == 2)
		err = bpf_skb_load_bytes(skb, k->payload_at + at, b, 2);
	else if (size == 4)
		err = bpf_skb_load_bytes(skb, k->payload_at + at, b, 4);
	else if (size == 8)
		err = bpf_skb_load_bytes(skb, k->payload_at + at, b, 8);
	if (err < 0)
		return VARINT_UNREAD;
	__u64 x = b[0] & 0x3f;
#pragma unroll
	for (int i = 1; i < VARINT_MAX_BYTES; i++)
		if (i < size)
			x = x << 8 | b[i];
	*v = x;
	*n = size;
	return VARINT_OK;
}

// lengths_fit: quicclass.lengthsFit. Checks the fields after a long
// header's connection IDs, at offset at of the payload: an Initial's token
// length and token, then the Length field, at least MIN_LONG_PACKET_LENGTH
// and at most what follows it. Every offset stays within the datagram's
// length (at most 65535), which each step checks before it moves on.
static __always_inline int lengths_fit(struct __sk_buff *skb, const struct key *k, __u32 at, __u8 type)
{
	__u32 len = k->length;
	__u64 v = 0;
	__u32 n = 0;
	int st;

	if (type == LONG_TYPE_INITIAL) {
		st = read_varint(skb, k, at, &v, &n);
		if (st != VARINT_OK)
			return st == VARINT_UNREAD;
		at += n;
		if (v > len - at)
			return 0;
		at += v;
	}
	st = read_varint(skb, k, at, &v, &n);
	if (st != VARINT_OK)
		return st == VARINT_UNREAD;
	at += n;
	return v >= MIN_LONG_PACKET_LENGTH && v <= len - at;
}

// header packs classify's result.
static __always_inline int header(int class, int reason, int check, int has_id)
{
	return class | reason << HDR_REASON_SHIFT | check << HDR_CHECK_SHIFT | (has_id ? HDR_HAS_ID : 0);
}

// classify: quicclass.Inspect. Returns the class, and for an invalid
// datagram the reason, and with verification what to look up (see
// HDR_*). Inlined, as parse.
static __always_inline int classify(struct __sk_buff *skb, const struct key *k, const struct config *cfg)
{
	if (!skb || !k || !cfg)
		return invalid(REASON_UNPARSED);
	if (!k->has_ports)
		return invalid(REASON_UNPARSED);
	__u32 len = k->length;
	if (len == 0)
		return invalid(REASON_EMPTY);
	if ((cfg->blocked_ports[k->sport / 64] >> (k->sport % 64)) & 1)
		return invalid(REASON_SOURCE_PORT);
	__u8 b0 = k->probe[0];
	if (!(b0 & HEADER_FORM)) {
		if (!(b0 & FIXED_BIT))
			return invalid(REASON_FIXED_BIT);
		if (len < MIN_SHORT_HEADER_PACKET)
			return invalid(REASON_TRUNCATED);
		if (!cfg->verify_ids)
			return CLASS_ESTABLISHED;
		return header(CLASS_UNVERIFIED, REASON_NONE, CHECK_SHORT, 1);
	}
	if (len < LONG_FIXED_LEN)
		return invalid(REASON_TRUNCATED);
	__u32 v = (__u32)k->probe[1] << 24 | (__u32)k->probe[2] << 16 | (__u32)k->probe[3] << 8 | k->probe[4];
	if (v == 0)
		return invalid(REASON_SERVER_ONLY);
	if (v != QUIC_V1 && v != QUIC_V2)
		return len < MIN_INITIAL_DATAGRAM ? invalid(REASON_SMALL_UNKNOWN_VERSION) : CLASS_NEGOTIATION;
	if (!(b0 & FIXED_BIT))
		return invalid(REASON_FIXED_BIT);
	__u32 dcil = k->probe[5];
	if (dcil > MAX_CID_LEN)
		return invalid(REASON_CID_LENGTH);
	if (len < LONG_FIXED_LEN + dcil)
		return invalid(REASON_TRUNCATED);
	__u32 scil = k->probe[6 + dcil];
	if (scil > MAX_CID_LEN)
		return invalid(REASON_CID_LENGTH);
	if (len < LONG_FIXED_LEN + dcil + scil)
		return invalid(REASON_TRUNCATED);
	__u8 type = long_type((b0 & LONG_TYPE_MASK) >> LONG_TYPE_SHIFT, v);
	if (type == LONG_TYPE_RETRY)
		return invalid(REASON_SERVER_ONLY);
	if (type == LONG_TYPE_INITIAL && len < MIN_INITIAL_DATAGRAM)
		return invalid(REASON_SMALL_INITIAL);
	if (!cfg->verify_ids)
		return CLASS_OPENING;
	if (!lengths_fit(skb, k, LONG_FIXED_LEN + dcil + scil, type))
		return invalid(REASON_LENGTH);
	return header(CLASS_OPENING, REASON_NONE, type == LONG_TYPE_HANDSHAKE ? CHECK_HANDSHAKE : CHECK_OPENING,
		      dcil == SERVER_ID_LEN);
}

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

// known_peer: whether the source address is a peer (datagram.peerKey).
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

// peer_hash (bpf.peerHash) is a peer's hash for its quick-reject filter.
static __always_inline __u64 peer_hash(const struct config *cfg, const struct peer_key *pk)
{
	__u64 h = 0;

#pragma unroll
	for (int i = 0; i < 4; i++)
		h += cfg->hash_a[0][1 + i] * (__u64)pk->words[i];
	return h;
}

// id_word is a server ID as a big-endian number (datagram.ServerID.Word).
static __always_inline __u32 id_word(const struct server_id *id)
{
	return (__u32)id->b[0] << 24 | (__u32)id->b[1] << 16 | (__u32)id->b[2] << 8 | id->b[3];
}

// id_hash (bpf.idHash) is a server ID's hash for its quick-reject filter
// and its set in the table.
static __always_inline __u64 id_hash(const struct config *cfg, __u32 w)
{
	return cfg->hash_a[1][1] * (__u64)w;
}

// id_stamp: datagram.IDStamp, a time as a slot of the server IDs' table
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
// behind (datagram.Filter.Decide): at most one write per ID and stamp, from
// whichever CPU sees it first. The compare-and-swap leaves alone a slot
// that userspace gave to another ID, or stamped, since it was read.
static __always_inline void refresh_server_id(__u64 *slot, __u64 now)
{
	__u64 e = *slot;
	__u64 st = id_stamp(now);

	if ((e & ID_STAMP_MASK) < st)
		__sync_val_compare_and_swap(slot, e, (e & ID_TAG_MASK) | st);
}

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

// needs_peer: quicclass.Header.NeedsPeer.
static __always_inline int needs_peer(int check, int id_known)
{
	return !id_known && check != CHECK_NONE;
}

static __always_inline int resolved(int class, int reason, int verified)
{
	return class | reason << HDR_REASON_SHIFT | verified << HDR_VERIFIED_SHIFT;
}

// resolve: quicclass.Header.Resolve, for a check other than CHECK_NONE.
// Returns the class, the reason and the verification (HDR_*).
static __always_inline int resolve(int check, int id_known, int peer_known)
{
	if (check == CHECK_SHORT) {
		if (id_known)
			return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_SHORT_BY_ID);
		if (peer_known)
			return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_SHORT_BY_PEER);
		return resolved(CLASS_UNVERIFIED, REASON_NONE, VERIFIED_NONE);
	}
	if (check == CHECK_OPENING) {
		if (id_known)
			return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_OPENING_BY_ID);
		if (peer_known)
			return resolved(CLASS_OPENING, REASON_NONE, VERIFIED_OPENING_FROM_PEER);
		return resolved(CLASS_OPENING, REASON_NONE, VERIFIED_NONE);
	}
	if (id_known)
		return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_OPENING_BY_ID);
	if (peer_known)
		return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_HANDSHAKE_FROM_PEER);
	return resolved(CLASS_INVALID, REASON_UNKNOWN_CONNECTION_ID, VERIFIED_NONE);
}

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

// rank: the rank of the packet's source in the current period; 0, the
// first, for a returning user's opening (rank_first).
static __always_inline __u32 rank(const struct config *cfg, const struct key *k, __u64 period)
{
	if (k->rank_first)
		return 0;
	__u64 h = cfg->rank_a[0] * period + cfg->rank_a[PORT_WORD] * (__u64)k->sport + cfg->rank_b;

#pragma unroll
	for (int i = 0; i < 4; i++)
		h += cfg->rank_a[1 + i] * (__u64)k->words[i];
	return mix(h) >> 32;
}

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

static __always_inline __u64 port_word(const struct config *cfg, __u8 n, const struct key *k)
{
	__u64 w = 0;

	if (!node_sport_any(n))
		w = (__u64)k->sport << 16;
	if (cfg->per_dport && !node_dport_any(n))
		w |= k->dport;
	return w;
}

static __always_inline __u64 decay(const struct config *cfg, __u32 k)
{
	if (k < DECAY_ENTRIES)
		return cfg->d0[k];
	if (k >= DECAY_HORIZON)
		return 0;
	__u64 d = mulq32(cfg->d0[k & DECAY_MASK], cfg->d1[(k >> DECAY_BITS) & DECAY_MASK]);
	return mulq32(d, cfg->d2[(k >> (2 * DECAY_BITS)) & DECAY_MASK]);
}

// decaying (sketch decaying): whether a cell idle for `idle` epochs is
// decayed to the reading's epoch: not one read in its own epoch (0), nor one
// older than the cell's (over SKEW_WRAP).
static __always_inline int decaying(__u32 idle)
{
	return idle != 0 && idle <= SKEW_WRAP;
}

// idle_factor (sketch idleFactor): the Q32 factor by which rescale would
// decay a cell last moved to epoch `last` to bring it to `epoch`, one
// (Q32_ONE) when rescale leaves the cell alone. The screen reads cells
// through it without moving them.
static __always_inline __u64 idle_factor(const struct config *cfg, __u32 last, __u32 epoch)
{
	__u32 idle = epoch - last;
	return decaying(idle) ? decay(cfg, idle) : Q32_ONE;
}

// rescale (refresh in internal/decide/sketch) brings a cell last touched in an older
// epoch to `epoch`, decaying its counters by the idle time; a reading older
// than the cell's own epoch (SKEW_WRAP) leaves it alone. The hot path, a cell
// already touched in this epoch, does not call it.
//
// Two CPUs may find the same cell stale at once; the compare-and-swap on the
// epoch lets only one of them decay it.
static __always_inline void rescale(struct cell *c, const struct config *cfg, __u32 epoch)
{
	__u32 last = c->epoch;
	__u32 idle = epoch - last;
	if (!decaying(idle) || __sync_val_compare_and_swap(&c->epoch, last, epoch) != last)
		return;
	__u64 d = decay(cfg, idle);
	c->budget[0].offered = decay32(c->budget[0].offered, d);
	c->budget[0].forwarded = decay32(c->budget[0].forwarded, d);
	c->budget[1].offered = decay32(c->budget[1].offered, d);
	c->budget[1].forwarded = decay32(c->budget[1].forwarded, d);
}

// node_work (sketch nodeWork) is what visit_nodes and visit_node share about
// one packet and one node. It lives in a per-CPU map value (node_scratch), not
// on the stack: the verifier tracks no value it loads from a map, so each
// pass through the node loop starts from the same state, where values kept
// on the stack would make it walk the loop once for every combination they
// can take, past its limit.
struct node_work {
	// Set by visit_nodes for the packet: the time, the slot's threshold scale
	// and packet weight, the epoch, the dither, the coin of the
	// proportional floor and the class.
	__u64 now;
	__u64 g;
	__u32 epoch;
	__u32 slot;
	__u32 w;
	__u32 dither;
	__u32 coin;
	__u32 class;
	// Set by visit_nodes for the node.
	__u32 node;
	__u32 pad1; // keeps ah 8-byte aligned without implicit padding
	// Set by visit_node: the budget, the node's rows, the address hashes
	// of prefix slot hashed - 1 (0: none yet) and the node's hashes.
	__u32 budget;
	__u32 lines;
	__u32 base;
	__u32 hashed;
	__u64 ah[DEPTH];
	__u64 hash[DEPTH];
	// Set by count_node: the offered and forwarded minima over the rows.
	__u32 omin;
	__u32 fmin;
	// Set by judge_node: the network's estimate (carried from the
	// network node to the total) and the node's estimate of the stream.
	__u32 network;
	__u32 pad2;
	__u64 estimate;
	// Kept from packet to packet, unlike the rest: by class, where the
	// screen runs (sketch Limiter.screening), SCREEN_FAIR set at the fair
	// total by note_screen, SCREEN_REFLECT by note_reflect. decide reads
	// it from the line it has just written instead of looking the shares
	// up for every packet. Zero in a new map: the screen starts off.
	__u8 screening[NUM_CLASSES];
	__u8 pad3[8 - NUM_CLASSES];
};

// The node loop's node_work, one per CPU (see struct node_work).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct node_work);
	__uint(max_entries, 1);
} node_scratch SEC(".maps");

// limiter_class bounds a limiter class index for the verifier, which cannot
// tell that it is below NUM_CLASSES already (NUM_CLASSES is not a power of
// two, so a mask will not do).
static __always_inline __u32 limiter_class(__u32 c)
{
	return c < NUM_CLASSES ? c : NUM_CLASSES - 1;
}


// admit_fair (sketch admitFair) decides a packet at the fair total and moves
// the share: FAIR_RANK when the share admits its source, FAIR_FLOOR when the
// proportional floor admits the packet, FAIR_REFUSE to drop it. nw carries the
// total's offered and forwarded counts, the network's estimate and the
// packet's coin (as arguments they would pass the five a BPF function takes).
// A global function: verified once, and only reached by packets of a flood
// over the total's limit.
__noinline int admit_fair(__u64 *share, const struct node_work *nw, __u32 rank, __u64 thr)
{
	if (!share || !nw || nw->omin == 0 || nw->network == 0)
		return FAIR_RANK;
	__u64 network = nw->network, forwarded = nw->fmin;
	__u64 want = (__u64)rank * network;
	__u64 s = *share;
	__u64 bar = s;
	__u64 f = (thr << 16) / nw->omin;
	__u64 floor = f;
	__u64 slack = thr >> FAIR_SLACK;
	if (forwarded > thr && slack > 0) {
		__u64 k = ((thr + slack - min64(forwarded, thr + slack)) << 16) / slack;
		bar = (bar * k) >> 16;
		floor = (floor * k) >> 16;
	}
	__u64 step = (s >> FAIR_STEP) + 1;
	if (want <= s << 16)
		*share = s - ((step * (FAIR_ONE - f)) >> 16);
	else
		*share = min64(s + ((step * f) >> 16) + 1, FAIR_UNBOUNDED);
	if (want <= bar << 16)
		return FAIR_RANK;
	// Refused, so bar < network << 16: the products stay under 2^64.
	__u64 fl = floor * network;
	if (fl > bar && (__u64)nw->coin * ((network << 16) - bar) < (fl - bar) << 16)
		return FAIR_FLOOR;
	return FAIR_REFUSE;
}

// set_verdict (sketch setVerdict) records the node that limits the packet. The
// level is computed from the node, not taken from the node loop's variable:
// the counters are indexed by it, which makes the verifier track its exact
// value, and a loop variable tracked exactly keeps the loop's states apart.
static __always_inline void set_verdict(struct verdict *v, int drop, __u8 n, __u64 estimate)
{
	v->drop = drop;
	v->limited = 1;
	v->level = node_level(n);
	v->node = n;
	v->estimate = estimate;
}

// Verdicts of judge_node. A packet the proportional floor admits at the fair
// total passes, over the limit, but is not counted as forwarded there: the
// forwarded count is what the share admits, which the share holds at the
// limit (see sketch FairSlack).
#define JUDGE_PASS 0
#define JUDGE_OVER 1
#define JUDGE_DROP 2
#define JUDGE_FLOOR 3

// node_cells (sketch Limiter.nodeCells) finds the node's cell in each row, by the
// hashes visit_node computed. Returns -1 when a cell cannot be reached.
static __always_inline int node_cells(const struct node_work *nw, struct cell *cl[DEPTH])
{
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		__u64 t = (mix(nw->hash[r]) >> 32) * nw->lines;
		__u32 idx = nw->base + r * nw->lines + (__u32)(t >> 32);
		__u32 c = ((t & LOW32) * CELLS_PER_LINE) >> 32;
		struct line *ln = bpf_map_lookup_elem(&cells, &idx);
		if (!ln)
			return -1;
		// c is below 3 by construction; the verifier cannot tell
		// through the multiplication that made it.
		if (c >= CELLS_PER_LINE)
			c = CELLS_PER_LINE - 1;
		cl[r] = &ln->cells[c];
	}
	return 0;
}

// count_node (sketch countNode) counts the packet at one node: in each row,
// the cell its hash selects is brought to this epoch and its offered count of
// the packet's budget grows by the packet's weight; rows gets the counters.
// Returns the number of rows (DEPTH), or -1 when a cell cannot be reached.
static __always_inline int count_node(const struct config *cfg, struct node_work *nw, struct counter *rows[DEPTH])
{
	struct cell *cl[DEPTH];
	__u32 epochs[DEPTH];

	if (node_cells(nw, cl) < 0)
		return -1;
	// Read both rows' epochs first: the two reads, independent, miss the
	// cache together when the source is new.
#pragma unroll
	for (int r = 0; r < DEPTH; r++)
		epochs[r] = cl[r]->epoch;
	// nw's fields in locals: a store to a cell might, for all the compiler
	// knows, write nw too, and would make it load them again.
	__u32 epoch = nw->epoch, budget = nw->budget & 1, w = nw->w;
	__u32 omin = U32_MAX, fmin = U32_MAX;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		if (epochs[r] != epoch)
			rescale(cl[r], cfg, epoch);
		struct counter *ctr = &cl[r]->budget[budget];
		ctr->offered = sat_add(ctr->offered, w);
		omin = min32(omin, ctr->offered);
		fmin = min32(fmin, ctr->forwarded);
		rows[r] = ctr;
	}
	nw->omin = omin;
	nw->fmin = fmin;
	return DEPTH;
}

// flush_pending (sketch flushPending) adds a CPU's pending counts p, counted
// from the start of epoch p->epoch, to the shared cell s, decayed first to
// s's epoch when another CPU has moved s on since. CPUs flush into s at
// once, so the adds are atomic; each is bounded by the room s had when
// read, which a concurrent add can overtake only near 2^32 (a count of
// 16 million packets a second over a one-second window).
static __always_inline void flush_pending(const struct config *cfg, const struct cell *p, struct cell *s)
{
	__u32 idle = s->epoch - p->epoch;
	int decays = decaying(idle);
	__u64 d = decays ? decay(cfg, idle) : 0;

#pragma unroll
	for (int b = 0; b < 2; b++) {
		__u32 o = p->budget[b].offered, f = p->budget[b].forwarded;
		if (decays) {
			o = decay32(o, d);
			f = decay32(f, d);
		}
		o = min32(o, U32_MAX - s->budget[b].offered);
		f = min32(f, U32_MAX - s->budget[b].forwarded);
		if (o)
			__sync_fetch_and_add(&s->budget[b].offered, o);
		if (f)
			__sync_fetch_and_add(&s->budget[b].forwarded, f);
	}
}

// flush_total (the flush in sketch countTotal) moves the CPU's pending counts
// p of the socket's total into the shared cells and brings them to the
// packet's epoch, once per epoch and CPU. A global function: verified once,
// and kept out of the code every packet runs. Returns -1 when a cell cannot
// be reached.
__noinline int flush_total(const struct config *cfg, const struct node_work *nw, struct cell *p)
{
	struct cell *cl[DEPTH];

	if (!cfg || !nw || !p || node_cells(nw, cl) < 0)
		return -1;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		flush_pending(cfg, p, cl[r]);
		if (cl[r]->epoch != nw->epoch)
			rescale(cl[r], cfg, nw->epoch);
	}
	// The shared cells' epoch, not the packet's: a reading older than the
	// cells' epoch leaves them alone (see rescale), and the pending counts
	// are then counted in the cells' epoch too.
	__builtin_memset(p->budget, 0, sizeof(p->budget));
	p->epoch = cl[0]->epoch;
	return 0;
}

// total_minima (sketch totalMinima) sets in nw the offered and forwarded
// minima over the rows of the socket's total: its cells cl in budget, plus
// the CPU's pending counts offered and forwarded.
static __always_inline void total_minima(struct cell *cl[DEPTH], __u32 budget, __u32 offered, __u32 forwarded,
					 struct node_work *nw)
{
	nw->omin = U32_MAX;
	nw->fmin = U32_MAX;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		const struct counter *sh = &cl[r]->budget[budget & 1];
		nw->omin = min32(nw->omin, sat_add(sh->offered, offered));
		nw->fmin = min32(nw->fmin, sat_add(sh->forwarded, forwarded));
	}
}

// count_total (sketch countTotal) is count_node for the socket's total: the
// one stream that every packet of the class counts, whose shared cells every
// CPU would otherwise write on every packet, moving their cache line from
// CPU to CPU and losing increments. Each CPU counts in a pending cell of
// its own (the per-CPU map totals) and moves the pending counts into the
// shared cells when the epoch changes, before the shared cells are brought
// to the new epoch (flush_total); the estimate is the shared count plus the
// CPU's own pending. So on one CPU the counts are exactly those of a single
// cell (a saturating add is associative), and on several what the other
// CPUs counted in the current epoch is missing: at most one epoch (1.05 ms)
// of their packets, counted once their next packet arrives. *pending gets
// the pending counter, where forwarded packets are counted too, by this CPU
// alone: no atomic add is needed. Returns 0, or -1 when a cell cannot be
// reached.
static __always_inline int count_total(const struct config *cfg, struct node_work *nw, struct counter **pending)
{
	__u32 zero = 0;
	struct pending *pd = bpf_map_lookup_elem(&totals, &zero);
	struct cell *cl[DEPTH];

	if (!pd)
		return -1;
	struct cell *p = &pd->cell[limiter_class(nw->class)];
	if (p->epoch != nw->epoch && flush_total(cfg, nw, p) < 0)
		return -1;
	if (node_cells(nw, cl) < 0)
		return -1;
	struct counter *ctr = &p->budget[nw->budget & 1];
	ctr->offered = sat_add(ctr->offered, nw->w);
	total_minima(cl, nw->budget, ctr->offered, ctr->forwarded, nw);
	*pending = ctr;
	return 0;
}

// enforcing (sketch Params.enforcing): whether node i of class enforces its
// limit, its offered count omin being over its enforcing threshold at
// threshold scale g.
static __always_inline int enforcing(const struct config *cfg, __u32 class, __u32 i, __u32 omin, __u64 g)
{
	return cfg->thresh[class][i] != THRESH_UNLIMITED && omin > scale(cfg->over[class][i], g);
}

// note_screen (sketch Limiter.noteScreen) sets, for a packet at the fair
// total in budget, whether the screen runs for class's next packets: when
// this one is clean and the CPU's clean share is bounded.
static __always_inline void note_screen(const struct fair *fs, struct node_work *nw, __u32 class, __u32 budget)
{
	__u8 on = budget == BUDGET_CLEAN && fs->share[class][BUDGET_CLEAN] != FAIR_UNBOUNDED ? SCREEN_FAIR : 0;
	nw->screening[class] = (nw->screening[class] & ~SCREEN_FAIR) | on;
}

// note_reflect (sketch Limiter.noteReflect) sets whether the screen runs at
// the reflection node for class's next packets: from a clean packet dropped
// there, by the walk or the screen, until the screen finds one the node
// would not drop.
static __always_inline void note_reflect(struct node_work *nw, __u32 class, int on)
{
	nw->screening[class] = (nw->screening[class] & ~SCREEN_REFLECT) | (on ? SCREEN_REFLECT : 0);
}

// judge_node (sketch judgeNode) compares what count_node found with the node's
// limit: under it the packet passes (JUDGE_PASS); over it, it passes counted
// as limited (JUDGE_OVER) until the node enforces its limit, which lets it
// through only while the forwarded count is under the dithered threshold or,
// at the fair total, when its source is admitted (JUDGE_DROP otherwise) or
// the proportional floor admits the packet (JUDGE_FLOOR).
static __always_inline int judge_node(const struct config *cfg, const struct key *k, struct node_work *nw,
				      const int last)
{
	__u32 i = nw->node & (MAX_NODES - 1);
	__u32 class = limiter_class(nw->class);
	__u32 budget = nw->budget & 1;
	__u32 omin = nw->omin, fmin = nw->fmin;
	if (i == cfg->fair_source)
		nw->network = omin;
	__u32 thr = cfg->thresh[class][i];
	__u32 zero = 0;
	struct fair *fs = last && i == cfg->fair_node ? bpf_map_lookup_elem(&fair_shares, &zero) : NULL;
	// A packet under the limit passes, and needs the enforcing threshold
	// only at the fair total, whose share it resets when the total does
	// not enforce.
	int under = thr == THRESH_UNLIMITED || omin <= scale(thr, nw->g);
	int enf = (!under || fs) && enforcing(cfg, class, i, omin, nw->g);
	if (fs) {
		if (!enf && fs->share[class][budget] != FAIR_UNBOUNDED)
			fs->share[class][budget] = FAIR_UNBOUNDED;
		note_screen(fs, nw, class, budget);
	}
	if (under)
		return JUDGE_PASS;
	__u32 slot = nw->slot & (SLOTS - 1);
	nw->estimate = mulq32(omin, cfg->ginv[slot]);
	if (!enf)
		return JUDGE_OVER;
	if (fs && nw->network) {
		// Room under the total's limit: pass, and leave the share as
		// it is (see sketch judgeNode). Only a packet over it is ranked.
		__u64 t = scale(thr, nw->g);
		if (fmin < t)
			return JUDGE_OVER;
		int a = admit_fair(&fs->share[class][budget], nw, rank(cfg, k, nw->now >> PERIOD_SHIFT), t);
		note_screen(fs, nw, class, budget);
		if (a == FAIR_RANK)
			return JUDGE_OVER;
		return a == FAIR_FLOOR ? JUDGE_FLOOR : JUDGE_DROP;
	}
	return fmin >= scale(thr - nw->dither, nw->g) ? JUDGE_DROP : JUDGE_OVER;
}

// forward_node (sketch forwardNode) counts a forwarded packet in the
// counters count_node found (forward_one: in one counter). Over the limit the forwarded
// count decides, so no increment may be lost to another CPU: atomic adds it
// atomically (a CPU's own pending counter needs no atomic add). It stays
// near the threshold then, far from overflowing, so the saturating add would
// give the same sum.
static __always_inline void forward_one(struct counter *c, __u32 w, int atomic)
{
	if (atomic)
		__sync_fetch_and_add(&c->forwarded, w);
	else
		c->forwarded = sat_add(c->forwarded, w);
}

static __always_inline void forward_node(struct counter *rows[DEPTH], __u32 w, int atomic)
{
#pragma unroll
	for (int r = 0; r < DEPTH; r++)
		forward_one(rows[r], w, atomic);
}

// node_hashes (sketch Limiter.nodeHashes) sets in nw the hashes of the
// packet's key for node i, whose descriptor n the caller has read (a store
// to nw between the two reads would make clang load it again), and where
// the node's rows lie. The address part is hashed once per prefix slot and
// kept in nw.
static __always_inline void node_hashes(const struct config *cfg, const struct key *k, struct node_work *nw, __u32 i,
					__u8 n)
{
	int p = node_prefix(n) & (MAX_PREFIXES - 1);
	if (p + 1 != nw->hashed) {
		addr_hashes(cfg, k, p, nw->ah);
		nw->hashed = p + 1;
	}
	__u64 pw = port_word(cfg, n, k);
#pragma unroll
	for (int r = 0; r < DEPTH; r++)
		nw->hash[r] = nw->ah[r] + cfg->hash_a[r][PORT_WORD] * pw + cfg->hash_b[r];
	__u32 class = limiter_class(nw->class);
	nw->lines = cfg->lines[class][i & (MAX_NODES - 1)];
	nw->base = cfg->base[class][i & (MAX_NODES - 1)];
}

// visit_node (sketch visitNode) walks the packet through node i: it hashes the
// packet's key for the node (the address part once per prefix slot, kept in
// nw), counts it in the budget v says (limited from the level after the first
// node over its limit, which v records), judges it against the node's limit,
// records in v the most specific node over its limit, and counts it forwarded
// unless it is dropped or passes by the proportional floor. Returns 1 to drop,
// 0 to go on, -1 when a cell cannot be reached. last (a constant) says
// whether i may be the last node, the only one that can be the socket's
// total (sketch.Params.TotalNode) or the fair total (FairNode): the copy the
// node loop inlines for the other nodes has neither's code.
static __always_inline int visit_node(const struct config *cfg, const struct key *k, struct node_work *nw, struct verdict *v,
				      const int last)
{
	__u32 i = nw->node & (MAX_NODES - 1);
	__u8 n = cfg->nodes[i];
	nw->budget = v->limited && node_level(n) > v->level ? BUDGET_LIMITED : BUDGET_CLEAN;
	node_hashes(cfg, k, nw, i, n);
	// The socket's total is counted in the CPU's pending counter, the
	// other nodes in a counter of each row.
	struct counter *rows[DEPTH] = {};
	struct counter *pending = NULL;
	int counted = last && i == cfg->total_node ? count_total(cfg, nw, &pending) : count_node(cfg, nw, rows);
	if (counted < 0)
		return -1;
	int j = judge_node(cfg, k, nw, last);
	if (j == JUDGE_DROP) {
		if (i == cfg->reflect_node && nw->budget == BUDGET_CLEAN)
			note_reflect(nw, limiter_class(nw->class), 1);
		set_verdict(v, 1, n, nw->estimate);
		return 1;
	}
	if (j != JUDGE_PASS && !v->limited)
		set_verdict(v, 0, n, nw->estimate);
	if (j != JUDGE_FLOOR)
	{
		// The CPU's own counter: no other CPU adds to it.
		if (pending)
			forward_one(pending, nw->w, 0);
		else
			forward_node(rows, nw->w, j == JUDGE_OVER);
	}
	return 0;
}

// packet_work sets up the CPU's node_work for a packet at time now of the
// class in the high half of rnd_class, whose low half is the packet's random
// number (the start of sketch Limiter.Decide). Only what the node loop and
// the screen read before they write needs a reset, not the whole of
// node_work. Returns NULL when the map cannot be reached.
static __always_inline struct node_work *packet_work(const struct config *cfg, __u64 now, __u64 rnd_class)
{
	__u32 zero = 0;
	struct node_work *nw = bpf_map_lookup_elem(&node_scratch, &zero);
	if (!nw)
		return NULL;
	__u32 rnd = rnd_class;
	__u32 slot = (now >> SLOT_SHIFT) & (SLOTS - 1);
	nw->hashed = 0;
	nw->network = 0;
	nw->now = now;
	nw->g = cfg->g[slot];
	nw->epoch = now >> EPOCH_SHIFT;
	nw->slot = slot;
	nw->w = cfg->w[slot];
	nw->dither = rnd >> (32 - FRAC_BITS);
	nw->coin = (rnd >> FAIR_COIN_SHIFT) & FAIR_COIN_MASK;
	nw->class = rnd_class >> 32;
	return nw;
}

// peek_cells (sketch peekCells) reads a node's cells cl as count_node would
// find them with the packet, without moving them: the minima over the rows
// of the clean offered count with the packet's weight, of the clean
// forwarded count and of the limited offered count, each decayed to the
// packet's epoch.
static __always_inline void peek_cells(const struct config *cfg, const struct node_work *nw, struct cell *cl[DEPTH],
				       __u32 *offered, __u32 *forwarded, __u32 *limited)
{
	__u32 o = U32_MAX, f = U32_MAX, l = U32_MAX;
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		__u64 d = idle_factor(cfg, cl[r]->epoch, nw->epoch);
		o = min32(o, sat_add(decay32(cl[r]->budget[BUDGET_CLEAN].offered, d), nw->w));
		f = min32(f, decay32(cl[r]->budget[BUDGET_CLEAN].forwarded, d));
		l = min32(l, decay32(cl[r]->budget[BUDGET_LIMITED].offered, d));
	}
	*offered = o;
	*forwarded = f;
	*limited = l;
}

// count_screened (sketch countScreened) counts a clean packet the screen
// drops in a node's cells cl as the loop counts it there: offered, and
// forwarded too at a node it passes (its network's).
static __always_inline void count_screened(const struct config *cfg, struct node_work *nw, struct cell *cl[DEPTH],
					   int forwarded)
{
#pragma unroll
	for (int r = 0; r < DEPTH; r++) {
		if (cl[r]->epoch != nw->epoch)
			rescale(cl[r], cfg, nw->epoch);
		struct counter *c = &cl[r]->budget[BUDGET_CLEAN];
		c->offered = sat_add(c->offered, nw->w);
		if (forwarded)
			forward_one(c, nw->w, 0);
	}
}

// screen_network (sketch Limiter.screenNetwork) reads the packet's network
// node for the screen without counting: its cells go to nc, and it returns
// the clean count the loop would find there with the packet, or 0 when the
// screen cannot judge the network alone: it holds limited traffic, or the
// count is over half its limit (SCREEN_HEADROOM_SHIFT).
static __always_inline __u32 screen_network(const struct config *cfg, const struct key *k, struct node_work *nw,
					    struct cell *nc[DEPTH])
{
	__u32 class = limiter_class(nw->class);
	__u32 ns = cfg->fair_source & (MAX_NODES - 1);
	__u8 n = cfg->nodes[ns];
	if (!applies(cfg, n, k))
		return 0;
	node_hashes(cfg, k, nw, ns, n);
	if (node_cells(nw, nc) < 0)
		return 0;
	__u32 network, forwarded, limited;
	peek_cells(cfg, nw, nc, &network, &forwarded, &limited);
	if (limited != 0 || network > scale(cfg->thresh[class][ns], nw->g) >> SCREEN_HEADROOM_SHIFT)
		return 0;
	return network;
}

// screen_reflect (sketch Limiter.screenReflect) asks the reflection node
// about a packet whose network the screen can judge alone (screen_network):
// it reads the node's clean counts with the packet without counting, and
// drops the packet as judge_node would there, over the node's enforcing
// threshold and its forwarded count at or over the dithered limit. A
// dropped packet is counted offered at the node, and at the network's node
// offered and forwarded, and keeps the screen on at the node
// (note_reflect). Returns 1 when it drops the packet. A global function of
// its own, beside screen_fair: one frame holding both would put the
// program's stack over its 512 bytes.
__noinline int screen_reflect(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw)
{
	if (!cfg || !k || !v || !nw)
		return 0;
	struct cell *nc[DEPTH];
	if (screen_network(cfg, k, nw, nc) == 0)
		return 0;
	__u32 class = limiter_class(nw->class);
	__u32 nr = cfg->reflect_node & (MAX_NODES - 1);
	__u8 n = cfg->nodes[nr];
	if (!applies(cfg, n, k))
		return 0;
	struct cell *rc[DEPTH];
	node_hashes(cfg, k, nw, nr, n);
	if (node_cells(nw, rc) < 0)
		return 0;
	__u32 omin, fmin, limited;
	peek_cells(cfg, nw, rc, &omin, &fmin, &limited);
	__u32 thr = cfg->thresh[class][nr];
	if (omin <= scale(thr, nw->g) || !enforcing(cfg, class, nr, omin, nw->g) ||
	    fmin < scale(thr - nw->dither, nw->g))
		return 0;
	count_screened(cfg, nw, nc, 1);
	count_screened(cfg, nw, rc, 0);
	note_reflect(nw, class, 1);
	set_verdict(v, 1, n, mulq32(omin, cfg->ginv[nw->slot & (SLOTS - 1)]));
	return 1;
}

// screen_fair (sketch Limiter.screenFair) asks the fair total about a
// packet whose network the screen can judge alone (screen_network): it
// reads the total's counts with the packet without counting, and asks
// admit_fair what the loop would ask it. A refused packet is counted
// offered at the total and at the network's node offered and forwarded,
// the share keeps what admit_fair made of it, and the packet is dropped;
// for one the total admits, by rank or by the floor, the share is put back,
// and the loop finds the same counts and asks the same question. Returns 1
// when it drops the packet. A global function: verified once.
__noinline int screen_fair(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw)
{
	__u32 zero = 0;

	if (!cfg || !k || !v || !nw)
		return 0;
	__u32 class = limiter_class(nw->class);
	__u32 nt = cfg->fair_node & (MAX_NODES - 1);
	__u8 n = cfg->nodes[nt];
	if (!applies(cfg, n, k))
		return 0;
	struct fair *fs = bpf_map_lookup_elem(&fair_shares, &zero);
	struct pending *pd = bpf_map_lookup_elem(&totals, &zero);
	if (!fs || !pd)
		return 0;
	// The CPU's pending counts of the total are flushed by the first
	// packet of an epoch, which the loop counts.
	struct cell *p = &pd->cell[class];
	if (p->epoch != nw->epoch)
		return 0;
	struct cell *nc[DEPTH];
	__u32 network = screen_network(cfg, k, nw, nc);
	if (network == 0)
		return 0;
	struct cell *tc[DEPTH];
	node_hashes(cfg, k, nw, nt, n);
	if (node_cells(nw, tc) < 0)
		return 0;
	struct counter *ctr = &p->budget[BUDGET_CLEAN];
	__u32 offered = sat_add(ctr->offered, nw->w);
	total_minima(tc, BUDGET_CLEAN, offered, ctr->forwarded, nw);
	__u32 omin = nw->omin, fmin = nw->fmin;
	__u64 thr = scale(cfg->thresh[class][nt], nw->g);
	if (omin <= thr || !enforcing(cfg, class, nt, omin, nw->g) || fmin < thr)
		return 0;
	nw->network = network;
	__u64 *share = &fs->share[class][BUDGET_CLEAN];
	__u64 was = *share;
	if (admit_fair(share, nw, rank(cfg, k, nw->now >> PERIOD_SHIFT), thr) != FAIR_REFUSE) {
		*share = was;
		return 0;
	}
	count_screened(cfg, nw, nc, 1);
	ctr->offered = offered;
	set_verdict(v, 1, n, mulq32(omin, cfg->ginv[nw->slot & (SLOTS - 1)]));
	return 1;
}

// screen (sketch Limiter.screen) decides, before the node loop, a clean
// packet that the reflection node or the fair total will drop, where the
// screen runs for the class (node_work.screening, masked by config.screen):
// it asks the reflection node (screen_reflect), then the fair total
// (screen_fair), what the loop would ask them, for a packet whose network
// node shows no limited traffic and stays under half its limit with it. A
// dropped packet is counted at the network's node and the node that drops
// it, as the loop would have counted it there; a packet neither drops is
// walked as before. on is where the screen runs for the packet's class,
// which decide reads once. Returns 1 when it drops the packet, 0 to walk it.
static __always_inline int screen(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw,
				  __u8 on)
{
	__u32 class = limiter_class(nw->class);
	if (on & SCREEN_REFLECT) {
		note_reflect(nw, class, 0);
		if (screen_reflect(cfg, k, v, nw))
			return 1;
	}
	return (on & SCREEN_FAIR) && screen_fair(cfg, k, v, nw);
}

// visit_nodes: sketch Limiter.Decide for the class in the high half of
// rnd_class, whose low half is the packet's random number. Returns 1 to drop,
// 0 to pass, -1 when the sketch cannot be reached; fills v.
//
// A global function, verified once, with every node visit inlined: one call
// per packet rather than one per node, which matters on CPUs that return
// through a return thunk (AMD's SRSO mitigation: about 7 ns a call). The
// nodes but the last share one loop body without the total's code; the
// last node is visited after the loop.
__noinline int visit_nodes(const struct config *cfg, const struct key *k, struct verdict *v, struct node_work *nw)
{
	if (!cfg || !k || !v || !nw)
		return -1;
	__u32 visited = cfg->visited[limiter_class(nw->class)];
	if (visited == 0)
		return 0;

	// visited is at most MAX_NODES; the mask bounds it for the verifier.
	__u32 last = (visited - 1) & (MAX_NODES - 1);
	// A real loop, not unrolled: unrolling makes the program several
	// times larger, and a socket filter's size is charged to the socket's
	// optmem (net.core.optmem_max).
#pragma clang loop unroll(disable)
	for (int i = 0; i < MAX_NODES - 1; i++) {
		if (i >= last)
			break;
		if (!applies(cfg, cfg->nodes[i], k))
			continue;
		nw->node = i;
		int drop = visit_node(cfg, k, nw, v, 0);
		if (drop)
			return drop;
	}
	if (!applies(cfg, cfg->nodes[last], k))
		return 0;
	nw->node = last;
	return visit_node(cfg, k, nw, v, 1);
}

// decide: sketch Limiter.Decide for class `class`: the screen, then
// visit_nodes, on the CPU's node_work for the packet.
static __always_inline int decide(const struct config *cfg, int class, const struct key *k, __u64 now, __u32 rnd,
				  struct verdict *v)
{
	struct node_work *nw = packet_work(cfg, now, (__u64)class << 32 | rnd);
	if (!nw)
		return -1;
	// The screen, only where it runs (note_screen, note_reflect): the call
	// costs even when it walks the packet. A call
	// beside visit_nodes, not in it, for the stack: the two frames would
	// add up over what the verifier allows. One the screen leaves to the
	// walk starts it afresh, as in Limiter.Decide.
	__u32 c = limiter_class(class);
	__u8 on = cfg->screen[c] & nw->screening[c];
	if (on) {
		if (screen(cfg, k, v, nw, on))
			return 1;
		nw->hashed = 0;
		nw->network = 0;
	}
	return visit_nodes(cfg, k, v, nw);
}

// gcra admits an event at now to the pacer in slot which: at most one per
// interval ns with a burst tolerance of tau ns (datagram.Pacing.Admit).
// Returns 1 when it conforms. Two CPUs racing for one slot: the loser's
// compare-and-swap fails and its event is refused.
static __always_inline int gcra(__u32 which, __u64 interval, __u64 tau, __u64 now)
{
	__u64 *tat = bpf_map_lookup_elem(&pacer, &which);

	if (!tat || interval == 0)
		return 0;
	__u64 t = *tat;
	if (t > now + tau)
		return 0;
	__u64 next = (t > now ? t : now) + interval;
	return __sync_val_compare_and_swap(tat, t, next) == t;
}

// pace: the version negotiation cap.
static __always_inline int pace(const struct config *cfg, __u64 now)
{
	return gcra(PACER_NEGOTIATION, cfg->vn_interval, cfg->vn_tau, now);
}

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

// tick_clock is the kernel's coarse clock, read once per tick and CPU. The
// coarse clock moves only when the timer tick does, and so does jiffies,
// which the kernel's JIT reads inline: while jiffies stays where it was at
// this CPU's last reading, the reading stands, and the packet costs no
// helper call (bpf_ktime_get_coarse_ns costs about 15 ns, a call through
// the return thunk included, on an AMD EPYC host).
//
// A tick moves jiffies first and the coarse clock a moment later, so a
// reading taken in between is a tick old: it is kept only if the clock moved
// by at least the ticks jiffies did, less half a tick (a jiffy is the
// monotonic clock divided by the tick's length, so the two agree to within
// a tick). Otherwise it serves this packet alone and the next one reads the
// clock again. A CPU's first reading is kept as it is.
static __always_inline __u64 tick_clock(const struct config *cfg, struct cpu_state *cs)
{
	__u64 j = bpf_jiffies64();

	if (j == cs->tick)
		return cs->tick_ns;
	__u64 t = bpf_ktime_get_coarse_ns();
	if (cs->tick == 0 || t - cs->tick_ns + cfg->tick_ns / 2 >= (j - cs->tick) * cfg->tick_ns) {
		cs->tick = j;
		cs->tick_ns = t;
	}
	return t;
}

// clock is the time of the packet: the kernel's monotonic clock, or in test
// mode the time the test put in skb->cb. The precise clock costs more than
// the rest of a drop (it reads the TSC and scales it); the coarse one, which
// the timer tick advances, costs a load and a comparison (tick_clock), and
// userspace picks it when the window is at least 100 ticks long, so that a
// packet's time is off by at most 1% of the window.
static __always_inline __u64 clock(const struct config *cfg, struct cpu_state *cs, struct __sk_buff *skb)
{
	if (test_mode)
		return (__u64)skb->cb[1] << 32 | skb->cb[0];
	if (cfg->coarse_clock)
		return tick_clock(cfg, cs);
	return bpf_ktime_get_ns();
}

static __always_inline int family_slot(__u8 family)
{
	return family == FAMILY_IPV4 ? 1 : family == FAMILY_IPV6 ? 2 : 0;
}

SEC("socket")
int rakelimit(struct __sk_buff *skb)
{
	__u32 zero = 0;
	__u32 *sel = bpf_map_lookup_elem(&active_config, &zero);
	struct stats *st = bpf_map_lookup_elem(&counters, &zero);
	struct cpu_state *cs = bpf_map_lookup_elem(&cpu_state, &zero);
	if (!sel || !st || !cs)
		return skb->len;
	__u32 which = *sel & 1;
	const struct config *cfg = bpf_map_lookup_elem(&configs, &which);
	if (!cfg)
		return skb->len;

	struct key k = {};
	parse(skb, &k);
	struct verdict v = {.paced = 1};
	// The family's counter index is computed where it is used: kept live
	// across the node loop, each of its three values would make the
	// verifier walk the loop once more.

	int class = CLASS_OPENING;
	int check = CHECK_NONE;
	int has_id = 0;
	if (cfg->classify) {
		int c = classify(skb, &k, cfg);
		class = c & 0xff;
		v.reason = c >> HDR_REASON_SHIFT;
		check = (c >> HDR_CHECK_SHIFT) & 0xff;
		has_id = (c & HDR_HAS_ID) != 0;
	}
	// Verification (datagram.Filter.verify): the server ID first, the
	// source address only if that does not verify the datagram. id_slot
	// is the table's slot of the ID that verified it.
	__u64 *id_slot = NULL;
	if (check != CHECK_NONE) {
		if (has_id) {
			struct server_id id;
			server_id_of(&k, check, &id);
			__u32 w = id_word(&id);
			__u64 h = id_hash(cfg, w);
			if (maybe_in(QUICK_IDS, h))
				id_slot = find_server_id(w, h);
		}
		int peer = needs_peer(check, id_slot != NULL) && known_peer(cfg, &k);
		int r = resolve(check, id_slot != NULL, peer);
		class = r & 0xff;
		v.reason = r >> HDR_REASON_SHIFT;
		v.verified = r >> HDR_VERIFIED_SHIFT;
	}
	v.class = class;
	if (v.verified != VERIFIED_NONE) {
		__u32 how = v.verified;
		if (how >= NUM_VERIFICATIONS) // cannot happen; bounds the index for the verifier
			how = VERIFIED_NONE;
		st->verified[family_slot(k.family)][how]++;
	}
	// One random number dithers the limiter (its top bits) and samples
	// drops for tracking (its low bits).
	__u32 rnd = test_mode ? skb->cb[2] : next_random(&cs->rng);
	int sampled = (rnd & cfg->track_mask) == 0;
	int dry = cfg->dry_run != 0;
	if (class == CLASS_INVALID) {
		// No clock for an invalid datagram, but for the sampled ones.
		__u32 reason = v.reason;
		// Verifier workaround: v.reason is a byte, and without the
		// barrier clang tests the byte but indexes with the wider value
		// it came from, masked again later, whose bound the verifier
		// does not know. The barrier makes it truncate first.
		barrier_var(reason);
		if (reason >= NUM_REASONS) // cannot happen; bounds the index for the verifier
			reason = REASON_UNPARSED;
		st->invalid[dry][family_slot(k.family)][reason]++;
		if (sampled)
			track_invalid(cfg, &k, reason, clock(cfg, cs, skb));
		v.drop = 1;
		if (test_mode)
			bpf_map_update_elem(&test_verdict, &zero, &v, BPF_ANY);
		return dry ? skb->len : 0;
	}
	__u64 now = clock(cfg, cs, skb);
	if (class == CLASS_NEGOTIATION) {
		v.paced = pace(cfg, now);
		int neg = v.paced ? NEG_PASSED : dry ? NEG_WOULD_DROP : NEG_DROPPED;
		st->negotiation[family_slot(k.family)][neg]++;
		v.drop = !v.paced;
		if (test_mode)
			bpf_map_update_elem(&test_verdict, &zero, &v, BPF_ANY);
		return neg == NEG_DROPPED ? 0 : skb->len;
	}
	if (id_slot)
		refresh_server_id(id_slot, now);
	// The allowlist exempts from the limits, not from validity: an
	// allowlisted source's invalid datagrams (its blocked ports among
	// them) and unknown versions were decided above, as anyone's, since a
	// spoofer can send from an allowlisted address.
	if (cfg->allow_any && allow_candidate(cfg, &k) && allowlisted(&k)) {
		st->allowed[family_slot(k.family)]++;
		if (test_mode) {
			v.allowlisted = 1;
			bpf_map_update_elem(&test_verdict, &zero, &v, BPF_ANY);
		}
		return skb->len;
	}
	k.rank_first = v.verified == VERIFIED_OPENING_FROM_PEER;
	if (bench_random_source) {
		__u32 r = next_random(&cs->rng);

		k.words[0] ^= r;
		if (k.has_ports)
			k.sport ^= r >> 16;
	}

	// Opening (0), established (1) or unverified (2) here; bounds the
	// index for the verifier.
	class = limiter_class(class);
	int drop = decide(cfg, class, &k, now, rnd, &v);
	if (drop < 0) {
		st->errors++;
		drop = 0;
	}
	int fam = family_slot(k.family);
	__u32 lvl = v.level;
	if (lvl >= MAX_LEVELS) // cannot happen; bounds the index for the verifier
		lvl = MAX_LEVELS - 1;
	if (test_mode)
		bpf_map_update_elem(&test_verdict, &zero, &v, BPF_ANY);
	if (drop) {
		if (sampled)
			track(cfg, class, &k, &v, now);
		if (dry) {
			st->would_drop[class][fam][lvl]++;
			return skb->len;
		}
		st->dropped[class][fam][lvl]++;
		return 0;
	}
	st->passed[class][fam]++;
	if (v.limited)
		st->limited[class][fam][lvl]++;
	return skb->len;
}
