// quicclass.h: the QUIC class of a datagram, and what verifying it looks
// up. Go twin: internal/decide/quicclass/quicclass.go (Inspect, lengthsFit,
// varint, longType, Header.NeedsPeer, Header.Resolve).
#ifndef RAKELIMIT_QUICCLASS_H
#define RAKELIMIT_QUICCLASS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "contract.h"
#include "maps.h"
#include "parse.h"
#include "pkt.h"

// classify's result: the class in bits 0-7, the reason in 8-15, the check
// in 16-23 and whether the destination ID can be a server's in bit 24;
// resolve's: the class, the reason and the verification. HDR_FIELD_MASK
// takes one field after its shift.
#define HDR_REASON_SHIFT 8
#define HDR_CHECK_SHIFT 16
#define HDR_VERIFIED_SHIFT 16
#define HDR_HAS_ID (1 << 24)
#define HDR_FIELD_MASK 0xff

// Offsets in a long header: the version follows the first byte, the
// destination connection ID's length the version (the ID itself is at
// LONG_ID_OFFSET, and the source ID's length follows it).
#define LONG_VERSION_OFFSET 1
#define LONG_DCIL_OFFSET 5

// A variable-length integer: its size is 1 << (first byte >> 6), at most 8.
#define VARINT_MAX_BYTES 8

static __always_inline int invalid(int reason)
{
	return CLASS_INVALID | reason << HDR_REASON_SHIFT;
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
// changes no index below PROBE_BYTES. The barrier keeps the mask: clang
// drops it where a comparison already kept i below PROBE_BYTES, and where
// that comparison tested a register reloaded from a stack slot, the
// verifier of Linux 6.1 does not carry the bound to the next reload of the
// slot (6.12's does): "invalid unbounded variable-offset read from stack",
// in read_varint.
static __always_inline __u8 probe_byte(const struct key *k, __u32 i)
{
	barrier_var(i);
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
static __always_inline int read_varint(pkt_ctx *ctx, const struct key *k, __u32 at, __u64 *v, __u32 *n)
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
	if (pkt_load(ctx, k->payload_at + at, b, 1) < 0)
		return VARINT_UNREAD;
	__u32 size = 1U << (b[0] >> 6);
	if (size > len - at)
		return VARINT_PAST;
	int err = 0;
	// One load of a constant size for each size of integer: the verifier
	// wants the size of a load known, and a size computed by a shift it
	// cannot bound.
	if (size == 2)
		err = pkt_load(ctx, k->payload_at + at, b, 2);
	else if (size == 4)
		err = pkt_load(ctx, k->payload_at + at, b, 4);
	else if (size == 8)
		err = pkt_load(ctx, k->payload_at + at, b, 8);
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
static __always_inline int lengths_fit(pkt_ctx *ctx, const struct key *k, __u32 at, __u8 type)
{
	__u32 len = k->length;
	__u64 v = 0;
	__u32 n = 0;
	int st;

	if (type == LONG_TYPE_INITIAL) {
		st = read_varint(ctx, k, at, &v, &n);
		if (st != VARINT_OK)
			return st == VARINT_UNREAD;
		at += n;
		if (v > len - at)
			return 0;
		at += v;
	}
	st = read_varint(ctx, k, at, &v, &n);
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
static __always_inline int classify(pkt_ctx *ctx, const struct key *k, const struct config *cfg)
{
	if (!ctx || !k || !cfg)
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
	__u32 v = (__u32)k->probe[LONG_VERSION_OFFSET] << 24 | (__u32)k->probe[LONG_VERSION_OFFSET + 1] << 16 |
		  (__u32)k->probe[LONG_VERSION_OFFSET + 2] << 8 | k->probe[LONG_VERSION_OFFSET + 3];
	if (v == 0)
		return invalid(REASON_SERVER_ONLY);
	if (v != QUIC_V1 && v != QUIC_V2)
		return len < MIN_INITIAL_DATAGRAM ? invalid(REASON_SMALL_UNKNOWN_VERSION) : CLASS_NEGOTIATION;
	if (!(b0 & FIXED_BIT))
		return invalid(REASON_FIXED_BIT);
	__u32 dcil = k->probe[LONG_DCIL_OFFSET];
	if (dcil > MAX_CID_LEN)
		return invalid(REASON_CID_LENGTH);
	if (len < LONG_FIXED_LEN + dcil)
		return invalid(REASON_TRUNCATED);
	// Verifier workaround: through probe_byte, which masks the index. dcil
	// was bounded above, but clang may test a copy spilled to the stack and
	// reload it, and the verifier of Linux 6.1 does not carry the bound to
	// the reload ("invalid variable-offset read from stack").
	__u32 scil = probe_byte(k, LONG_ID_OFFSET + dcil);
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
	if (!lengths_fit(ctx, k, LONG_FIXED_LEN + dcil + scil, type))
		return invalid(REASON_LENGTH);
	return header(CLASS_OPENING, REASON_NONE, type == LONG_TYPE_HANDSHAKE ? CHECK_HANDSHAKE : CHECK_OPENING,
		      dcil == SERVER_ID_LEN);
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

// resolve: quicclass.Header.Resolve, for a check other than CHECK_NONE:
// id_known says whether the ID is a server ID bound to the source, proven
// whether the source is a proven peer, answered whether it is an answered
// one and credited whether it spent a credit (each asked only when the ones
// before it are 0). Returns the class, the reason and the verification
// (HDR_*).
static __always_inline int resolve(int check, int id_known, int proven, int answered, int credited)
{
	if (check == CHECK_SHORT) {
		if (id_known)
			return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_SHORT_BY_ID);
		if (proven)
			return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_SHORT_BY_PEER);
		if (credited)
			return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_FROM_ANSWERED);
		if (answered)
			return resolved(CLASS_UNVERIFIED, REASON_NONE, VERIFIED_OVER_CREDIT);
		return resolved(CLASS_UNVERIFIED, REASON_NONE, VERIFIED_NONE);
	}
	if (check == CHECK_OPENING) {
		if (id_known)
			return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_OPENING_BY_ID);
		if (proven)
			return resolved(CLASS_OPENING, REASON_NONE, VERIFIED_OPENING_FROM_PEER);
		if (credited)
			return resolved(CLASS_OPENING, REASON_NONE, VERIFIED_OPENING_FROM_ANSWERED);
		if (answered)
			return resolved(CLASS_OPENING, REASON_NONE, VERIFIED_OVER_CREDIT);
		return resolved(CLASS_OPENING, REASON_NONE, VERIFIED_NONE);
	}
	if (id_known)
		return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_OPENING_BY_ID);
	if (proven)
		return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_HANDSHAKE_FROM_PEER);
	if (credited)
		return resolved(CLASS_ESTABLISHED, REASON_NONE, VERIFIED_FROM_ANSWERED);
	if (answered)
		return resolved(CLASS_UNVERIFIED, REASON_NONE, VERIFIED_OVER_CREDIT);
	return resolved(CLASS_INVALID, REASON_UNKNOWN_CONNECTION_ID, VERIFIED_NONE);
}

// attempts: quicclass.Header.Attempts, for a header classify found has_id:
// a long header whose ID may be a server ID bound to its source.
static __always_inline int attempts(int check, int has_id)
{
	return has_id && (check == CHECK_OPENING || check == CHECK_HANDSHAKE);
}

// returning: quicclass.Verification.Returning.
static __always_inline int returning(int verified)
{
	return verified == VERIFIED_OPENING_FROM_PEER;
}

#endif
