// contract.h: the constants the BPF program shares with its Go twin, as
// rakelimit.c defined them; each must equal its Go constant.
#ifndef RAKELIMIT_CONTRACT_H
#define RAKELIMIT_CONTRACT_H

// Fixed point and time, as in internal/decide/sketch/fixed.go and config.go.
#define FRAC_BITS 8
#define WEIGHT_BITS 24
#define LOW32 0xffffffffULL
#define Q32_ONE (1ULL << 32)
#define U32_MAX 0xffffffffU
#define EPOCH_SHIFT 20
#define SLOT_SHIFT 12
#define SLOTS (1 << (EPOCH_SHIFT - SLOT_SHIFT))
#define DECAY_BITS 9
#define DECAY_ENTRIES (1 << DECAY_BITS)
#define DECAY_HORIZON (1U << (3 * DECAY_BITS))
// A cell's 32-bit epoch may be up to SKEW_EPOCHS ahead of a packet's (another
// CPU moved it on): an idle time above SKEW_WRAP is such a packet, not a wrap.
#define SKEW_EPOCHS (1U << 10)
#define PERIOD_SHIFT 32
#define THRESH_UNLIMITED U32_MAX
// The fair total (sketch.FairStep, FairSlack, FairUnbounded).
#define FAIR_STEP 8
#define FAIR_SLACK 0
#define FAIR_UNBOUNDED ((1ULL << 48) - 1)
// The coin of the proportional floor: FAIR_COIN_BITS bits of the packet's
// random number from bit FAIR_COIN_SHIFT, under the dither (the top
// FRAC_BITS) and above the bits that sample drops (track_mask).
#define FAIR_COIN_BITS 16
#define FAIR_COIN_SHIFT (32 - FRAC_BITS - FAIR_COIN_BITS)
// The screen judges a network alone only while its clean count, with the
// packet, is at most its limit >> SCREEN_HEADROOM_SHIFT (sketch
// ScreenHeadroomShift): the nodes more specific than the network's miss
// what the screen drops, and the headroom bounds that shortfall.
#define SCREEN_HEADROOM_SHIFT 1
// Where the screen asks (sketch.ScreenFair, ScreenReflect): a bit each in
// config.screen and node_work.screening.
#define SCREEN_FAIR 1
#define SCREEN_REFLECT 2
// Verdicts of admit_fair.
#define FAIR_REFUSE 0
#define FAIR_RANK 1
#define FAIR_FLOOR 2

// Lattice and sketch dimensions, as in internal/decide/sketch.
#define NUM_CLASSES 3
#define MAX_PREFIXES 4
#define MAX_NODES (MAX_PREFIXES * 4)
#define MAX_LEVELS (MAX_PREFIXES + 2)
#define DEPTH 2
#define CELLS_PER_LINE 3
#define HASH_WORDS 6
#define MIX_MUL 0x9E3779B97F4A7C15ULL

// QUIC, as in internal/decide/quicclass: classes, reasons and wire format.
#define CLASS_OPENING 0
#define CLASS_ESTABLISHED 1
#define CLASS_UNVERIFIED 2
#define CLASS_NEGOTIATION 3
#define CLASS_INVALID 4
#define REASON_NONE 0
#define REASON_EMPTY 1
#define REASON_SOURCE_PORT 2
#define REASON_FIXED_BIT 3
#define REASON_TRUNCATED 4
#define REASON_CID_LENGTH 5
#define REASON_SMALL_INITIAL 6
#define REASON_SMALL_UNKNOWN_VERSION 7
#define REASON_SERVER_ONLY 8
#define REASON_UNPARSED 9
#define REASON_UNKNOWN_CONNECTION_ID 10
#define REASON_LENGTH 11
#define NUM_REASONS 12
// What the entry point must look up to finish a class (quicclass.Check).
#define CHECK_NONE 0
#define CHECK_SHORT 1
#define CHECK_OPENING 2
#define CHECK_HANDSHAKE 3
// How a datagram was verified (quicclass.Verification).
#define VERIFIED_NONE 0
#define VERIFIED_SHORT_BY_ID 1
#define VERIFIED_SHORT_BY_PEER 2
#define VERIFIED_OPENING_BY_ID 3
#define VERIFIED_OPENING_FROM_PEER 4
#define VERIFIED_HANDSHAKE_FROM_PEER 5
#define NUM_VERIFICATIONS 6
#define PROBE_BYTES 27
#define MAX_CID_LEN 20
#define MIN_INITIAL_DATAGRAM 1200
#define MIN_SHORT_HEADER_PACKET 21
#define HEADER_FORM 0x80
#define FIXED_BIT 0x40
#define LONG_TYPE_MASK 0x30
#define LONG_TYPE_SHIFT 4
#define LONG_FIXED_LEN 7
#define QUIC_V1 0x00000001
#define QUIC_V2 0x6b3343cf
#define LONG_TYPE_INITIAL 0
#define LONG_TYPE_HANDSHAKE 2
#define LONG_TYPE_RETRY 3
// The smallest Length field: a packet number's first 4 bytes and the 16-byte
// header protection sample.
#define MIN_LONG_PACKET_LENGTH 20
#define VARINT_OK 0
#define VARINT_PAST 1
#define VARINT_UNREAD 2

