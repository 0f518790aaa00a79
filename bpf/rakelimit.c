//go:build ignore

// rakelimit.c: the hierarchical fair-share rate limiter as a BPF socket filter.
//
// The program performs, operation for operation, what Limiter.Decide in
// internal/sketch does; the algorithm, its parameters and error bounds are
// documented there. Tests run one packet trace through both and compare the
// verdicts and every sketch cell bit for bit, so any change here must be made
// there too (and the other way round).
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
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Fixed point and time, as in internal/sketch/fixed.go and config.go.
#define FRAC_BITS 24
#define LOW24 ((1ULL << FRAC_BITS) - 1)
#define LOW32 0xffffffffULL
#define EPOCH_SHIFT 20
#define SLOT_SHIFT 12
#define SLOTS (1 << (EPOCH_SHIFT - SLOT_SHIFT))
#define DECAY_BITS 9
#define DECAY_ENTRIES (1 << DECAY_BITS)
#define DECAY_MASK (DECAY_ENTRIES - 1)
#define DECAY_HORIZON (1ULL << (3 * DECAY_BITS))

// Lattice and sketch dimensions, as in internal/sketch.
#define MAX_PREFIXES 4
#define MAX_NODES (MAX_PREFIXES * 4)
#define MAX_LEVELS (MAX_PREFIXES + 2)
#define DEPTH 2
#define WIDTH_BITS 12
#define WIDTH (1 << WIDTH_BITS)
#define HASH_WORDS 6
#define PORT_WORD (HASH_WORDS - 1)

// Stream tracking: only a sample of drops (config.track_mask) looks up the
// tracking map, which keeps the drop path's cost flat under a flood.
#define MAX_TRACKED_STREAMS 1024
#define EVENTS_BYTES (64 * 1024)
#define MAX_ALLOW 1024
// The allowlist's quick-reject filter: 2^10 buckets per family, keyed by a
// multiplicative hash of the address's top 16 (IPv4) or 32 (IPv6) bits.
#define ALLOW_FILTER_SHIFT 10
#define ALLOW_FILTER_BITS (1 << ALLOW_FILTER_SHIFT)
#define ALLOW_HASH_MUL 0x9E3779B1U

#define CLASS_CLEAN 0
#define CLASS_LIMITED 1

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
// Extension headers walked before the parser gives up looking for UDP.
#define IPV6_MAX_EXT 6

// One count-min cell: see Cell in internal/sketch/limiter.go.
struct counter {
	__u64 offered;
	__u64 forwarded;
};

struct cell {
	__u64 epoch;
	struct counter class[2];
};

// The compiled configuration (sketch.Params) and the hash key. Userspace
// writes the inactive one of two copies and then flips active_config, so a
// packet never sees half an update.
struct config {
	__u64 thresh[MAX_NODES];
	__u64 over[MAX_NODES];
	__u64 g[SLOTS];
	__u64 ginv[SLOTS];
	__u64 d0[DECAY_ENTRIES];
	__u64 d1[DECAY_ENTRIES];
	__u64 d2[DECAY_ENTRIES];
	__u64 hash_a[DEPTH][HASH_WORDS];
	__u64 hash_b[DEPTH];
	// By family (0 IPv4, 1 IPv6) and prefix slot: the family word hashed
	// (0 for a /0 prefix) and the mask of each address word.
	__u64 family_word[2][MAX_PREFIXES];
	__u32 mask[2][MAX_PREFIXES][4];
	// allow_filter, by family: a bit per bucket of allow_bucket() values
	// that an allowlisted prefix covers. A packet whose bucket is clear is
	// not in the allowlist, and the trie is not looked up.
	__u64 allow_filter[2][ALLOW_FILTER_BITS / 64];
	__u8 nodes[MAX_NODES];
	__u8 prefix4[MAX_PREFIXES];
	__u8 prefix6[MAX_PREFIXES];
	__u8 num_nodes;
	__u8 num_prefixes;
	__u8 per_dport;
	// dry_run: decide and count as usual, but deliver every packet.
	__u8 dry_run;
	// allow_any: the allowlist has entries (otherwise it is not looked up).
	__u8 allow_any;
	// allow_always, by family: an allowlisted prefix is too short for
	// allow_filter, so every packet of the family is looked up.
	__u8 allow_always[2];
	// A drop is tracked when a random number has none of these bits set:
	// 2^k - 1 tracks one drop in 2^k, 0 every drop.
	__u32 track_mask;
};

