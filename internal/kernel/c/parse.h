// parse.h: what the filter reads of a datagram, from its network and
// transport headers. Go twin: internal/decide/parse.go (Parse, parseIPv4,
// parseIPv6, parseUDP, UDPPayloadLength), which reads the packet as
// BPF_PROG_TEST_RUN gives it to the program, whole in memory.
#ifndef RAKELIMIT_PARSE_H
#define RAKELIMIT_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "contract.h"
#include "pkt.h"

// A mask that keeps a probe index inside struct key (see probe_byte).
#define PROBE_MASK 31

// What the filter reads of a datagram: the key of the limiter (as
// sketch.Key, returning included), the UDP payload's length, its first
// bytes and its offset from the packet's start (pkt_load).
struct key {
	__u32 words[4];
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 has_ports;
	__u16 length;
	__u8 probe[PROBE_BYTES];
	// returning: a returning user's opening (sketch.Key.Returning).
	__u8 returning;
	__u16 payload_at;
	__u8 pad[2];
};
_Static_assert(__builtin_offsetof(struct key, probe) + PROBE_MASK < sizeof(struct key),
	       "a masked probe index stays inside struct key");
_Static_assert(PROBE_BYTES <= PROBE_MASK + 1, "the mask keeps every probe index");
_Static_assert(__builtin_offsetof(struct key, probe) % 4 == 0, "passed_word reads the probe 4 bytes at a time");

static __always_inline int is_udp(__u8 proto)
{
	return proto == IPPROTO_UDP || proto == IPPROTO_UDPLITE;
}

// udp_length (decide.UDPPayloadLength): the length of the payload of a
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
// long (decide.parseUDP).
//
// The payload's offset is from the packet's start, where pkt_load reads
// (pkt_payload_at).
//
// The length is the UDP payload's as a UDP socket receives it (see
// udp_length), bounded by the bytes the packet holds past the offset
// (pkt_len): the same length the userspace mode takes from the bytes it
// reads.
static __always_inline void set_udp(pkt_ctx *ctx, struct key *k, const struct udphdr *udp, __u32 off,
				    __u32 ip_len, int lite)
{
	k->has_ports = 1;
	k->sport = bpf_ntohs(udp->source);
	k->dport = bpf_ntohs(udp->dest);
	__u32 at = pkt_payload_at(ctx, off, ip_len);
	__u32 n = udp_length(bpf_ntohs(udp->len), off, ip_len, lite);
	__u32 present = pkt_len(ctx) > at ? pkt_len(ctx) - at : 0;
	k->length = n < present ? n : present;
	k->payload_at = at;
}

// load_probe reads the first bytes of the UDP payload when the one load of
// the headers could not: the payload is shorter than the probe, or lies
// where pkt_load_net cannot read it and pkt_load can: outside the skb's
// linear part (see pkt_load).
static __always_inline void load_probe(pkt_ctx *ctx, struct key *k)
{
	__u32 n = k->length;

	// Verifier workaround: k->length is 16 bits, and without the barrier
	// clang tests the wider value set_udp computed it from and truncates
	// it later, which may make it 0 after the test.
	barrier_var(n);
	// The verifier wants the length of a load bounded and non-zero.
	if (n == 0)
		return;
	// Verifier workaround: the verifiers of Linux 6.1 and 7.3 learn no
	// lower bound from n != 0 here (6.12's and 6.18's do), and refuse the
	// load ("invalid zero-sized read"); so the length is the index of its
	// last byte, bounded from above, plus one, and the barrier keeps clang
	// from folding that back into n.
	__u32 last = n - 1;
	if (last >= PROBE_BYTES)
		last = PROBE_BYTES - 1;
	barrier_var(last);
	pkt_load(ctx, k->payload_at, k->probe, last + 1);
}

// load_udp reads the UDP header at off and the probe after it.
static __always_inline void load_udp(pkt_ctx *ctx, struct key *k, __u32 off, __u32 ip_len, int lite)
{
	struct {
		struct udphdr udp;
		__u8 probe[PROBE_BYTES];
	} h;

	if (pkt_load_net(ctx, off, &h, sizeof(h)) == 0) {
		set_udp(ctx, k, &h.udp, off, ip_len, lite);
		__builtin_memcpy(k->probe, h.probe, PROBE_BYTES);
		return;
	}
	if (pkt_load_net(ctx, off, &h.udp, sizeof(h.udp)) < 0)
		return;
	set_udp(ctx, k, &h.udp, off, ip_len, lite);
	load_probe(ctx, k);
}

// parse_ipv4 fills the key from an IPv4 packet. One load covers the header
// without options, the UDP header and the probe; options or a short packet
// cost more.
static __always_inline void parse_ipv4(pkt_ctx *ctx, struct key *k)
{
	struct {
		struct iphdr ip;
		struct udphdr udp;
		__u8 probe[PROBE_BYTES];
	} h;
	int full = pkt_loaded(ctx, pkt_load_net(ctx, 0, &h, sizeof(h)));

	if (!full && pkt_load_net(ctx, 0, &h.ip, sizeof(h.ip)) < 0)
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
		set_udp(ctx, k, &h.udp, off, ip_len, h.ip.protocol == IPPROTO_UDPLITE);
		__builtin_memcpy(k->probe, h.probe, PROBE_BYTES);
		return;
	}
	load_udp(ctx, k, off, ip_len, h.ip.protocol == IPPROTO_UDPLITE);
}

// parse_ipv6 fills the key from an IPv6 packet, walking up to IPV6_MAX_EXT
// extension headers to the UDP header. As in parse_ipv4, one load covers
// the header, the UDP header and the probe when no extension header comes
// between them; extension headers or a short packet cost more.
static __always_inline void parse_ipv6(pkt_ctx *ctx, struct key *k)
{
	struct {
		struct ipv6hdr ip;
		struct udphdr udp;
		__u8 probe[PROBE_BYTES];
	} h;
	int full = pkt_loaded(ctx, pkt_load_net(ctx, 0, &h, sizeof(h)));

	if (!full && pkt_load_net(ctx, 0, &h.ip, sizeof(h.ip)) < 0)
		return;
	k->family = FAMILY_IPV6;
#pragma unroll
	for (int i = 0; i < 4; i++)
		k->words[i] = bpf_ntohl(h.ip.saddr.in6_u.u6_addr32[i]);

	__u32 ip_len = IPV6_HDR_LEN + bpf_ntohs(h.ip.payload_len);
	__u8 next = h.ip.nexthdr;
	__u32 off = IPV6_HDR_LEN;
	if (full && is_udp(next)) {
		set_udp(ctx, k, &h.udp, off, ip_len, next == IPPROTO_UDPLITE);
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
		if (pkt_load_net(ctx, off, &ext, sizeof(ext)) < 0)
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
		load_udp(ctx, k, off, ip_len, next == IPPROTO_UDPLITE);
}

// parse fills the key from the packet's headers; a field it cannot read is
// left zero (family unknown, no ports). Inlined: on CPUs that return through
// a return thunk (AMD's SRSO mitigation), every call costs about 7 ns, more
// than the checks it makes. What follows it in main is short, so the
// verifier's walk of main stays small (TestVerifierBudget).
static __always_inline int parse(pkt_ctx *ctx, struct key *k)
{
	if (!k)
		return 0;
	if (pkt_protocol(ctx) == bpf_htons(ETH_P_IP))
		parse_ipv4(ctx, k);
	else if (pkt_protocol(ctx) == bpf_htons(ETH_P_IPV6))
		parse_ipv6(ctx, k);
	return 0;
}

#endif