// What the filter learns of the server (datagram.ServerIDLen, MaxServerIDs,
// MaxPeers): quic-go's 4-byte connection IDs, where its client's short and
// long headers carry them, and how many IDs and peer addresses are kept.
#define SERVER_ID_LEN 4
#define SHORT_ID_OFFSET 1
#define LONG_ID_OFFSET 6
#define MAX_SERVER_IDS (1 << 17)
#define MAX_PEERS (1 << 17)
// The server IDs' table (map server_ids, datagram.IDWays and IDSetShift):
// sets of ID_WAYS slots, one cache line each, an ID's set the top
// ID_SET_SHIFT bits of its hash (id_hash). A slot holds the ID in its top 32
// bits, ID_USED, and the ID's stamp: the time it was learned or last used
// by a verified datagram, in units of 2^ID_STAMP_SHIFT ns (1.07 s;
// datagram.IDStamp), which a verified datagram moves on when it is behind.
#define ID_WAYS 8
#define ID_SET_SHIFT 15
#define ID_SETS (1 << ID_SET_SHIFT)
#define ID_USED (1ULL << 31)
#define ID_STAMP_MASK (ID_USED - 1)
#define ID_TAG_MASK (~ID_STAMP_MASK)
#define ID_STAMP_SHIFT 30
// The quick-reject filters of the learned sets (map quick): a bit per hash
// bucket, 2^QUICK_SHIFT of them, set for every learned member.
#define QUICK_SHIFT 18
#define QUICK_WORDS ((1 << QUICK_SHIFT) / 64)
#define QUICK_PEERS 0
#define QUICK_IDS 1
#define NUM_QUICK 2

// Stream tracking: only a sample of drops (config.track_mask) looks up the
// tracking map, which keeps the drop path's cost flat under a flood.
#define MAX_TRACKED_STREAMS 1024
// The pacers' slots in the pacer map.
#define PACER_NEGOTIATION 0
#define PACER_TRACKING 1
#define NUM_PACERS 2
// The stream key's node of an invalid datagram's source.
#define INVALID_NODE 0xff
#define MAX_ALLOW 1024
// The allowlist's quick-reject filter: 2^10 buckets per family, keyed by a
// multiplicative hash of the address's top 16 (IPv4) or 32 (IPv6) bits.
#define ALLOW_FILTER_SHIFT 10
#define ALLOW_FILTER_BITS (1 << ALLOW_FILTER_SHIFT)
#define ALLOW_HASH_MUL 0x9E3779B1U

// Budgets within a cell.
#define BUDGET_CLEAN 0
#define BUDGET_LIMITED 1

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
#define UDP_HDR_LEN 8
// Extension headers walked before the parser gives up looking for UDP. No
// QUIC client sends any; a datagram behind more is invalid (unparsed) when
// the filter classifies, and counted at the port-wildcard nodes when not.
#define IPV6_MAX_EXT 6

// Negotiation counters: passed, dropped, over the cap in a dry run.
#define NEG_PASSED 0
#define NEG_DROPPED 1
#define NEG_WOULD_DROP 2

// Verdicts of judge_node.
#define JUDGE_PASS 0
#define JUDGE_OVER 1
#define JUDGE_DROP 2
#define JUDGE_FLOOR 3

// The third word of an IPv4-mapped peer key (::ffff:a.b.c.d).
#define IPV4_MAPPED_WORD 0xffff

#endif
