// listen.h: which datagrams the XDP program decides, and how the socket
// filter knows which it decided. No Go twin: the userspace mode decides what
// its socket reads. Written by internal/kernel/xdp.go.
//
// The XDP program sees every frame that reaches its interface, before
// routing. It decides the UDP datagrams to a listener (listened): to a port
// and an address the limiter listens on. A wildcard listener's addresses
// are the host's own, which userspace keeps current (internal/engine) in
// the port table (a few, scanned), or lists one by one (listen_addrs) on a
// port where another socket is bound to one of them, or for a host with
// many: forwarded traffic, a macvlan child's in another namespace and
// another process's socket are not the limiter's, and pass untouched.
// So does everything else: other ports and protocols, ARP, VLAN-tagged
// frames, non-first fragments (no port). A first fragment carries the port
// and is decided as the datagram it starts (QUIC datagrams are never
// fragmented, RFC 9000 section 14): dropped, the datagram never
// reassembles; passed, its reassembly is the datagram it recorded.
//
// A datagram is decided once, whatever happens to it between the two hooks.
// The XDP program records each datagram it passed (xdp_record), in a table
// of the CPU it runs on (xdp_passed), under a mark of what the stack leaves
// as it was (passed_mark: the source address and the payload's first
// bytes; NAT may rewrite the destination, and the source port too, a
// VLAN's tag may be stripped, a bridge may take the frame up). The socket
// filter leaves one datagram alone for each record it finds, and consumes
// the record (passed_at_xdp); it decides every other datagram. Nothing is
// inferred from where a datagram arrived or what its headers say by then:
// a port redirected to a listener's is decided at the socket, since the
// XDP program, which saw another port, recorded nothing.
//
// The socket filter runs on the CPU that ran the XDP program (the same
// receive softirq), unless RPS or RFS steers the packet to another: then it
// finds no record and decides the datagram again (counted twice, never
// not at all). A record overwritten before the socket filter reads it (two
// marks in one slot while the stack holds both, the table's XDP_PASSED_SLOTS
// slots against a NAPI poll's 64 frames) does the same.
//
// A record proves nothing a sender could forge: the mark is keyed with a
// secret of each load (mark_key), so that a datagram the XDP program did
// not decide matches one only by carrying the source address and first
// bytes of a datagram it passed (or, with odds of 2^-32 for each datagram,
// by chance), and that datagram, finding no record, is decided at the
// socket. Each decision skipped costs the sender one decided, so a copied
// mark gains it nothing.
//
// Stacked devices (a bridge and its port, a VLAN and its parent, both with
// the program, one of them generic XDP) run the program twice on one
// datagram: while userspace says the program runs on such a pair
// (xdp_stacked), a run that finds an unconsumed record of its datagram
// passes it undecided (xdp_seen), once for each record, so that a datagram
// passed below is not decided again above. Otherwise a run looks for no
// record, and only a datagram it passes costs it a mark.
#ifndef RAKELIMIT_LISTEN_H
#define RAKELIMIT_LISTEN_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"
#include "parse.h"
#include "pkt.h"

// host_addr reports whether addr, of family v6 or IPv4, is one of the
// host's addresses in lp (a wildcard listener's: struct listen_table).
static __always_inline int host_addr(const struct listen_table *lp, int v6, const __u32 *addr)
{
	if (!v6) {
		__u32 n = lp->host4_n;
#pragma unroll
		for (int i = 0; i < MAX_HOST_ADDRS; i++) {
			if (i >= n)
				return 0;
			if (lp->host4[i] == addr[0])
				return 1;
		}
		return 0;
	}
	__u32 n = lp->host6_n;
#pragma unroll
	for (int i = 0; i < MAX_HOST_ADDRS; i++) {
		if (i >= n)
			return 0;
		const __u32 *h = lp->host6[i];
		if (h[3] == addr[3] && h[2] == addr[2] && h[1] == addr[1] && h[0] == addr[0])
			return 1;
	}
	return 0;
}

// listened reports whether the datagram of key k is to a listener of the
// limiter: its port has listeners of its family (listen_ports), and its
// destination address is one of the host's for a wildcard listener (a
// scan of a few, cheaper than the hash's lookup) or one of those listed
// (listen_addrs).
static __always_inline int listened(const pkt_ctx *ctx, const struct key *k)
{
	__u32 zero = 0;

	if (!k->has_ports)
		return 0;
	const struct listen_table *lp = bpf_map_lookup_elem(&listen_ports, &zero);
	if (!lp)
		return 0;
	int v6 = k->family == FAMILY_IPV6;
	__u8 kinds = lp->kinds[k->dport] & (v6 ? LISTEN_HOST6 | LISTEN_SOME6 : LISTEN_HOST4 | LISTEN_SOME4);
	if (!kinds)
		return 0;
	struct listen_key lk = {.port = k->dport, .family = k->family};
	// Two loads of constant sizes: the XDP program's loads are direct.
	long err = v6 ? pkt_load_net(ctx, __builtin_offsetof(struct ipv6hdr, daddr), lk.addr, 16)
		      : pkt_load_net(ctx, __builtin_offsetof(struct iphdr, daddr), lk.addr, 4);
	if (err < 0)
		return 0;
	if ((kinds & (LISTEN_HOST4 | LISTEN_HOST6)) && host_addr(lp, v6, lk.addr))
		return 1;
	return (kinds & (LISTEN_SOME4 | LISTEN_SOME6)) && bpf_map_lookup_elem(&listen_addrs, &lk) != NULL;
}

