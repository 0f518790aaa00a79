// pkt_skb.h: the packet as the socket filter reads it. No Go twin: the Go
// twin's parser (internal/decide/parse.go) reads a byte slice.
//
// Every read of the packet goes through the functions below, over one
// context type, pkt_ctx; a second hook (XDP) implements the same set:
//
//   pkt_protocol(ctx)                 the network protocol, an ETH_P_* value
//                                     in network byte order
//   pkt_load_net(ctx, off, dst, len)  len bytes at offset off of the network
//                                     header, < 0 when the packet does not
//                                     hold them
//   pkt_len(ctx)                      the bytes from the packet's start, where
//                                     pkt_load reads
//   pkt_load(ctx, off, dst, len)      len bytes at offset off from the
//                                     packet's start, wherever they lie
//   pkt_payload_at(ctx, off, ip_len)  the offset, from the packet's start, of
//                                     the payload of the UDP header at offset
//                                     off of the network header, in an IP
//                                     datagram of ip_len bytes
//   pkt_pass(ctx), pkt_drop(ctx)      the program's verdicts
//   pkt_test_now(ctx),                the time and the random number a test
//   pkt_test_random(ctx)              gives the program (test_mode)
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

// The socket filter's context.
typedef struct __sk_buff pkt_ctx;

static __always_inline __u32 pkt_protocol(const pkt_ctx *ctx)
{
	return ctx->protocol;
}

static __always_inline long pkt_load_net(const pkt_ctx *ctx, __u32 off, void *dst, __u32 len)
{
	return bpf_skb_load_bytes_relative(ctx, off, dst, len, BPF_HDR_START_NET);
}

// pkt_len: skb->len, the bytes from skb->data: on a socket the UDP datagram,
// shorter than the IP datagram; under BPF_PROG_TEST_RUN the whole frame.
static __always_inline __u32 pkt_len(const pkt_ctx *ctx)
{
	return ctx->len;
}

// pkt_load reads from skb->data, in the skb's linear part or its pages:
// bpf_skb_load_bytes_relative reads the linear part only, which a GSO
// batch segmented on receive (quic-go sends them on loopback) keeps for
// its headers, its payload being in pages.
static __always_inline long pkt_load(const pkt_ctx *ctx, __u32 off, void *dst, __u32 len)
{
	return bpf_skb_load_bytes(ctx, off, dst, len);
}

// pkt_payload_at: skb->data is the UDP header on a socket, whose skb->len
// is the UDP datagram, shorter than the IP datagram of ip_len bytes; it is
// the network header under BPF_PROG_TEST_RUN, whose frames (test mode
// aside, which may cut them short) are whole.
static __always_inline __u32 pkt_payload_at(const pkt_ctx *ctx, __u32 off, __u32 ip_len)
{
	return test_mode || ctx->len >= ip_len ? off + UDP_HDR_LEN : UDP_HDR_LEN;
}

// A socket filter passes the bytes it returns: all of them, or none.
static __always_inline int pkt_pass(const pkt_ctx *ctx)
{
	return ctx->len;
}

static __always_inline int pkt_drop(const pkt_ctx *ctx)
{
	return 0;
}

// In test mode, BPF_PROG_TEST_RUN puts the time in skb->cb (cb[0] its low
// and cb[1] its high half) and the random number in cb[2].
static __always_inline __u64 pkt_test_now(const pkt_ctx *ctx)
{
	return (__u64)ctx->cb[1] << 32 | ctx->cb[0];
}

static __always_inline __u32 pkt_test_random(const pkt_ctx *ctx)
{
	return ctx->cb[2];
}

#endif
