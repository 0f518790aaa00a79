// pkt.h: the packet, whichever hook reads it. No Go twin: the Go twin's
// parser (internal/decide/parse.go) reads a byte slice.
//
// The program has two entries over one decision: the socket filter
// (SEC("socket"), c/pkt_skb.h) and the XDP program (SEC("xdp"),
// c/pkt_xdp.h), in one object, so that they share every map. The code that
// decides (parse.h, quicclass.h and rakelimit.c's decide_datagram) reads the
// packet only through the functions below, over one context type, pkt_ctx,
// which each entry fills for its hook:
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
//   pkt_loaded(ctx, err)              whether a load that returned err read
//                                     every byte asked for
//   pkt_pass(ctx), pkt_drop(ctx)      the program's verdicts
//   pkt_test_now(ctx),                the time and the random number a test
//   pkt_test_random(ctx)              gives a test entry (TEST_INPUT)
//
// A hook implements each as skb_<name> (pkt_skb.h) or xdp_<name>
// (pkt_xdp.h); pkt_<name> picks the hook's by ctx->xdp, which each entry
// sets to a constant. Every function is inlined into the entries, so the
// compiler removes the other hook's code from each program, and the
// verifier never sees an XDP helper in the socket filter or the other way
// round (llvm-objdump -d shows it).
//
// Each hook has a production entry (rakelimit, rakelimit_xdp) and, over the
// same inline functions, entries for the tests and the benchmarks, which
// they load in its place (loadOptions in program.go): rakelimit_test and
// rakelimit_xdp_test (TEST_INPUT | TEST_VERDICT), rakelimit_bench_random
// and rakelimit_xdp_bench_random (BENCH_RANDOM_SOURCE). An entry passes its
// flags below, a constant, to the functions that test them (skb_packet and
// xdp_packet, which keep what the hook's functions need in ctx as they keep
// xdp; rakelimit.c's decide_datagram and clock), so that the compiler
// removes the code of the flags an entry lacks: the production entries,
// which pass none, hold no test or benchmark code at all.
//
//   TEST_INPUT           the time and the random number come from the test
//                        (pkt_test_now, pkt_test_random), and the socket
//                        filter's packet starts at the network header however
//                        short the frame (BPF_PROG_TEST_RUN; skb_payload_at)
//   TEST_VERDICT         the verdict is written to the test_verdict map
//   BENCH_RANDOM_SOURCE  the source address and port are XORed with a random
//                        number, so that a benchmark repeating one packet
//                        sees a new source every time, as a spoofed flood
//                        sends (a fixed port would make the all-sources node
//                        of that port a cell every packet writes)
#ifndef RAKELIMIT_PKT_H
#define RAKELIMIT_PKT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// An entry's flags (see above).
#define TEST_INPUT 1
#define TEST_VERDICT 2
#define BENCH_RANDOM_SOURCE 4

// A packet as a hook gives it to the program.
struct pkt {
	// The hook's context: struct __sk_buff or struct xdp_md.
	void *ctx;
	// XDP: the network header and the end of the frame (data_end).
	void *net;
	void *end;
	// TEST_INPUT: the time and the random number the test gave.
	__u64 test_now;
	__u32 test_random;
	// XDP: the Ethernet header's protocol, in network byte order.
	__u16 proto;
	// 1 in the XDP program, 0 in the socket filter: a constant in each.
	__u8 xdp;
	// 1 in a test entry (TEST_INPUT), which BPF_PROG_TEST_RUN runs, 0 in
	// the others: a constant in each, as xdp is.
	__u8 test_run;
};
typedef struct pkt pkt_ctx;

#include "pkt_skb.h"
#include "pkt_xdp.h"

static __always_inline __u32 pkt_protocol(const pkt_ctx *ctx)
{
	return ctx->xdp ? xdp_protocol(ctx) : skb_protocol(ctx);
}

static __always_inline long pkt_load_net(const pkt_ctx *ctx, __u32 off, void *dst, __u32 len)
{
	return ctx->xdp ? xdp_load_net(ctx, off, dst, len) : skb_load_net(ctx, off, dst, len);
}

static __always_inline __u32 pkt_len(const pkt_ctx *ctx)
{
	return ctx->xdp ? xdp_len(ctx) : skb_len(ctx);
}

static __always_inline long pkt_load(const pkt_ctx *ctx, __u32 off, void *dst, __u32 len)
{
	return ctx->xdp ? xdp_load(ctx, off, dst, len) : skb_load(ctx, off, dst, len);
}

static __always_inline __u32 pkt_payload_at(const pkt_ctx *ctx, __u32 off, __u32 ip_len)
{
	return ctx->xdp ? xdp_payload_at(ctx, off, ip_len) : skb_payload_at(ctx, off, ip_len);
}

static __always_inline int pkt_loaded(const pkt_ctx *ctx, long err)
{
	return ctx->xdp ? xdp_loaded(ctx, err) : skb_loaded(ctx, err);
}

static __always_inline int pkt_pass(const pkt_ctx *ctx)
{
	return ctx->xdp ? xdp_pass(ctx) : skb_pass(ctx);
}

static __always_inline int pkt_drop(const pkt_ctx *ctx)
{
	return ctx->xdp ? xdp_drop(ctx) : skb_drop(ctx);
}

// The entries read the test's time and random number where their hook puts
// them (skb->cb, XDP metadata) into ctx.
static __always_inline __u64 pkt_test_now(const pkt_ctx *ctx)
{
	return ctx->test_now;
}

static __always_inline __u32 pkt_test_random(const pkt_ctx *ctx)
{
	return ctx->test_random;
}

#endif
