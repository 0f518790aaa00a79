//go:build ignore

// rakelimit.c: the hierarchical fair-share rate limiter as a BPF socket filter,
// for the UDP socket of an HTTP/3 server, and as an XDP program, for the
// interfaces that carry its traffic: one decision, two entries, one object
// whose maps both share. Each entry has test and benchmark twins, compiled
// from the same inline functions with flags that leave the production
// entries free of their code (c/pkt.h).
//
// The program performs, operation for operation, what Filter.Decide in
// internal/decide does: the QUIC class of the datagram (internal/decide/quicclass),
// verified against the connection IDs the server issued, each bound to the
// address it was sent to, and the addresses that proved themselves through
// them (userspace learns the IDs and the addresses it answers from the
// server's own datagrams; the program adds the proven peers), then the version negotiation cap, or the
// allowlist and the class's limiter (Limiter.Decide in
// internal/decide/sketch, where the algorithm, its parameters and error bounds are
// documented). Tests run packet traces through both and compare verdicts,
// counters, learned times and every sketch cell bit for bit, so any change
// here must be made there too (and the other way round).
//
// The program is split as its Go twin is, a header in c/ for each Go file
// (each header names its twin). The constants the two share are generated
// from the Go source into c/contract.h (`make generate`), and the packet is
// read only through the functions of c/pkt.h, which each entry implements
// for its hook (c/pkt_skb.h, c/pkt_xdp.h).
//
//   c/contract.h   generated: the constants shared with Go
//   c/maps.h       the maps and the structures shared with userspace
//   c/pkt.h        the packet, whichever hook reads it
//   c/pkt_skb.h    the packet, as the socket filter reads it
//   c/pkt_xdp.h    the packet, as the XDP program reads it
//   c/listen.h     what the XDP program decides, and the socket filter not
//   c/parse.h      the datagram's key, from its headers (decide/parse.go)
//   c/quicclass.h  its QUIC class (decide/quicclass/quicclass.go)
//   c/learned.h    the learned server IDs, peers and credits (decide/learned.go)
//   c/verify.h     a datagram verified, and the proofs (decide/datagram.go)
//   c/pace.h       the pacers (sketch/pace.go)
//   c/allow.h      the allowlist (decide/allow.go)
//   c/fixed.h      fixed point (sketch/fixed.go)
//   c/hash.h       the key's hashes (sketch/hash.go)
//   c/lattice.h    the lattice's nodes (sketch/lattice.go)
//   c/cells.h      a cell's decay (sketch/cells.go)
//   c/node.h       one node's part in a decision (sketch/node.go)
//   c/fair.h       the fair total (sketch/fair.go)
//   c/total.h      the socket's total, counted per CPU (sketch/total.go)
//   c/screen.h     the screen (sketch/screen.go)
//   c/walk.h       the walk through the lattice (sketch/walk.go)
//   c/stream.h     the pacers and the tracked streams (decide/stream.go)

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#include "c/contract.h"
#include "c/maps.h"
#include "c/pkt.h"
#include "c/parse.h"
#include "c/quicclass.h"
#include "c/learned.h"
#include "c/verify.h"
#include "c/allow.h"
#include "c/walk.h"
#include "c/stream.h"
#include "c/listen.h"

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

// clock is the time of the packet: the kernel's monotonic clock, or in a
// test entry (TEST_INPUT in flags, c/pkt.h) the time the test gave it
// (pkt_test_now). The precise clock costs more than the rest of a drop (it
// reads the TSC and scales it); the coarse one, which the timer tick
// advances, costs a load and a comparison (tick_clock), and userspace picks
// it when the window is at least 100 ticks long, so that a packet's time is
// off by at most 1% of the window.
static __always_inline __u64 clock(const struct config *cfg, struct cpu_state *cs, pkt_ctx *ctx, int flags)
{
	if (flags & TEST_INPUT)
		return pkt_test_now(ctx);
	if (cfg->coarse_clock)
		return tick_clock(cfg, cs);
	return bpf_ktime_get_ns();
}

// family_slot is a family's index in struct stats (decide.FamilyIndex).
static __always_inline int family_slot(__u8 family)
{
	return family == FAMILY_IPV4 ? 1 : family == FAMILY_IPV6 ? 2 : 0;
}