// Per-CPU packet counters by family (unknown, IPv4, IPv6). limited counts
// packets that passed although a node at that level found their stream over
// its limit; dropped counts drops by the level of the node that dropped.
struct stats {
	__u64 passed[FAMILY_SLOTS];
	__u64 limited[FAMILY_SLOTS][MAX_LEVELS];
	__u64 dropped[FAMILY_SLOTS][MAX_LEVELS];
	// would_drop: drops a dry run delivered; allowed: allowlisted packets,
	// not counted by the limiter.
	__u64 would_drop[FAMILY_SLOTS][MAX_LEVELS];
	__u64 allowed[FAMILY_SLOTS];
	__u64 errors;
};

// A stream as a lattice node sees it: the packet's key reduced to what the
// node counts (address masked to the node's prefix, wildcard ports zero).
struct stream_key {
	__u32 words[4];
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 node;
	__u8 pad[2];
};

// What the kernel remembers of a stream it has dropped packets of.
struct stream_state {
	__u64 first_ns;
	__u64 last_ns;
	// sampled_drops counts the drops that were sampled (track_mask).
	__u64 sampled_drops;
	// estimate is the node's rate estimate at the last sampled drop, a
	// decayed count per window, Q24.
	__u64 estimate;
	__u8 level;
	__u8 dry_run;
	__u8 pad[6];
};

// The event sent to userspace when the kernel starts tracking a stream.
struct stream_event {
	struct stream_key key;
	struct stream_state state;
};

// Allowlist key: prefix length, then the address, IPv4 mapped into
// ::ffff:0:0/96 so that one trie serves both families.
struct allow_key {
	__u32 prefixlen;
	__u8 addr[16];
};

// The last verdict, written in test mode only.
struct verdict {
	__u8 drop;
	__u8 limited;
	__u8 level;
	__u8 node;
	__u32 pad;
	__u64 estimate;
};

struct key {
	__u32 words[4];
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 has_ports;
};

// Sized by the loader: one sketch per lattice node.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct cell);
	__uint(max_entries, MAX_NODES * DEPTH * WIDTH);
} cells SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct config);
	__uint(max_entries, 2);
} configs SEC(".maps");

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
	__type(key, struct allow_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_ALLOW);
} allowlist SEC(".maps");

// Per-CPU xorshift state, seeded with random non-zero values by the loader.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} prng SEC(".maps");

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
// bench_random_source: XOR the source address with a random number, so that
// a benchmark repeating one packet sees a new source every time.
const volatile __u8 bench_random_source = 0;

static __always_inline __u64 mulq32(__u64 a, __u64 b)
{
	return (a >> 32) * b + (((a & LOW32) * b) >> 32);
}

static __always_inline __u64 mulq24(__u64 a, __u64 b)
{
	return (a >> FRAC_BITS) * b + (((a & LOW24) * b) >> FRAC_BITS);
}

