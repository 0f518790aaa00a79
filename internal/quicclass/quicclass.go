// Package quicclass sorts the datagrams that reach an HTTP/3 server's UDP
// socket by what they cost the server, from the first bytes of the QUIC
// packet, the datagram's length and its source port. It is the Go twin of
// classify() in bpf/rakelimit.c: both must return the same class and reason
// for every input, and tests run one table of datagrams through both.
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
//   - Negotiation: a long header with an unknown version, 1200 bytes or
//     more: quic-go answers it with a Version Negotiation packet, to an
//     address that may be spoofed.
//   - Invalid: what no client sends to a server (see Reason).
package quicclass

import "encoding/binary"

// Class is what a datagram is to the server.
type Class uint8

// Classes. Opening and Established are also the limiter's class indexes
// (sketch class 0 and 1).
const (
	Opening Class = iota
	Established
	Negotiation
	Invalid
	// NumClasses counts the classes.
	NumClasses
)

var classNames = [NumClasses]string{"opening", "established", "negotiation", "invalid"}

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
	NotInvalid Reason = iota
	// Empty: a datagram without payload.
	Empty
	// SourcePort: from a blocked source port (see DefaultBlockedPorts).
	SourcePort
	// FixedBit: the fixed bit is 0 in a short header or a long header of a
	// known version; the datagram is not QUIC.
	FixedBit
	// Truncated: shorter than its header (a long header's fixed part,
	// its connection IDs), or a short-header packet under 21 bytes, which
	// cannot hold the header protection sample (RFC 9000 section 10.3).
	Truncated
	// ConnectionIDLength: a connection ID longer than 20 bytes in a known
	// version.
	ConnectionIDLength
	// SmallInitial: an Initial in a datagram under 1200 bytes (RFC 9000
	// section 14.1).
	SmallInitial
	// SmallUnknownVersion: an unknown version under 1200 bytes, which
	// quic-go drops without answering.
	SmallUnknownVersion
	// ServerOnly: a Version Negotiation or Retry packet, which only
	// servers send.
	ServerOnly
	// Unparsed: a datagram whose UDP header the filter could not find.
	Unparsed
	// NumReasons counts the reasons.
	NumReasons
)

var reasonNames = [NumReasons]string{"", "empty", "source_port", "fixed_bit", "truncated", "connection_id_length",
	"small_initial", "small_unknown_version", "server_only", "unparsed"}

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
	// ProbeBytes is how much of a datagram the classifier reads: the
	// first byte, the version, the destination connection ID with its
	// length, and the source connection ID's length.
	ProbeBytes = 1 + 4 + 1 + MaxConnectionIDLen + 1
	// MaxConnectionIDLen is the longest connection ID of QUIC v1 and v2.
	MaxConnectionIDLen = 20
	// MinInitialDatagram is the smallest datagram an Initial may arrive
	// in, and the smallest with an unknown version quic-go answers.
	MinInitialDatagram = 1200
	// MinShortHeaderPacket is the smallest short-header packet that can be
	// valid: one byte, the packet number and a 16-byte sample.
	MinShortHeaderPacket = 21

	headerForm   = 0x80
	fixedBit     = 0x40
	longTypeMask = 0x30
	longTypeBit  = 4
	// longFixedLen is a long header without connection IDs: first byte,
	// version, and the two length bytes.
	longFixedLen = 1 + 4 + 1 + 1

	// Version1 and Version2 are the QUIC versions quic-go v0.63 accepts.
	Version1 = 0x00000001
	Version2 = 0x6b3343cf
)

// Long header packet types as numbered by QUIC v1; v2 (RFC 9369) rotates them.
const (
	typeInitial = 0
	typeRetry   = 3
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
// it; fewer only when the payload is shorter). blocked may be nil.
func Classify(blocked *Ports, sport uint16, probe []byte, length int) (Class, Reason) {
	if length == 0 {
		return Invalid, Empty
	}
	if blocked != nil && blocked.Has(sport) {
		return Invalid, SourcePort
	}
	b0 := probe[0]
	if b0&headerForm == 0 {
		switch {
		case b0&fixedBit == 0:
			return Invalid, FixedBit
		case length < MinShortHeaderPacket:
			return Invalid, Truncated
		}
		return Established, NotInvalid
	}
	if length < longFixedLen {
		return Invalid, Truncated
	}
	v := binary.BigEndian.Uint32(probe[1:5])
	switch {
	case v == 0:
		return Invalid, ServerOnly
	case v != Version1 && v != Version2 && length < MinInitialDatagram:
		return Invalid, SmallUnknownVersion
	case v != Version1 && v != Version2:
		return Negotiation, NotInvalid
	case b0&fixedBit == 0:
		return Invalid, FixedBit
	}
	dcil := int(probe[5])
	if dcil > MaxConnectionIDLen {
		return Invalid, ConnectionIDLength
	}
	if length < longFixedLen+dcil {
		return Invalid, Truncated
	}
	scil := int(probe[6+dcil])
	if scil > MaxConnectionIDLen {
		return Invalid, ConnectionIDLength
	}
	if length < longFixedLen+dcil+scil {
		return Invalid, Truncated
	}
	switch longType((b0&longTypeMask)>>longTypeBit, v) {
	case typeRetry:
		return Invalid, ServerOnly
	case typeInitial:
		if length < MinInitialDatagram {
			return Invalid, SmallInitial
		}
	}
	return Opening, NotInvalid
}