// record_verdict writes v to test_verdict in a test entry (TEST_VERDICT in
// flags), for the test to read.
static __always_inline void record_verdict(const struct verdict *v, int flags)
{
	__u32 zero = 0;

	if (flags & TEST_VERDICT)
		bpf_map_update_elem(&test_verdict, &zero, v, BPF_ANY);
}

// decide_datagram decides the datagram of ctx, whose key parse filled (k),
// and returns the hook's verdict: Filter.Decide in internal/decide. Every
// entry inlines it, with its flags (c/pkt.h), a constant.
static __always_inline int decide_datagram(pkt_ctx *ctx, struct key *k, int flags)
{
	__u32 zero = 0;
	__u32 *sel = bpf_map_lookup_elem(&active_config, &zero);
	struct stats *st = bpf_map_lookup_elem(&counters, &zero);
	struct cpu_state *cs = bpf_map_lookup_elem(&cpu_state, &zero);
	if (!sel || !st || !cs)
		return pkt_pass(ctx);
	__u32 which = *sel & 1;
	const struct config *cfg = bpf_map_lookup_elem(&configs, &which);
	if (!cfg)
		return pkt_pass(ctx);

	struct verdict v = {.paced = 1};
	// The family's counter index is computed where it is used: kept live
	// across the node loop, each of its three values would make the
	// verifier walk the loop once more.

	int class = CLASS_OPENING;
	int check = CHECK_NONE;
	int has_id = 0;
	if (cfg->classify) {
		int c = classify(ctx, k, cfg);
		class = c & HDR_FIELD_MASK;
		v.reason = c >> HDR_REASON_SHIFT;
		check = (c >> HDR_CHECK_SHIFT) & HDR_FIELD_MASK;
		has_id = (c & HDR_HAS_ID) != 0;
	}
	// Verification reads the time (the proof pacer and the server ID's
	// stamp need it), and so does the limiter, again: a reading kept live
	// from here took the program's frame, with a callee's, past the
	// verifier's 512 bytes, and the clock costs a load and a comparison
	// within a tick (see tick_clock).
	if (check != CHECK_NONE) {
		int r = verify(cfg, k, check | (has_id ? HDR_HAS_ID : 0), clock(cfg, cs, ctx, flags), st);
		class = r & HDR_FIELD_MASK;
		v.reason = r >> HDR_REASON_SHIFT;
		v.verified = r >> HDR_VERIFIED_SHIFT;
	}
	v.class = class;
	if (v.verified != VERIFIED_NONE) {
		__u32 how = v.verified;
		// Verifier workaround, as for the invalid reason below: without
		// the barrier clang tests the byte but indexes with the wider
		// value it came from, whose bound the verifier does not know.
		barrier_var(how);
		if (how >= NUM_VERIFICATIONS) // cannot happen; bounds the index for the verifier
			how = VERIFIED_NONE;
		st->verified[family_slot(k->family)][how]++;
	}
	// One random number dithers the limiter (its top bits) and samples
	// drops for tracking (its low bits).
	__u32 rnd = flags & TEST_INPUT ? pkt_test_random(ctx) : next_random(&cs->rng);
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
		st->invalid[dry][family_slot(k->family)][reason]++;
		if (sampled)
			track_invalid(cfg, k, reason, clock(cfg, cs, ctx, flags));
		v.drop = 1;
		record_verdict(&v, flags);
		return dry ? pkt_pass(ctx) : pkt_drop(ctx);
	}
	__u64 now = clock(cfg, cs, ctx, flags);
	if (class == CLASS_NEGOTIATION) {
		v.paced = pace(cfg, now);
		int neg = v.paced ? NEG_PASSED : dry ? NEG_WOULD_DROP : NEG_DROPPED;
		st->negotiation[family_slot(k->family)][neg]++;
		v.drop = !v.paced;
		record_verdict(&v, flags);
		return neg == NEG_DROPPED ? pkt_drop(ctx) : pkt_pass(ctx);
	}
	// The allowlist exempts from the limits, not from validity: an
	// allowlisted source's invalid datagrams (its blocked ports among
	// them) and unknown versions were decided above, as anyone's, since a
	// spoofer can send from an allowlisted address.
	if (cfg->allow_any && allow_candidate(cfg, k) && allowlisted(k)) {
		st->allowed[family_slot(k->family)]++;
		v.allowlisted = 1;
		record_verdict(&v, flags);
		return pkt_pass(ctx);
	}
	k->returning = returning(v.verified);
	if (flags & BENCH_RANDOM_SOURCE) {
		__u32 r = next_random(&cs->rng);

		k->words[0] ^= r;
		if (k->has_ports)
			k->sport ^= r >> 16;
	}

	// The opening, established or unverified class here; bounds the
	// index for the verifier.
	class = limiter_class(class);
	int drop = decide(cfg, class, k, now, rnd, &v);
	if (drop < 0) {
		st->errors++;
		drop = 0;
	}
	int fam = family_slot(k->family);
	__u32 lvl = v.level;
	if (lvl >= MAX_LEVELS) // cannot happen; bounds the index for the verifier
		lvl = MAX_LEVELS - 1;
	record_verdict(&v, flags);
	if (drop) {
		if (sampled)
			track(cfg, class, k, &v, now);
		if (dry) {
			st->would_drop[class][fam][lvl]++;
			return pkt_pass(ctx);
		}
		st->dropped[class][fam][lvl]++;
		return pkt_drop(ctx);
	}
	st->passed[class][fam]++;
	if (v.limited)
		st->limited[class][fam][lvl]++;
	return pkt_pass(ctx);
}

