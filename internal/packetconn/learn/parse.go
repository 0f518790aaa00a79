package learn

import (
	"encoding/binary"
	"slices"

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
	// MinAckElicitingInitial is the size a server pads a datagram holding
	// an ack-eliciting Initial packet to (RFC 9000 section 14.1).
	MinAckElicitingInitial = quicclass.MinInitialDatagram
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
	// ids are the server IDs to bind to the datagram's destination, in
	// order, without repeats: the source connection IDs of its Handshake
	// packets, and of its Initials when it belongs to a connection (see
	// peer).
	ids  [maxIDsPerDatagram]ServerID
	nIDs int
	// odd counts the server's Handshake and Retry packets whose source
	// connection ID is not ServerIDLen bytes long, which no ServerID can
	// hold.
	odd int
	// peer: the datagram belongs to a connection the server keeps, so its
	// destination is an answered peer: it holds a Handshake packet, a
	// short-header packet, or an Initial padded as only an ack-eliciting
	// one is (see inspect).
	peer bool
	// short: it holds a short-header packet after long headers, which
	// grants its destination credit (see Learner.grants).
	short bool
	// dcids are the destination IDs (cidHash) of the long headers of a
	// datagram that belongs to a connection: the IDs its client chose.
	dcids  [maxIDsPerDatagram]uint32
	nDCIDs int
}

// inspect reads the datagram b the server sends: the source connection IDs
// of the long-header packets it starts with (Initial, Handshake and Retry
// of QUIC v1 and v2), following coalesced packets by their Length fields
// until a short header, the end, or anything that does not parse, and
// whether it belongs to a connection (see sent.peer).
//
// What it teaches is what only a connection makes. quic-go sends
// Handshake packets only in a connection, whose keys its handshake made,
// and short headers (1-RTT) only then too (while Caddy sets no stateless
// reset key; a test pins it). An Initial teaches when the datagram also
// holds a Handshake packet, or when the datagram is at least
// MinAckElicitingInitial bytes long: a server pads every datagram with an
// ack-eliciting Initial to that size (RFC 9000 section 14.1), its
// ServerHello among them, which quic-go may send before its Handshake
// packets, and which a client acknowledges at once to the ID it carries.
// quic-go's refusals of a connection (CONNECTION_REFUSED, and INVALID_TOKEN
// for a Retry token from another address) are lone Initials holding a
// CONNECTION_CLOSE frame, which is not ack-eliciting, and are not padded;
// their source ID is the client's chosen destination ID, which may be
// ServerIDLen bytes long (a Retry token's holder chooses it), sent to any
// address a spoofer names: they teach nothing, whatever their ID's length.
// A Retry teaches nothing, neither its ID nor its destination: it is a
// stateless reply, which a spoofer has the server send to any address at
// the rate it likes (a client that answers it opens a connection, whose
// server ID is taught then). A packet whose header does not fit the datagram (or whose
// Length is too small to be decrypted) teaches nothing, nor does anything
// after it; nor do Version Negotiation packets, unknown versions, 0-RTT
// (which only clients send) and packets with the fixed bit clear.
func inspect(b []byte) (s sent) {
	var initials [maxIDsPerDatagram]ServerID
	var dcids [maxIDsPerDatagram]uint32
	nInitials, nDCIDs, padded := 0, 0, len(b) >= MinAckElicitingInitial
	var initial, handshake bool
	for len(b) > 0 {
		if b[0]&headerForm == 0 {
			s.short = b[0]&fixedBit != 0
			s.peer = s.peer || s.short
			break
		}
		size, typ, scid, ok := parseLong(b)
		if !ok {
			break
		}
		if h := cidHash(b[dcilOffset+1 : dcilOffset+1+int(b[dcilOffset])]); nDCIDs < len(dcids) && !slices.Contains(dcids[:nDCIDs], h) {
			dcids[nDCIDs] = h
			nDCIDs++
		}
		server := len(scid) == ServerIDLen
		switch {
		case typ == typeInitial:
			initial = true
			if server && nInitials < len(initials) {
				initials[nInitials] = ServerID(scid)
				nInitials++
			}
		case !server: // a Handshake or Retry packet with an ID of another length
			s.odd++
		case typ == typeHandshake:
			s.add(ServerID(scid))
		}
		handshake = handshake || typ == typeHandshake
		b = b[size:]
	}
	if handshake || padded && initial {
		s.peer = true
		for _, id := range initials[:nInitials] {
			s.add(id)
		}
		s.dcids, s.nDCIDs = dcids, nDCIDs
	}
	return s
}

// cidHash is a connection ID's hash, its length in the top byte: FNV-1a
// over its bytes in the rest. Two IDs of one peer that collide only make a
// reply's credit a handshake's.
func cidHash(id []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range id {
		h = (h ^ uint32(c)) * 16777619
	}
	return uint32(len(id))<<24 | h&(1<<24-1)
}

// add records a server ID to bind to the destination.
func (s *sent) add(id ServerID) {
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
