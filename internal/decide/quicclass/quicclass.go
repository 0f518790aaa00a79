// Package quicclass sorts the datagrams that reach an HTTP/3 server's UDP
// socket by what they cost the server, from the first bytes of the QUIC
// packet, the datagram's length and its source port. It is the Go twin of
// internal/kernel/c/quicclass.h (classify, resolve): both must return the
// same class and reason for every input, and tests run one table of
// datagrams through both. The constants marked "C: NAME" are the C
// program's: internal/kernel/c/contract.h is generated from them.
//
// The rules follow the QUIC invariants (RFC 8999) and the v1 and v2 headers
// (RFC 9000 section 17, RFC 9369), for the versions quic-go v0.63 accepts
// (v1 and v2). quic-go does not negotiate grease_quic_bit (RFC 9287), so a
// packet of a known version whose fixed bit is 0 is not QUIC.
//
//   - Opening: a long-header packet of a known version (Initial, 0-RTT,
//     Handshake). For each Initial whose header parses, quic-go builds a
//     connection; these are the packets a flood of new connections is made of.
//   - Established: a short-header packet, the traffic of connections that
//     exist. One with an unknown connection ID costs quic-go a map lookup.
//   - Unverified: with connection ID verification, a short-header or
//     Handshake packet that neither carries a connection ID the server
//     issued to its source nor comes from a proven peer or an answered one
//     with credit (see below).
//   - Negotiation: a long header with an unknown version, 1200 bytes or
//     more: quic-go answers it with a Version Negotiation packet, to an
//     address that may be spoofed.
//   - Invalid: what no client sends to a server (see Reason).
//
// # Verifying connection IDs
//
// What only the server knows is the connection IDs it issued: quic-go's are
// ServerIDLen (4) random bytes, a cookie that a spoofer does not see. The
// server's Initial and Handshake packets carry the ID it chose as their
// source connection ID, sent to one address; a client's Handshake and
// short-header packets, and its Initials after the server's first Initial,
// carry such an ID as their destination connection ID. The filter learns
// each ID with the address it was sent to (package decide, from package
// learn), and an ID verifies only a datagram from that address: an ID is
// not a bearer token, and a real connection's ID sprayed from anywhere else
// verifies nothing. A long header from the address that carries it proves
// that the address receives what the server sends there (the return
// routability of RFC 9000 section 8): the address becomes a proven peer. A
// short header does not prove: it verifies itself only, so that guessing
// IDs in the cheapest datagrams earns a spoofer nothing but the guess, and
// the long headers that can prove pay for the lookup first (Attempts;
// package decide bounds them). IDs issued later in encrypted
// NEW_CONNECTION_ID frames cannot be seen, and a client may move to one
// (quic-go's does within the server's first flight), so a proven peer's
// datagrams are verified whatever their ID. An address the server sends a
// connection's datagrams to is an answered peer (a spoofed Initial's source
// gets a whole first flight), with a credit the server's datagrams there
// grant (package learn): its datagrams that nothing else verifies spend
// it, and are verified while it lasts. Inspect, asked to verify, returns
// with the class what the caller must look up (Header.Check, Header.ID);
// Resolve finishes the classification from the answers:
//
//   - a short header whose destination ID is a server ID bound to its
//     source, or from a proven peer, or from an answered peer that spent a
//     credit (FromAnswered), is Established (verified); any other is
//     Unverified, from an answered peer out of credit (OverCredit) or not;
//   - an Initial, 0-RTT or Handshake packet whose destination ID is a
//     server ID bound to its source is Established too: a verified
//     opening, which the server asked for;
//   - any other Initial or 0-RTT packet is Opening; from a proven peer, or
//     an answered one that spent a credit, it is a returning user's
//     (Verification.Returning), which the limiter lets past its network's
//     flood and first into a part of the opening class's fair total;
//   - any other Handshake packet from a proven peer, or from an answered
//     one that spent a credit, is Established, and from an answered one
//     out of credit Unverified;
//   - any other Handshake packet is Invalid (UnknownConnectionID): the
//     server neither issued its ID to that address nor answered it.
//
// Verifying also checks the lengths of every long header of a known version
// (RFC 9000 section 17.2): the Length field must cover a packet number and
// the 16-byte header protection sample (at least MinLongPacketLength bytes)
// and fit in what the datagram holds after it, and an Initial's token must
// fit too (reason Length). Without verification the classes are those of
// Classify, with no lookups.
package quicclass

