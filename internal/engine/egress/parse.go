package egress

import (
	"encoding/binary"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// ServerIDLen is the length of the connection IDs a quic-go server issues
// with its default generator (Caddy sets none): 4 random bytes.
const ServerIDLen = decide.ServerIDLen

// ServerID is a connection ID the server chose, as it appears in the source
// connection ID of the server's long-header packets: the filter's
// decide.ServerID.
type ServerID = decide.ServerID

// Wire format (RFC 9000 section 17, RFC 9369 section 3).
const (
	headerForm = 0x80
	fixedBit   = 0x40
	// longTypeShift and longTypeMask place the packet type in a long
	// header's first byte.
	longTypeShift = 4
	longTypeMask  = 0x3
	// versionOffset and dcilOffset are the offsets of the version and of
	// the destination connection ID's length in a long header.
	versionOffset = 1
	dcilOffset    = versionOffset + 4
	// retryTagLen is the Retry Integrity Tag that ends a Retry packet.
	retryTagLen = 16
	// minLength is the smallest Length field of a packet a peer can
	// decrypt: a packet number of up to 4 bytes and the 16-byte sample of
	// header protection (RFC 9001 section 5.4.2).
	minLength = 4 + 16
	// maxIDsPerDatagram bounds the distinct server IDs read from one
	// decide. A server coalesces at most one packet per encryption
	// level, so two long headers (Initial, Handshake), both with the same
	// ID; a datagram with more IDs than this is not quic-go's.
	maxIDsPerDatagram = 4
)

// Long header packet types, numbered as QUIC v1 numbers them.
const (
	typeInitial   = 0
	typeZeroRTT   = 1
	typeHandshake = 2
	typeRetry     = 3
)

// longType returns the v1 number of the packet type field typ of a long
// header of version v: v2 rotates them (Initial 1, 0-RTT 2, Handshake 3,
// Retry 0).
func longType(typ uint8, v uint32) uint8 {
	if v == quicclass.Version2 {
		return (typ + 3) & longTypeMask
	}
	return typ
}

// sent is what the learner reads of one datagram the server sends.
type sent struct {
	// ids are the server IDs of its long-header packets, in order,
	// without repeats.
	ids  [maxIDsPerDatagram]ServerID
	nIDs int
	// odd counts the server's Handshake and Retry packets whose source
	// connection ID is not ServerIDLen bytes long, which no ServerID can
	// hold.
	odd int
	// peer: the datagram belongs to a connection the server keeps, so
	// its destination is a peer: it holds a short-header packet, a
	// Handshake packet, or an Initial with a server ID.
	peer bool
}

// inspect reads the datagram b the server sends: the source connection IDs
// of the long-header packets it starts with (Initial, Handshake and Retry
// of QUIC v1 and v2), following coalesced packets by their Length fields
// until a short header, the end, or anything that does not parse, and
// whether it belongs to a connection (see sent.peer).
//
// A packet whose header does not fit the datagram (or whose Length is too
// small to be decrypted) teaches nothing, nor does anything after it.
// Version Negotiation packets, unknown versions, 0-RTT (which only clients
// send) and packets with the fixed bit clear teach nothing. Neither do the
// stateless replies a spoofer can direct at any address: a Retry teaches its
// ID (a client answers it with that ID) but not its destination, and an
// Initial whose source connection ID is not ServerIDLen bytes long is
// quic-go's refusal of a connection (CONNECTION_CLOSE, from the client's own
// destination ID, at least 8 bytes long), which teaches nothing, and is not
// counted as odd: only Handshake and Retry packets, which carry an ID the
// server made, are.
func inspect(b []byte) (s sent) {
	for len(b) > 0 {
		if b[0]&headerForm == 0 {
			s.peer = s.peer || b[0]&fixedBit != 0
			break
		}
		size, typ, scid, ok := parseLong(b)
		if !ok {
			break
		}
		s.add(typ, scid)
		b = b[size:]
	}
	return s
}

// add records the source connection ID of one long-header packet of type
// typ (numbered as in v1).
func (s *sent) add(typ uint8, scid []byte) {
	server := len(scid) == ServerIDLen
	// Handshake packets belong to a connection; Initials too unless they
	// are refusals, which have another ID.
	if typ == typeHandshake || typ == typeInitial && server {
		s.peer = true
	}
	if !server {
		if typ != typeInitial {
			s.odd++
		}
		return
	}
	id := ServerID(scid)
	for _, have := range s.ids[:s.nIDs] {
		if have == id {
			return
		}
	}
	if s.nIDs == maxIDsPerDatagram {
		return
	}
	s.ids[s.nIDs] = id
	s.nIDs++
}

// parseLong parses the long-header packet at the start of p: an Initial,
// Handshake or Retry of QUIC v1 or v2 with its fixed bit set. It returns
// the packet's size (header included; a Retry takes the rest of the
// datagram), its type (numbered as in v1) and its source connection ID; ok
// is false for any other packet or for a header that does not fit p.
func parseLong(p []byte) (size int, typ uint8, scid []byte, ok bool) {
	i := dcilOffset
	if len(p) <= i || p[0]&fixedBit == 0 {
		return 0, 0, nil, false
	}
	v := binary.BigEndian.Uint32(p[versionOffset:dcilOffset])
	if v != quicclass.Version1 && v != quicclass.Version2 {
		return 0, 0, nil, false
	}
	dcil := int(p[i])
	i++
	if dcil > quicclass.MaxConnectionIDLen || len(p) <= i+dcil {
		return 0, 0, nil, false
	}
	i += dcil
	scil := int(p[i])
	i++
	if scil > quicclass.MaxConnectionIDLen || len(p) < i+scil {
		return 0, 0, nil, false
	}
	scid = p[i : i+scil]
	i += scil
	typ = longType(p[0]>>longTypeShift&longTypeMask, v)
	switch typ {
	case typeRetry:
		// A Retry token and the integrity tag fill the rest; a client
		// discards a Retry whose token is empty (RFC 9000 17.2.5.2).
		if len(p)-i <= retryTagLen {
			return 0, 0, nil, false
		}
		return len(p), typ, scid, true
	case typeInitial:
		tokenLen, n := varint(p[i:])
		if n == 0 || tokenLen > uint64(len(p)-i-n) {
			return 0, 0, nil, false
		}
		i += n + int(tokenLen)
	case typeHandshake:
	default: // 0-RTT: only clients send it
		return 0, 0, nil, false
	}
	length, n := varint(p[i:])
	if n == 0 || length < minLength || length > uint64(len(p)-i-n) {
		return 0, 0, nil, false
	}
	return i + n + int(length), typ, scid, true
}

// varint decodes the variable-length integer (RFC 9000 section 16) at the
// start of b and returns it with its size in bytes; the size is 0 if b is
// too short to hold it.
func varint(b []byte) (v uint64, n int) {
	if len(b) == 0 {
		return 0, 0
	}
	n = 1 << (b[0] >> 6)
	if len(b) < n {
		return 0, 0
	}
	v = uint64(b[0] & 0x3f)
	for _, c := range b[1:n] {
		v = v<<8 | uint64(c)
	}
	return v, n
}