// socket_entry is the socket filter with flags (c/pkt.h), a constant in
// each of its entries. It leaves alone, uncounted, what the XDP program
// passed (passed_at_xdp).
static __always_inline int socket_entry(struct __sk_buff *skb, int flags)
{
	pkt_ctx p = {};
	struct key k = {};

	skb_packet(&p, skb, flags);
	parse(&p, &k);
	if (passed_at_xdp(&k))
		return pkt_pass(&p);
	return decide_datagram(&p, &k, flags);
}

// xdp_entry is the XDP program with flags (c/pkt.h), a constant in each of
// its entries. It decides the datagrams to a listener, records those it
// passed for the socket filter, and passes everything else untouched
// (c/listen.h).
static __always_inline int xdp_entry(struct xdp_md *xdp, int flags)
{
	pkt_ctx p = {};
	struct key k = {};

	if (!xdp_packet(&p, xdp, flags))
		return XDP_PASS;
	parse(&p, &k);
	if (!listened(&p, &k))
		return XDP_PASS;
	// Two programs on one path (xdp_stacked): a datagram the one below
	// passed is passed on undecided.
	if (xdp_stacked) {
		__u64 mark = passed_mark(&k);
		__u64 *slot = passed_slot(mark);
		if (slot && xdp_seen(slot, mark))
			return XDP_PASS;
	}
	int ret = decide_datagram(&p, &k, flags);
	// Only a datagram passed is marked: a drop costs nothing more. The
	// decision changed the key only in a benchmark (BENCH_RANDOM_SOURCE,
	// which has no socket to read the record).
	if (ret == XDP_PASS) {
		__u64 mark = passed_mark(&k);
		__u64 *slot = passed_slot(mark);
		if (slot)
			xdp_record(slot, mark);
	}
	return ret;
}

// rakelimit: the socket filter, on every socket the limiter protects.
SEC("socket")
int rakelimit(struct __sk_buff *skb)
{
	return socket_entry(skb, 0);
}

// rakelimit_xdp: the XDP program, on the interfaces that carry the
// listeners' traffic in mode xdp.
SEC("xdp")
int rakelimit_xdp(struct xdp_md *xdp)
{
	return xdp_entry(xdp, 0);
}

// The entries that tests load in place of the production ones (loadOptions
// in program.go), never attached: rakelimit_test and rakelimit_xdp_test
// decide at the time and with the random number the test gives, and write
// the verdict to test_verdict; rakelimit_bench_random and
// rakelimit_xdp_bench_random give every datagram a random source, for the
// benchmarks (LoadBench).
SEC("socket")
int rakelimit_test(struct __sk_buff *skb)
{
	return socket_entry(skb, TEST_INPUT | TEST_VERDICT);
}

SEC("xdp")
int rakelimit_xdp_test(struct xdp_md *xdp)
{
	return xdp_entry(xdp, TEST_INPUT | TEST_VERDICT);
}

SEC("socket")
int rakelimit_bench_random(struct __sk_buff *skb)
{
	return socket_entry(skb, BENCH_RANDOM_SOURCE);
}

SEC("xdp")
int rakelimit_xdp_bench_random(struct xdp_md *xdp)
{
	return xdp_entry(xdp, BENCH_RANDOM_SOURCE);
}