import "encoding/binary"

// Class is what a datagram is to the server.
type Class uint8

// Classes. Opening, Established and Unverified are also the limiter's
// classes (package sketch indexes its lattices by them): the classes below
// LimiterClasses.
const (
	Opening     Class = iota // C: CLASS_OPENING
	Established              // C: CLASS_ESTABLISHED
	Unverified               // C: CLASS_UNVERIFIED
	Negotiation              // C: CLASS_NEGOTIATION
	Invalid                  // C: CLASS_INVALID
	// NumClasses counts the classes.
	NumClasses
)

// LimiterClasses is the number of classes the limiter counts, each with a
// lattice of its own (sketch.NumClasses): those below it.
const LimiterClasses = 3

var classNames = [NumClasses]string{"opening", "established", "unverified", "negotiation", "invalid"}

func (c Class) String() string {
	if c < NumClasses {
		return classNames[c]
	}
	return "unknown"
}

// Reason says why a datagram is invalid.
type Reason uint8

// Reasons.
const (
	// NotInvalid is the reason of every valid datagram.
	NotInvalid Reason = iota // C: REASON_NONE
	// Empty: a datagram without payload.
	Empty // C: REASON_EMPTY
	// SourcePort: from a blocked source port (see DefaultBlockedPorts).
	SourcePort // C: REASON_SOURCE_PORT
	// FixedBit: the fixed bit is 0 in a short header or a long header of a
	// known version; the datagram is not QUIC.
	FixedBit // C: REASON_FIXED_BIT
	// Truncated: shorter than its header (a long header's fixed part,
	// its connection IDs), or a short-header packet under 21 bytes, which
	// cannot hold the header protection sample (RFC 9000 section 10.3).
	Truncated // C: REASON_TRUNCATED
	// ConnectionIDLength: a connection ID longer than 20 bytes in a known
	// version.
	ConnectionIDLength // C: REASON_CID_LENGTH
	// SmallInitial: an Initial in a datagram under 1200 bytes (RFC 9000
	// section 14.1).
	SmallInitial // C: REASON_SMALL_INITIAL
	// SmallUnknownVersion: an unknown version under 1200 bytes, which
	// quic-go drops without answering.
	SmallUnknownVersion // C: REASON_SMALL_UNKNOWN_VERSION
	// ServerOnly: a Version Negotiation or Retry packet, which only
	// servers send.
	ServerOnly // C: REASON_SERVER_ONLY
	// Unparsed: a datagram whose UDP header the filter could not find.
	Unparsed // C: REASON_UNPARSED
	// UnknownConnectionID: with verification, a Handshake packet whose
	// destination connection ID is not one the server issued, from an
	// address the server has not answered.
	UnknownConnectionID // C: REASON_UNKNOWN_CONNECTION_ID
	// Length: with verification, a long header of a known version whose
	// lengths are inconsistent: its Length field is under
	// MinLongPacketLength or more than the datagram holds after it, or an
	// Initial's token is longer than the datagram.
	Length // C: REASON_LENGTH
	// NumReasons counts the reasons.
	NumReasons // C: NUM_REASONS
)

var reasonNames = [NumReasons]string{"", "empty", "source_port", "fixed_bit", "truncated", "connection_id_length",
	"small_initial", "small_unknown_version", "server_only", "unparsed", "unknown_connection_id", "length"}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// ReasonNames lists the reasons' names, indexed by Reason.
func ReasonNames() []string { return reasonNames[:] }

