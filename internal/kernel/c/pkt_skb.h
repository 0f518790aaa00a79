// pkt_skb.h: the packet as the socket filter reads it, the skb_ half of
// the functions pkt.h lists. No Go twin: the Go twin's parser
// (internal/decide/parse.go) reads a byte slice.
//
// On a real UDP socket skb->data points at the UDP header; under
// BPF_PROG_TEST_RUN it points at the IP header. Every header is therefore
// read with bpf_skb_load_bytes_relative(..., BPF_HDR_START_NET), which means
// the same in both, and the address family comes from skb->protocol, never
// from the socket, so that one program serves AF_INET, AF_INET6 and
// dual-stack sockets.
#ifndef RAKELIMIT_PKT_SKB_H
#define RAKELIMIT_PKT_SKB_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"

// skb_of is the socket filter's context.
static __always_inline struct __sk_buff *skb_of(const struct pkt *p)
{
	return p->ctx;
}

static __always_inline __u32 skb_protocol(const struct pkt *p)
{
	return skb_of(p)->protocol;
}

static __always_inline long skb_load_net(const struct pkt *p, __u32 off, void *dst, __u32 len)
{
	return bpf_skb_load_bytes_relative(skb_of(p), off, dst, len, BPF_HDR_START_NET);
}

// skb_len: skb->len, the bytes from skb->data: on a socket the UDP datagram,
// shorter than the IP datagram; under BPF_PROG_TEST_RUN the whole frame.
static __always_inline __u32 skb_len(const struct pkt *p)
{
	return skb_of(p)->len;
}

// skb_load reads from skb->data, in the skb's linear part or its pages:
// bpf_skb_load_bytes_relative reads the linear part only, which a GSO
// batch segmented on receive (quic-go sends them on loopback) keeps for
// its headers, its payload being in pages.
static __always_inline long skb_load(const struct pkt *p, __u32 off, void *dst, __u32 len)
{
	return bpf_skb_load_bytes(skb_of(p), off, dst, len);
}

// skb_payload_at: skb->data is the UDP header on a socket, whose skb->len
// is the UDP datagram, shorter than the IP datagram of ip_len bytes; it is
// the network header under BPF_PROG_TEST_RUN, whose frames (a test entry's
// aside, which a test may cut short: p->test_run) are whole.
static __always_inline __u32 skb_payload_at(const struct pkt *p, __u32 off, __u32 ip_len)
{
	return p->test_run || skb_of(p)->len >= ip_len ? off + UDP_HDR_LEN : UDP_HDR_LEN;
}

// skb_loaded: the helper's return value is the load's bounds check.
static __always_inline int skb_loaded(const struct pkt *p, long err)
{
	return err == 0;
}

// A socket filter passes the bytes it returns: all of them, or none.
static __always_inline int skb_pass(const struct pkt *p)
{
	return skb_of(p)->len;
}

static __always_inline int skb_drop(const struct pkt *p)
{
	return 0;
}

// skb_packet fills p for the socket filter entry of flags (pkt.h). For a
// test entry (TEST_INPUT), BPF_PROG_TEST_RUN puts the time in skb->cb
// (cb[0] its low and cb[1] its high half) and the random number in cb[2].
static __always_inline void skb_packet(struct pkt *p, struct __sk_buff *skb, int flags)
{
	p->ctx = skb;
	p->xdp = 0;
	p->test_run = (flags & TEST_INPUT) != 0;
	if (flags & TEST_INPUT) {
		p->test_now = (__u64)skb->cb[1] << 32 | skb->cb[0];
		p->test_random = skb->cb[2];
	}
}

#endif