// A slot of xdp_passed: the mark's top bits (PASSED_TAG), how many XDP runs
// above may still pass the datagram undecided (PASSED_SKIPS) and how many
// datagrams of the mark the socket filter may leave alone (PASSED_COUNT).
#define PASSED_TAG (~0xffffULL)
#define PASSED_SKIPS_SHIFT 8
#define PASSED_COUNT 0xffULL

// passed_word is the 64-bit word of the two 32-bit ones at p, 4-byte
// aligned in struct key (the address's words, and the probe at offset 24):
// two loads. Read through a __u32 pointer: memcpy from a pointer of
// unknown alignment becomes byte loads, whose registers spill onto the
// entries' frames (verifier workaround: the frames and the deepest call
// must fit 512 bytes together).
static __always_inline __u64 passed_word(const void *p)
{
	const __u32 *w = p;

	return (__u64)w[1] << 32 | w[0];
}

// mark_term is the i-th term of passed_mark, of the 64-bit word at p: its
// two halves, each plus a 32-bit word of the key, multiplied (NH, the
// universal hash of UMAC: two words that differ collide under a random key
// with odds of at most 2^-32, and the key is never shown).
static __always_inline __u64 mark_term(const void *p, int i)
{
	__u64 w = passed_word(p);
	__u32 lo = (__u32)w + mark_key[2 * i], hi = (__u32)(w >> 32) + mark_key[2 * i + 1];

	return (__u64)lo * hi;
}

// passed_mark is the mark of the datagram of key k: its source address and
// the first 24 bytes of its payload (the probe), which neither NAT nor the
// stack changes between the XDP program and the socket filter. Not its
// source port: netfilter gives an inbound flow another one where the flow's
// reply would be another flow's (a client's port that reached a port
// redirected to the listener's, then the listener's port straight), and
// the datagram would be decided again at the socket. PASSED_MARK_WORDS
// 64-bit words, each a keyed term (mark_term), summed and mixed: the
// multiplications do not wait on each other.
static __always_inline __u64 passed_mark(const struct key *k)
{
	__u64 h = mark_term(&k->words[0], 0);

	// Verifier workaround: a barrier after each term keeps clang from
	// interleaving the terms' loads, whose registers spilled onto the
	// entries' frames past the 512 bytes the verifier allows a program
	// and its deepest call together.
	barrier_var(h);
	h += mark_term(&k->words[2], 1);
	barrier_var(h);
	h += mark_term(k->probe, 2);
	barrier_var(h);
	h += mark_term(k->probe + 8, 3);
	barrier_var(h);
	h += mark_term(k->probe + 16, 4);
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	return h ^ (h >> 32);
}

// passed_slot is the slot of mark in this CPU's xdp_passed, or NULL.
static __always_inline __u64 *passed_slot(__u64 mark)
{
	__u32 zero = 0;
	struct xdp_passed *t = bpf_map_lookup_elem(&xdp_passed, &zero);

	if (!t)
		return NULL;
	return &t->slot[(mark >> 16) & (XDP_PASSED_SLOTS - 1)];
}

// xdp_seen reports, at the XDP program, whether a run below this one passed
// the datagram of mark (an unconsumed record with a skip left), and takes
// the skip.
static __always_inline int xdp_seen(__u64 *slot, __u64 mark)
{
	__u64 s = *slot;

	if ((s & PASSED_TAG) != (mark & PASSED_TAG) || !(s & PASSED_COUNT) || !(s >> PASSED_SKIPS_SHIFT & 0xff))
		return 0;
	*slot = s - (1ULL << PASSED_SKIPS_SHIFT);
	return 1;
}

// xdp_record records, at the XDP program, that it passed a datagram of
// mark: one more for the socket filter to leave alone, and one more skip
// for a run above, each up to 255; a record of another mark in the slot is
// overwritten (that datagram will be decided twice).
static __always_inline void xdp_record(__u64 *slot, __u64 mark)
{
	__u64 s = *slot;

	if ((s & PASSED_TAG) != (mark & PASSED_TAG) || !(s & PASSED_COUNT)) {
		*slot = (mark & PASSED_TAG) | 1ULL << PASSED_SKIPS_SHIFT | 1;
		return;
	}
	__u64 count = s & PASSED_COUNT, skips = s >> PASSED_SKIPS_SHIFT & 0xff;
	if (count < 0xff)
		count++;
	if (skips < 0xff)
		skips++;
	*slot = (s & PASSED_TAG) | skips << PASSED_SKIPS_SHIFT | count;
}

// passed_at_xdp reports, at the socket filter, whether the XDP program
// passed the datagram of key k (a record of its mark), and consumes the
// record. Without the XDP program anywhere (xdp_interfaces 0), the socket
// filter pays one load.
static __always_inline int passed_at_xdp(const struct key *k)
{
	if (!xdp_interfaces)
		return 0;
	__u64 mark = passed_mark(k);
	__u64 *slot = passed_slot(mark);
	if (!slot)
		return 0;
	__u64 s = *slot;
	if ((s & PASSED_TAG) != (mark & PASSED_TAG) || !(s & PASSED_COUNT))
		return 0;
	// One datagram fewer to leave alone, and one skip fewer: no run
	// above can be waiting for a datagram that reached the socket.
	__u64 count = (s & PASSED_COUNT) - 1, skips = s >> PASSED_SKIPS_SHIFT & 0xff;
	if (skips > count)
		skips = count;
	*slot = (s & PASSED_TAG) | skips << PASSED_SKIPS_SHIFT | count;
	return 1;
}

#endif