// Wire format constants.
const (
	// ProbeBytes is how much of a datagram the classifier reads without
	// verification: the first byte, the version, the destination
	// connection ID with its length, and the source connection ID's length.
	// Verification reads a long header's length fields further on.
	ProbeBytes = 1 + 4 + 1 + MaxConnectionIDLen + 1 // C: PROBE_BYTES
	// MaxConnectionIDLen is the longest connection ID of QUIC v1 and v2.
	MaxConnectionIDLen = 20 // C: MAX_CID_LEN
	// MinInitialDatagram is the smallest datagram an Initial may arrive
	// in, and the smallest with an unknown version quic-go answers.
	MinInitialDatagram = 1200 // C: MIN_INITIAL_DATAGRAM
	// MinShortHeaderPacket is the smallest short-header packet that can be
	// valid: one byte, the packet number and a 16-byte sample.
	MinShortHeaderPacket = 21 // C: MIN_SHORT_HEADER_PACKET
	// MinLongPacketLength is the smallest Length field of a long-header
	// packet: the header protection sample starts 4 bytes after the packet
	// number's first byte and takes 16 (RFC 9001 section 5.4.2).
	MinLongPacketLength = 4 + 16 // C: MIN_LONG_PACKET_LENGTH
	// ServerIDLen is the length of the connection IDs quic-go's servers
	// issue (4 random bytes; Caddy sets no generator or length). A short
	// header's destination ID starts at byte 1; the filter reads its first
	// ServerIDLen bytes.
	ServerIDLen = 4 // C: SERVER_ID_LEN

	headerForm   = 0x80 // C: HEADER_FORM
	fixedBit     = 0x40 // C: FIXED_BIT
	longTypeMask = 0x30 // C: LONG_TYPE_MASK
	longTypeBit  = 4    // C: LONG_TYPE_SHIFT
	// longFixedLen is a long header without connection IDs: first byte,
	// version, and the two length bytes.
	longFixedLen = 1 + 4 + 1 + 1 // C: LONG_FIXED_LEN

	// Version1 and Version2 are the QUIC versions quic-go v0.63 accepts.
	Version1 = 0x00000001 // C: QUIC_V1
	Version2 = 0x6b3343cf // C: QUIC_V2
)

// Long header packet types as numbered by QUIC v1; v2 (RFC 9369) rotates them.
const (
	typeInitial   = 0 // C: LONG_TYPE_INITIAL
	typeZeroRTT   = 1
	typeHandshake = 2 // C: LONG_TYPE_HANDSHAKE
	typeRetry     = 3 // C: LONG_TYPE_RETRY
)

// Offsets of the connection IDs a server may have issued: a short header's
// destination ID follows its first byte; a long header's follows the first
// byte, the version and the ID's length.
const (
	shortIDOffset = 1         // C: SHORT_ID_OFFSET
	longIDOffset  = 1 + 4 + 1 // C: LONG_ID_OFFSET
)

// longType returns the v1 number of a long-header packet type field of
// version v: v2 numbers Initial 1, 0-RTT 2, Handshake 3, Retry 0.
func longType(field uint8, v uint32) uint8 {
	if v == Version2 {
		return (field + 3) & 3
	}
	return field
}

// Ports is a set of UDP source ports, a bit per port.
type Ports [65536 / 64]uint64

// Has reports whether port p is in the set.
func (s *Ports) Has(p uint16) bool { return s[p/64]>>(p%64)&1 != 0 }

// Add adds the ports lo to hi, inclusive.
func (s *Ports) Add(lo, hi uint16) {
	for p := uint32(lo); p <= uint32(hi); p++ {
		s[p/64] |= 1 << (p % 64)
	}
}

// Ranges lists the set's ports as ranges, lowest first, each its first and
// last port; nil for a nil or empty set.
func (s *Ports) Ranges() [][2]uint16 {
	if s == nil {
		return nil
	}
	var out [][2]uint16
	for p := 0; p < 65536; p++ {
		if !s.Has(uint16(p)) {
			continue
		}
		lo := p
		for p+1 < 65536 && s.Has(uint16(p+1)) {
			p++
		}
		out = append(out, [2]uint16{uint16(lo), uint16(p)})
	}
	return out
}

