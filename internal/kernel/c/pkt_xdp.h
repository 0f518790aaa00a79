// pkt_xdp.h: the packet as the XDP program reads it, the xdp_ half of the
// functions pkt.h lists. No Go twin: the Go twin's parser
// (internal/decide/parse.go) reads a byte slice.
//
// The XDP program sees an Ethernet frame, whole in memory (a program
// without BPF_F_XDP_HAS_FRAGS is never given a multi-buffer frame), as a
// socket filter sees one under BPF_PROG_TEST_RUN: the packet's start, where
// pkt_load reads, is the network header, after the Ethernet header. Loads
// of a constant size read the frame directly (no helper call), with the
// bounds checks the verifier wants; loads of a variable size, rarer (a
// payload shorter than the probe), go through bpf_xdp_load_bytes.
#ifndef RAKELIMIT_PKT_XDP_H
#define RAKELIMIT_PKT_XDP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"

// The largest offset a direct load starts at. The verifier gives a packet
// pointer a readable range only when its offset, at most, plus the bytes
// read stays within 64 KiB (MAX_PACKET_OFF), the Ethernet header included;
// a frame long enough to hold a header past it (jumbo frames on 64 KiB
// pages) is read with the helper.
#define XDP_DIRECT_MAX 0xf000

// The time and the random number a test gives the XDP program, in the
// frame's metadata (BPF_PROG_TEST_RUN's xdp_md.data bytes before the
// frame): the time's low and high halves, then the random number.
struct xdp_test_meta {
	__u32 now_lo;
	__u32 now_hi;
	__u32 random;
};

static __always_inline struct xdp_md *xdp_of(const struct pkt *p)
{
	return p->ctx;
}

static __always_inline __u32 xdp_protocol(const struct pkt *p)
{
	return p->proto;
}

// xdp_copy copies len bytes (a constant) from the frame at src to dst, 8
// bytes a load while they last.
//
// Compiler workaround: a __builtin_memcpy from the frame, whose network
// header clang knows only 2-byte aligned (after the 14-byte Ethernet
// header; __builtin_assume_aligned does not survive the inlining), is
// lowered to 2-byte loads shifted and or-ed together, 11 instructions for
// every 8 bytes. Typed loads are 8 bytes wide whatever the address:
// unaligned loads from a packet are allowed on every architecture with
// efficient unaligned access (x86, arm64), unless the program is loaded
// with BPF_F_STRICT_ALIGNMENT, which it is not.
static __always_inline void xdp_copy(void *dst, const __u8 *src, __u32 len)
{
	__u8 *d = dst;
	__u32 i = 0;

#pragma unroll
	for (; i + 8 <= len; i += 8) {
		__u64 w = *(const __u64 *)(src + i);
		__builtin_memcpy(d + i, &w, 8);
	}
	if (i + 4 <= len) {
		__u32 w = *(const __u32 *)(src + i);
		__builtin_memcpy(d + i, &w, 4);
		i += 4;
	}
	if (i + 2 <= len) {
		__u16 w = *(const __u16 *)(src + i);
		__builtin_memcpy(d + i, &w, 2);
		i += 2;
	}
	if (i < len)
		d[i] = src[i];
}

// xdp_load_net reads len bytes at offset off of the network header.
static __always_inline long xdp_load_net(const struct pkt *p, __u32 off, void *dst, __u32 len)
{
	// Verifier workaround: a direct load at an offset that is not a
	// constant gives the packet pointer a variable offset and a range the
	// verifier tracks in every state after it, which keeps it from pruning
	// states that differ only there: the verifier of Linux 7.3 then
	// processes 466,700 instructions, near half its limit (6.18's 181,000).
	// Only constant offsets are read directly: the network headers' fixed
	// fields, where the packets that are not to a listener are passed.
	if (!__builtin_constant_p(len) || !__builtin_constant_p(off) || off > XDP_DIRECT_MAX)
		return bpf_xdp_load_bytes(xdp_of(p), ETH_HLEN + off, dst, len);
	const __u8 *src = (const __u8 *)p->net + off;
	// The verifier lets the program read the len bytes at src once it
	// compared their end with the frame's.
	if ((const void *)(src + len) > p->end)
		return -1;
	xdp_copy(dst, src, len);
	return 0;
}

// xdp_len: the bytes from the network header to the frame's end (their
// difference is a scalar for a program loaded with CAP_PERFMON, which
// loading the program needs anyway).
static __always_inline __u32 xdp_len(const struct pkt *p)
{
	return (const __u8 *)p->end - (const __u8 *)p->net;
}

static __always_inline long xdp_load(const struct pkt *p, __u32 off, void *dst, __u32 len)
{
	return xdp_load_net(p, off, dst, len);
}

// xdp_payload_at: the frame is whole, the packet's start its network
// header.
static __always_inline __u32 xdp_payload_at(const struct pkt *p, __u32 off, __u32 ip_len)
{
	return off + UDP_HDR_LEN;
}

// xdp_loaded: whether a load (xdp_load_net, xdp_load) that returned err
// read every byte asked for.
static __always_inline int xdp_loaded(const struct pkt *p, long err)
{
	int full = err == 0;

	// Verifier workaround: without the barrier, clang tests the bounds
	// check again where the caller uses full; the verifier does not
	// remember the check's outcome from the first test and walks the path
	// where the two disagree, with registers the compiler knew unused
	// there (a pointer where the UDP header would be: "invalid size of
	// register spill").
	barrier_var(full);
	return full;
}

static __always_inline int xdp_pass(const struct pkt *p)
{
	return XDP_PASS;
}

static __always_inline int xdp_drop(const struct pkt *p)
{
	return XDP_DROP;
}

// xdp_packet fills p for the XDP program entry of flags (pkt.h); 0 when
// the frame has no whole Ethernet header. For a test entry (TEST_INPUT)
// the time and the random number come from the metadata (struct
// xdp_test_meta), or are 0 without it.
static __always_inline int xdp_packet(struct pkt *p, struct xdp_md *xdp, int flags)
{
	void *data = (void *)(long)xdp->data;
	void *end = (void *)(long)xdp->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return 0;
	p->ctx = xdp;
	p->net = eth + 1;
	p->end = end;
	// A 16-bit load: struct ethhdr is packed, so clang reads its field a
	// byte at a time (see xdp_copy).
	p->proto = *(const __u16 *)((const __u8 *)data + offsetof(struct ethhdr, h_proto));
	p->xdp = 1;
	p->test_run = (flags & TEST_INPUT) != 0;
	if (flags & TEST_INPUT) {
		struct xdp_test_meta *m = (void *)(long)xdp->data_meta;

		if ((void *)(m + 1) <= data) {
			p->test_now = (__u64)m->now_hi << 32 | m->now_lo;
			p->test_random = m->random;
		}
	}
	return 1;
}

#endif
