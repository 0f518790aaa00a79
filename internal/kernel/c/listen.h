// listen.h: which datagrams the XDP program decides, and which the socket
// filter leaves to it. No Go twin: the userspace mode decides what its
// socket reads. Written by internal/kernel/xdp.go.
//
// The XDP program sees every frame that reaches its interface. It decides
// the UDP datagrams to a listener its limiter protects (listened): to the
// listener's port and address, or any address of the family for a
// wildcard listener (a dual-stack one counts for both families). It passes
// everything else untouched and uncounted: other ports and protocols, ARP,
// VLAN-tagged frames, non-first fragments (no port). A first fragment
// carries the port and is decided as the datagram it starts (QUIC
// datagrams are never fragmented, RFC 9000 section 14): dropped, the
// datagram never reassembles; passed, its reassembly is to a listener and
// the socket filter leaves it alone.
//
// A datagram is decided once. The socket filter stays on the listener's
// sockets (traffic on an interface without the XDP program, loopback among
// them, is decided there), and passes uncounted a datagram that arrived on
// an interface where the XDP program runs (xdp_ifaces, by skb->ifindex)
// and that the program decided (listened again: the same answer from the
// same headers).
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

// listened reports whether the datagram of key k is to a listener of the
// limiter (listen_ports, listen_addrs).
static __always_inline int listened(const pkt_ctx *ctx, const struct key *k)
{
	__u32 zero = 0;

	if (!k->has_ports)
		return 0;
	const struct listen_table *lp = bpf_map_lookup_elem(&listen_ports, &zero);
	if (!lp)
		return 0;
	int v6 = k->family == FAMILY_IPV6;
	__u8 kinds = lp->kinds[k->dport];
	if (kinds & (v6 ? LISTEN_ANY6 : LISTEN_ANY4))
		return 1;
	if (!(kinds & (v6 ? LISTEN_SOME6 : LISTEN_SOME4)))
		return 0;
	struct listen_key lk = {.port = k->dport, .family = k->family};
	// Two loads of constant sizes: the XDP program's loads are direct.
	long err = v6 ? pkt_load_net(ctx, __builtin_offsetof(struct ipv6hdr, daddr), lk.addr, 16)
		      : pkt_load_net(ctx, __builtin_offsetof(struct iphdr, daddr), lk.addr, 4);
	if (err < 0)
		return 0;
	return bpf_map_lookup_elem(&listen_addrs, &lk) != NULL;
}

// decided_at_xdp reports whether the XDP program decided the datagram the
// socket filter reads: it runs on the interface the datagram arrived on and
// the datagram is to one of its listeners. Without the XDP program
// anywhere (xdp_interfaces 0), the socket filter pays one load.
static __always_inline int decided_at_xdp(const pkt_ctx *ctx, const struct key *k)
{
	if (!xdp_interfaces)
		return 0;
	__u32 ifindex = skb_of(ctx)->ifindex;
	if (!bpf_map_lookup_elem(&xdp_ifaces, &ifindex))
		return 0;
	return listened(ctx, k);
}

#endif