// DefaultBlockedPorts are source ports that no QUIC client uses and that
// reflection attacks come from: every port below 1024 (privileged: a client's
// ephemeral port is never one, as HAProxy also assumes), and above it the
// well-known amplification vectors SSDP (1900), WS-Discovery (3702), mDNS
// (5353), CoAP (5683) and memcached (11211). A client behind a NAT that maps it
// to one of those five ports is refused; that is 5 ports in 64,512.
func DefaultBlockedPorts() *Ports {
	var s Ports
	s.Add(0, 1023)
	for _, p := range []uint16{1900, 3702, 5353, 5683, 11211} {
		s.Add(p, p)
	}
	return &s
}

// Classify returns the class of a datagram from source port sport whose UDP
// payload is length bytes long and starts with probe (at most ProbeBytes of
// it; fewer only when the payload is shorter). blocked may be nil. It is
// Inspect without verification.
func Classify(blocked *Ports, sport uint16, probe []byte, length int) (Class, Reason) {
	h := Inspect(blocked, sport, probe, length, false)
	return h.Class, h.Reason
}

// Check says what Resolve needs to know to finish a datagram's class.
type Check uint8

// Checks.
const (
	// CheckNone: the class is final.
	CheckNone Check = iota // C: CHECK_NONE
	// CheckShort: a short header; its ID, then its source address.
	CheckShort // C: CHECK_SHORT
	// CheckOpening: an Initial or 0-RTT packet; its ID, then its source
	// address.
	CheckOpening // C: CHECK_OPENING
	// CheckHandshake: a Handshake packet; its ID, then its source
	// address (a quic-go client moves to an ID the server issued in an
	// encrypted NEW_CONNECTION_ID frame before its Handshake Finished,
	// so only the address the server answered can verify it).
	CheckHandshake // C: CHECK_HANDSHAKE
)

// Header is what Inspect makes of a datagram: its class (final, or to be
// resolved when Check is not CheckNone) and what to look up.
type Header struct {
	Class  Class
	Reason Reason
	Check  Check
	// HasID is true when the destination connection ID can be a server's
	// (ServerIDLen bytes, or a short header's first ServerIDLen bytes); ID
	// holds it.
	HasID bool
	ID    [ServerIDLen]byte
}

// NeedsPeer reports whether Resolve wants to know if the source address
// is a peer, given whether the ID is a server ID bound to it: the address
// is looked up only then.
func (h *Header) NeedsPeer(idKnown bool) bool {
	return !idKnown && h.Check != CheckNone
}

// Attempts reports whether h, from an answered peer that is not proven, is
// an attempt at a proof: a long header with an ID that may be a server ID
// bound to its source (HasID), which proves the address when it is one.
// The filter pays for an attempt (a token of its proof pacer) before it
// looks the ID up, and then looks up the peers before the ID.
func (h *Header) Attempts() bool {
	return h.HasID && (h.Check == CheckOpening || h.Check == CheckHandshake)
}

// Verification says how Resolve verified a datagram.
type Verification uint8

// Verifications.
const (
	// NotVerified: not checked, or checked and not verified.
	NotVerified Verification = iota // C: VERIFIED_NONE
	// ShortByID: a short header whose destination ID is a server ID
	// bound to its source.
	ShortByID // C: VERIFIED_SHORT_BY_ID
	// ShortByPeer: a short header from a proven peer, with another ID.
	ShortByPeer // C: VERIFIED_SHORT_BY_PEER
	// OpeningByID: an Initial, 0-RTT or Handshake packet whose destination
	// ID is a server ID bound to its source: a verified opening, in the
	// established class.
	OpeningByID // C: VERIFIED_OPENING_BY_ID
	// OpeningFromPeer: an Initial or 0-RTT packet from a proven peer with
	// another ID: a returning user (Returning).
	OpeningFromPeer // C: VERIFIED_OPENING_FROM_PEER
	// HandshakeFromPeer: a Handshake packet from a proven peer with
	// another ID: a verified opening, in the established class.
	HandshakeFromPeer // C: VERIFIED_HANDSHAKE_FROM_PEER
	// FromAnswered: a short header or a Handshake packet, with an ID that
	// verifies nothing, from an answered peer that is not proven, which
	// spent one of its credits (the server's own datagrams to it earn
	// them: see package decide): established, as much as the server sends
	// it. quic-go's clients send so once their handshake completes, and
	// so does a client that migrated, once the server moved to its new
	// address.
	FromAnswered // C: VERIFIED_FROM_ANSWERED
	// OpeningFromAnswered: an Initial or 0-RTT packet, with an ID that
	// verifies nothing, from an answered peer that spent a credit: a
	// stranger's, not a returning user's, since a spoofer has the server
	// answer an address it names (spoofed ClientHellos earn it credit).
	OpeningFromAnswered // C: VERIFIED_OPENING_FROM_ANSWERED
	// OverCredit: a datagram, with an ID that verifies nothing, from an
	// answered peer that has no credit left: a short header or a Handshake
	// packet is unverified, an Initial or 0-RTT packet a stranger's.
	OverCredit // C: VERIFIED_OVER_CREDIT
	// NumVerifications counts the verifications.
	NumVerifications // C: NUM_VERIFICATIONS
)