static __always_inline __u64 sat_add(__u64 a, __u64 b)
{
	__u64 s = a + b;

	return s < a ? ~0ULL : s;
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

// load_head reads, from the network header on, full_len bytes (the header
// and the UDP ports right after it) or, when the packet is shorter, hdr_len
// bytes (the header alone). Returns 1, 0, or -1 when not even the header is
// there. One load is the common case; a short packet costs a second.
static __always_inline int load_head(struct __sk_buff *skb, void *buf, __u32 hdr_len, __u32 full_len)
{
	if (bpf_skb_load_bytes_relative(skb, 0, buf, full_len, BPF_HDR_START_NET) == 0)
		return 1;
	return bpf_skb_load_bytes_relative(skb, 0, buf, hdr_len, BPF_HDR_START_NET) == 0 ? 0 : -1;
}

static __always_inline void set_ports(struct key *k, __be16 sport, __be16 dport)
{
	k->has_ports = 1;
	k->sport = bpf_ntohs(sport);
	k->dport = bpf_ntohs(dport);
}

// parse_ipv4 fills the key from an IPv4 packet. One load covers the header
// without options and the UDP ports; options or a short packet cost a second.
static __always_inline void parse_ipv4(struct __sk_buff *skb, struct key *k)
{
	struct {
		struct iphdr ip;
		__be16 sport;
		__be16 dport;
	} h;
	int full = load_head(skb, &h, sizeof(h.ip), sizeof(h));

	if (full < 0)
		return; // no address: counted as unknown
	k->family = FAMILY_IPV4;
	k->words[0] = bpf_ntohl(h.ip.saddr);
	// A non-first fragment carries no transport header.
	if (!is_udp(h.ip.protocol) || (h.ip.frag_off & bpf_htons(IPV4_FRAG_OFFSET_MASK)))
		return;
	__u32 off = h.ip.ihl * 4;
	if (off != IPV4_MIN_HDR_LEN) {
		if (off < IPV4_MIN_HDR_LEN ||
		    bpf_skb_load_bytes_relative(skb, off, &h.sport, 2 * sizeof(__be16), BPF_HDR_START_NET) < 0)
			return;
	} else if (!full) {
		return;
	}
	set_ports(k, h.sport, h.dport);
}

// parse_ipv6 fills the key from an IPv6 packet, walking up to IPV6_MAX_EXT
// extension headers to the UDP header.
static __always_inline void parse_ipv6(struct __sk_buff *skb, struct key *k)
{
	struct {
		struct ipv6hdr ip;
		__be16 sport;
		__be16 dport;
	} h;
	int full = load_head(skb, &h, sizeof(h.ip), sizeof(h));

	if (full < 0)
		return;
	k->family = FAMILY_IPV6;
#pragma unroll
	for (int i = 0; i < 4; i++)
		k->words[i] = bpf_ntohl(h.ip.saddr.in6_u.u6_addr32[i]);

	__u8 next = h.ip.nexthdr;
	if (is_udp(next)) {
		if (full)
			set_ports(k, h.sport, h.dport);
		return;
	}
	__u32 off = IPV6_HDR_LEN;
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
	if (!is_udp(next) ||
	    bpf_skb_load_bytes_relative(skb, off, &h.sport, 2 * sizeof(__be16), BPF_HDR_START_NET) < 0)
		return;
	set_ports(k, h.sport, h.dport);
}

// addr_hash: the address part of row r's hash for prefix slot s, over the
// first `words` address words (a constant, so that the loop unrolls).
// parse fills the key from the packet's headers; a field it cannot read is
// left zero (family unknown, no ports). A global function, so that the
// verifier walks its many paths once instead of the node loop once for each.
__noinline int parse(struct __sk_buff *skb, struct key *k)
{
	if (!k)
		return 0;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		parse_ipv4(skb, k);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		parse_ipv6(skb, k);
	return 0;
}

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

static __always_inline __u64 decay(const struct config *cfg, __u64 k)
{
	if (k < DECAY_ENTRIES)
		return cfg->d0[k];
	if (k >= DECAY_HORIZON)
		return 0;
	__u64 d = mulq32(cfg->d0[k & DECAY_MASK], cfg->d1[(k >> DECAY_BITS) & DECAY_MASK]);
	return mulq32(d, cfg->d2[(k >> (2 * DECAY_BITS)) & DECAY_MASK]);
}

// rescale brings a cell last touched in an older epoch to `epoch`, decaying
// its counters by the idle time. It is a global function on purpose: the
// verifier checks it once instead of at every call site in every iteration
// of the node loop (which kept verification near the kernel's limit of a
// million instructions), and the hot path, a cell already touched in this
// epoch, does not call it.
//
// Two CPUs may find the same cell stale at once; the compare-and-swap on the
// epoch lets only one of them decay it.
__noinline int rescale(struct cell *c, const struct config *cfg, __u64 epoch)
{
	if (!c || !cfg)
		return 0;
	__u64 last = c->epoch;
	if (last == epoch || __sync_val_compare_and_swap(&c->epoch, last, epoch) != last)
		return 0;
	__u64 d = decay(cfg, epoch - last);
	c->class[0].offered = mulq32(c->class[0].offered, d);
	c->class[0].forwarded = mulq32(c->class[0].forwarded, d);
	c->class[1].offered = mulq32(c->class[1].offered, d);
	c->class[1].forwarded = mulq32(c->class[1].forwarded, d);
	return 0;
}

static __always_inline void set_verdict(struct verdict *v, int drop, int level, __u8 n, __u64 estimate)
{
	v->drop = drop;
	v->limited = 1;
	v->level = level;
	v->node = n;
	v->estimate = estimate;
}

// decide: Limiter.Decide. Returns 1 to drop, 0 to pass, -1 when the sketch
// cannot be reached; fills v.
static __always_inline int decide(const struct config *cfg, const struct key *k, __u64 now, __u32 rnd,
				  struct verdict *v)
{
	__u64 epoch = now >> EPOCH_SHIFT;
	__u32 slot = (now >> SLOT_SHIFT) & (SLOTS - 1);
	__u64 g = cfg->g[slot];
	__u64 dither = rnd >> (32 - FRAC_BITS);
	// The address hashes of the prefix slot last used: nodes come in
	// prefix order, so each slot is hashed once, and only if the packet
	// gets that far.
	__u64 ah[DEPTH] = {};
	int hashed = -1;
	int class = CLASS_CLEAN, pending = 0, level = 0;

	// A real loop, not unrolled: unrolling all MAX_NODES iterations makes
	// the program several times larger, and a socket filter's size is
	// charged to the socket's optmem (net.core.optmem_max).
#pragma clang loop unroll(disable)
	for (int i = 0; i < MAX_NODES; i++) {
		if (i >= cfg->num_nodes)
			break;
		__u8 n = cfg->nodes[i];
		if (node_level(n) != level) {
			level = node_level(n);
			if (pending)
				class = CLASS_LIMITED;
		}
		if (!applies(cfg, n, k))
			continue;

		__u64 pw = port_word(cfg, n, k);
		int p = node_prefix(n) & (MAX_PREFIXES - 1);
		if (p != hashed) {
			addr_hashes(cfg, k, p, ah);
			hashed = p;
		}
		struct counter *rows[DEPTH];
		__u64 omin = ~0ULL, fmin = ~0ULL;
#pragma unroll
		for (int r = 0; r < DEPTH; r++) {
			__u64 h = ah[r] + cfg->hash_a[r][PORT_WORD] * pw + cfg->hash_b[r];
			__u32 idx = (i * DEPTH + r) * WIDTH + (__u32)(h >> (64 - WIDTH_BITS));
			struct cell *c = bpf_map_lookup_elem(&cells, &idx);
			// The loader sizes the map for every node; a miss means a
			// broken load. Count it and let the packet through.
			if (!c)
				return -1;
			if (c->epoch != epoch)
				rescale(c, cfg, epoch);
			struct counter *ctr = &c->class[class];
			ctr->offered = sat_add(ctr->offered, g);
			omin = min64(omin, ctr->offered);
			fmin = min64(fmin, ctr->forwarded);
			rows[r] = ctr;
		}
		__u64 thr = cfg->thresh[i];
		if (thr != ~0ULL && omin > mulq24(thr, g)) {
			if (omin > mulq24(cfg->over[i], g) && fmin >= mulq24(thr - dither, g)) {
				set_verdict(v, 1, level, n, mulq32(omin, cfg->ginv[slot]));
				return 1;
			}
			if (!v->limited)
				set_verdict(v, 0, level, n, mulq32(omin, cfg->ginv[slot]));
			pending = 1;
			// Over the limit the forwarded count decides, so no
			// increment may be lost to another CPU: add atomically.
			// It stays near the threshold, far from overflowing, so
			// the saturating add below would give the same sum.
#pragma unroll
			for (int r = 0; r < DEPTH; r++)
				__sync_fetch_and_add(&rows[r]->forwarded, g);
			continue;
		}
#pragma unroll
		for (int r = 0; r < DEPTH; r++)
			rows[r]->forwarded = sat_add(rows[r]->forwarded, g);
	}
	return 0;
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

// allowlisted looks the source address up in the allowlist.
static __always_inline int allowlisted(const struct key *k)
{
	struct allow_key ak = {.prefixlen = 128};

	if (k->family == FAMILY_IPV4) {
		ak.addr[10] = 0xff;
		ak.addr[11] = 0xff;
		*(__u32 *)&ak.addr[12] = bpf_htonl(k->words[0]);
	} else if (k->family == FAMILY_IPV6) {
#pragma unroll
		for (int i = 0; i < 4; i++)
			*(__u32 *)&ak.addr[4 * i] = bpf_htonl(k->words[i]);
	} else {
		return 0;
	}
	return bpf_map_lookup_elem(&allowlist, &ak) != NULL;
}

// track records a drop of the stream that node v->node saw, and tells
// userspace when the stream is new.
static __always_inline void track(const struct config *cfg, const struct key *k, const struct verdict *v,
				  __u64 now)
{
	__u8 n = v->node;
	int fi = k->family == FAMILY_IPV6;
	int p = node_prefix(n) & (MAX_PREFIXES - 1);
	struct stream_key sk = {.family = k->family, .node = n, .dport = k->dport};

#pragma unroll
	for (int i = 0; i < 4; i++)
		sk.words[i] = k->words[i] & cfg->mask[fi][p][i];
	if (!node_sport_any(n))
		sk.sport = k->sport;
	struct stream_state *st = bpf_map_lookup_elem(&streams, &sk);
	if (st) {
		st->last_ns = now;
		st->sampled_drops++;
		st->estimate = v->estimate;
		return;
	}
	struct stream_event ev = {
		.key = sk,
		.state = {.first_ns = now, .last_ns = now, .sampled_drops = 1, .estimate = v->estimate,
			  .level = v->level, .dry_run = cfg->dry_run},
	};
	// Only the CPU that creates the entry reports it.
	if (bpf_map_update_elem(&streams, &sk, &ev.state, BPF_NOEXIST) == 0)
		bpf_ringbuf_output(&events, &ev, sizeof(ev), 0);
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
	__u64 *rng = bpf_map_lookup_elem(&prng, &zero);
	if (!sel || !st || !rng)
		return skb->len;
	__u32 which = *sel & 1;
	const struct config *cfg = bpf_map_lookup_elem(&configs, &which);
	if (!cfg)
		return skb->len;

	struct key k = {};
	parse(skb, &k);
	// The family's counter index is computed where it is used, after the
	// node loop: kept live across it, each of its three values would make
	// the verifier walk the loop once more.
	if (cfg->allow_any && allow_candidate(cfg, &k) && allowlisted(&k)) {
		st->allowed[family_slot(k.family)]++;
		return skb->len;
	}

	__u64 now;
	__u32 rnd;
	if (test_mode) {
		now = (__u64)skb->cb[1] << 32 | skb->cb[0];
		rnd = skb->cb[2];
	} else {
		now = bpf_ktime_get_ns();
		rnd = next_random(rng);
	}
	if (bench_random_source)
		k.words[0] ^= next_random(rng);

	struct verdict v = {};
	int drop = decide(cfg, &k, now, rnd, &v);
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
		if ((next_random(rng) & cfg->track_mask) == 0)
			track(cfg, &k, &v, now);
		if (cfg->dry_run) {
			st->would_drop[fam][lvl]++;
			return skb->len;
		}
		st->dropped[fam][lvl]++;
		return 0;
	}
	st->passed[fam]++;
	if (v.limited)
		st->limited[fam][lvl]++;
	return skb->len;
}