var verificationNames = [NumVerifications]string{"", "short_by_id", "short_by_peer", "opening_by_id", "opening_from_peer",
	"handshake_from_peer", "from_answered", "opening_from_answered", "over_credit"}

func (v Verification) String() string {
	if v < NumVerifications {
		return verificationNames[v]
	}
	return "unknown"
}

// Returning reports whether a datagram so verified is a returning user's
// connection-opening packet (returning in the C program; sketch.Key's
// Returning): a proven peer's. An answered peer's credit verifies what it
// sends on a connection the server keeps with it, not who it is: a spoofer
// earns credit for an address it names.
func (v Verification) Returning() bool { return v == OpeningFromPeer }

// VerificationNames lists the verifications' names, indexed by
// Verification.
func VerificationNames() []string { return verificationNames[:] }

// Resolve finishes the classification of h: idKnown says whether h.ID is a
// server ID bound to the source address (false when h has none), proven
// whether the source is a proven peer, answered whether it is an answered
// one and credited whether it spent a credit (each asked only when the
// ones before it are false, and all only when NeedsPeer). It returns the
// class, the reason and how the datagram was verified. A header with
// nothing to check keeps its class.
func (h *Header) Resolve(idKnown, proven, answered, credited bool) (Class, Reason, Verification) {
	switch h.Check {
	case CheckShort:
		switch {
		case idKnown:
			return Established, NotInvalid, ShortByID
		case proven:
			return Established, NotInvalid, ShortByPeer
		case credited:
			return Established, NotInvalid, FromAnswered
		case answered:
			return Unverified, NotInvalid, OverCredit
		}
		return Unverified, NotInvalid, NotVerified
	case CheckOpening:
		switch {
		case idKnown:
			return Established, NotInvalid, OpeningByID
		case proven:
			return Opening, NotInvalid, OpeningFromPeer
		case credited:
			return Opening, NotInvalid, OpeningFromAnswered
		case answered:
			return Opening, NotInvalid, OverCredit
		}
		return Opening, NotInvalid, NotVerified
	case CheckHandshake:
		switch {
		case idKnown:
			return Established, NotInvalid, OpeningByID
		case proven:
			return Established, NotInvalid, HandshakeFromPeer
		case credited:
			return Established, NotInvalid, FromAnswered
		case answered:
			return Unverified, NotInvalid, OverCredit
		}
		return Invalid, UnknownConnectionID, NotVerified
	}
	return h.Class, h.Reason, NotVerified
}

// Inspect classifies a datagram from source port sport whose UDP payload is
// length bytes long and starts with payload (at least ProbeBytes of it, or
// all of it; fewer only when the payload is shorter). blocked may be nil.
// With verify it checks long headers' lengths and says what to look up to
// verify the datagram (see the package doc): the length fields are read
// where the header puts them, which for an Initial with a token may be past
// ProbeBytes; fields past the end of payload (but within length) are not
// checked. Without verify it is Classify.
func Inspect(blocked *Ports, sport uint16, payload []byte, length int, verify bool) Header {
	if length == 0 {
		return invalid(Empty)
	}
	if blocked != nil && blocked.Has(sport) {
		return invalid(SourcePort)
	}
	b0 := payload[0]
	if b0&headerForm == 0 {
		switch {
		case b0&fixedBit == 0:
			return invalid(FixedBit)
		case length < MinShortHeaderPacket:
			return invalid(Truncated)
		case !verify:
			return Header{Class: Established}
		}
		h := Header{Class: Unverified, Check: CheckShort, HasID: true}
		copy(h.ID[:], payload[shortIDOffset:])
		return h
	}
	if length < longFixedLen {
		return invalid(Truncated)
	}
	v := binary.BigEndian.Uint32(payload[1:5])
	switch {
	case v == 0:
		return invalid(ServerOnly)
	case v != Version1 && v != Version2 && length < MinInitialDatagram:
		return invalid(SmallUnknownVersion)
	case v != Version1 && v != Version2:
		return Header{Class: Negotiation}
	case b0&fixedBit == 0:
		return invalid(FixedBit)
	}
	dcil := int(payload[5])
	if dcil > MaxConnectionIDLen {
		return invalid(ConnectionIDLength)
	}
	if length < longFixedLen+dcil {
		return invalid(Truncated)
	}
	scil := int(payload[6+dcil])
	if scil > MaxConnectionIDLen {
		return invalid(ConnectionIDLength)
	}
	if length < longFixedLen+dcil+scil {
		return invalid(Truncated)
	}
	typ := longType((b0&longTypeMask)>>longTypeBit, v)
	switch typ {
	case typeRetry:
		return invalid(ServerOnly)
	case typeInitial:
		if length < MinInitialDatagram {
			return invalid(SmallInitial)
		}
	}
	if !verify {
		return Header{Class: Opening}
	}
	if !lengthsFit(payload, longFixedLen+dcil+scil, length, typ) {
		return invalid(Length)
	}
	h := Header{Class: Opening, Check: CheckOpening}
	if typ == typeHandshake {
		h.Check = CheckHandshake
	}
	if dcil == ServerIDLen {
		h.HasID = true
		copy(h.ID[:], payload[longIDOffset:])
	}
	return h
}

func invalid(r Reason) Header { return Header{Class: Invalid, Reason: r} }

// lengthsFit checks the fields that follow a long header's connection IDs,
// at offset at of a datagram of length bytes whose first bytes are b: an
// Initial's token length and token, then the Length field, which must be at
// least MinLongPacketLength and at most what follows it. A field beyond b
// (but within length) cannot be read and passes.
func lengthsFit(b []byte, at, length int, typ uint8) bool {
	if typ == typeInitial {
		tl, n, st := varint(b, at, length)
		switch st {
		case varintPast:
			return false
		case varintUnread:
			return true
		}
		at += n
		if tl > uint64(length-at) {
			return false
		}
		at += int(tl)
	}
	l, n, st := varint(b, at, length)
	switch st {
	case varintPast:
		return false
	case varintUnread:
		return true
	}
	at += n
	return l >= MinLongPacketLength && l <= uint64(length-at)
}

// What varint found.
const (
	varintOK = iota // C: VARINT_OK
	// varintPast: the integer runs past the datagram's end.
	varintPast // C: VARINT_PAST
	// varintUnread: the integer lies (partly) beyond the bytes given.
	varintUnread // C: VARINT_UNREAD
)

// varint decodes the variable-length integer (RFC 9000 section 16) at
// offset at of a datagram of length bytes whose first bytes are b, and
// returns it with its size.
func varint(b []byte, at, length int) (uint64, int, int) {
	if at >= length {
		return 0, 0, varintPast
	}
	if at >= len(b) {
		return 0, 0, varintUnread
	}
	n := 1 << (b[at] >> 6)
	switch {
	case n > length-at:
		return 0, 0, varintPast
	case n > len(b)-at:
		return 0, 0, varintUnread
	}
	v := uint64(b[at] & 0x3f)
	for _, c := range b[at+1 : at+n] {
		v = v<<8 | uint64(c)
	}
	return v, n, varintOK
}
