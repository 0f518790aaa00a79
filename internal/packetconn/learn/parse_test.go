//go:build linux

package learn

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
)

// Test IDs.
var (
	idA    = ServerID{0xaa, 0xaa, 0xaa, 0x01}
	idB    = ServerID{0xbb, 0xbb, 0xbb, 0x02}
	client = []byte{1, 2, 3, 4, 5, 6, 7, 8}
)

// cat concatenates packets into one datagram.
func cat(ps ...[]byte) []byte { return bytes.Join(ps, nil) }

func TestInspect(t *testing.T) {
	v1, v2 := uint32(quicclass.Version1), uint32(quicclass.Version2)
	initial := quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 1000)
	handshake := quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], idA[:], nil, 300)
	tooShortLength := quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], idA[:], nil, minLength-1)
	cut := initial[:len(initial)-1]
	badToken := quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 100)
	badToken[6+4+1+4] = 0x7f // a 2-byte token length, then a length past the end
	tests := []struct {
		name string
		b    []byte
		ids  []ServerID
		odd  int
		peer bool
	}{
		{"empty", nil, nil, 0, false},
		{"short header", quicclasstest.ShortHeader(100), nil, 0, true},
		{"short header, fixed bit clear", make([]byte, 100), nil, 0, false},
		// An Initial alone teaches only when it is padded as only an
		// ack-eliciting one is (a ServerHello): quic-go's refusals are
		// small lone Initials whose ID the client chose (see below).
		{"v1 Initial", initial, nil, 0, false},
		{"v1 Initial, padded", quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 1200), []ServerID{idA}, 0, true},
		{"v1 Initial, padded after it", cat(initial, make([]byte, 200)), []ServerID{idA}, 0, true},
		{"v1 Initial with a token", quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], []byte("token"), 500), nil, 0, false},
		{"v2 Initial", quicclasstest.AppendLongPacket(nil, v2, typeInitial, client[:4], idA[:], nil, 1000), nil, 0, false},
		{"v2 Initial, padded", quicclasstest.AppendLongPacket(nil, v2, typeInitial, client[:4], idA[:], nil, 1250), []ServerID{idA}, 0, true},
		{"v1 Handshake", handshake, []ServerID{idA}, 0, true},
		{"v2 Handshake", quicclasstest.AppendLongPacket(nil, v2, typeHandshake, client[:4], idA[:], nil, 300), []ServerID{idA}, 0, true},
		// A Retry is a stateless reply: it teaches nothing.
		{"v1 Retry", quicclasstest.AppendLongPacket(nil, v1, typeRetry, client, idB[:], []byte("retry token"), 0), nil, 0, false},
		{"v2 Retry", quicclasstest.AppendLongPacket(nil, v2, typeRetry, client, idB[:], []byte("retry token"), 0), nil, 0, false},
		{"Retry without a token", quicclasstest.AppendLongPacket(nil, v1, typeRetry, client, idB[:], nil, 0), nil, 0, false},
		{"coalesced Initial and Handshake", cat(initial, handshake), []ServerID{idA}, 0, true},
		{"coalesced Initial, Handshake and 1-RTT", cat(initial, handshake, quicclasstest.ShortHeader(60)), []ServerID{idA}, 0, true},
		{"coalesced with two IDs", cat(initial, quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], idB[:], nil, 300)), []ServerID{idB, idA}, 0, true},
		{"coalesced, the Handshake cut", cat(initial, quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], idB[:], nil, 300)[:100]), nil, 0, false},
		{"coalesced after garbage", cat(make([]byte, 10), initial), nil, 0, false},
		{"Initial cut short", cut, nil, 0, false},
		{"Initial with a token past the end", badToken, nil, 0, false},
		{"Length under the minimum", tooShortLength, nil, 0, false},
		{"header only", initial[:6+4+1+4], nil, 0, false},
		{"0-RTT", quicclasstest.AppendLongPacket(nil, v1, typeZeroRTT, client, idA[:], nil, 300), nil, 0, false},
		{"version negotiation", cat([]byte{0x80, 0, 0, 0, 0, 4}, client[:4], []byte{4}, idA[:], []byte{0, 0, 0, 1}), nil, 0, false},
		{"unknown version", quicclasstest.AppendLongPacket(nil, 0x0a0a0a0a, typeInitial, client[:4], idA[:], nil, 1000), nil, 0, false},
		{"fixed bit clear", append([]byte{initial[0] &^ fixedBit}, initial[1:]...), nil, 0, false},
		{"DCID of 21 bytes", quicclasstest.AppendLongPacket(nil, v1, typeHandshake, make([]byte, 21), idA[:], nil, 300), nil, 0, false},
		{"SCID of 21 bytes", quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client, make([]byte, 21), nil, 300), nil, 0, false},
		{"Handshake with an 8-byte SCID", quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], client, nil, 300), nil, 1, true},
		{"Handshake with an empty SCID", quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], nil, nil, 300), nil, 1, true},
		{"Retry with a 5-byte SCID", quicclasstest.AppendLongPacket(nil, v2, typeRetry, client, client[:5], []byte("t"), 0), nil, 1, false},
		// quic-go refuses a connection with an Initial from the client's
		// own destination ID: not the server's, not a peer, not odd,
		// whatever its length (a Retry token's holder may choose 4 bytes).
		{"refusal", quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], client, nil, 30), nil, 0, false},
		{"refusal from a 4-byte ID", quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idB[:], nil, 30), nil, 0, false},
		{"refusal coalesced before a Handshake", cat(quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], client, nil, 30), handshake), []ServerID{idA}, 0, true},
		{"five IDs", cat(
			quicclasstest.AppendLongPacket(nil, v1, typeHandshake, nil, []byte{1, 0, 0, 0}, nil, 20), quicclasstest.AppendLongPacket(nil, v1, typeHandshake, nil, []byte{2, 0, 0, 0}, nil, 20),
			quicclasstest.AppendLongPacket(nil, v1, typeHandshake, nil, []byte{3, 0, 0, 0}, nil, 20), quicclasstest.AppendLongPacket(nil, v1, typeHandshake, nil, []byte{4, 0, 0, 0}, nil, 20),
			quicclasstest.AppendLongPacket(nil, v1, typeHandshake, nil, []byte{5, 0, 0, 0}, nil, 20)),
			[]ServerID{{1}, {2}, {3}, {4}}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := inspect(tt.b)
			if ids := s.ids[:s.nIDs]; !slices.Equal(ids, tt.ids) || s.odd != tt.odd || s.peer != tt.peer {
				t.Fatalf("inspect: IDs %x, odd %d, peer %v; want %x, %d, %v", ids, s.odd, s.peer, tt.ids, tt.odd, tt.peer)
			}
		})
	}
}

func TestVarint(t *testing.T) {
	tests := []struct {
		b []byte
		v uint64
		n int
	}{
		{[]byte{0x25}, 37, 1},
		{[]byte{0x7b, 0xbd}, 15293, 2},
		{[]byte{0x9d, 0x7f, 0x3e, 0x7d}, 494878333, 4},
		{[]byte{0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c}, 151288809941952652, 8},
		{nil, 0, 0},
		{[]byte{0x7b}, 0, 0},
		{[]byte{0xc2, 0x19, 0x7c}, 0, 0},
	}
	for _, tt := range tests {
		if v, n := varint(tt.b); v != tt.v || n != tt.n {
			t.Errorf("varint(%x) = %d, %d; want %d, %d", tt.b, v, n, tt.v, tt.n)
		}
	}
}

// cmsg is a control message of level and type with data, as the kernel
// lays it out.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

// segmentMsg is the UDP_SEGMENT message of a GSO batch of size-byte
// segments, as quic-go writes it.
func segmentMsg(size uint16) []byte {
	return cmsg(unix.IPPROTO_UDP, unix.UDP_SEGMENT, binary.NativeEndian.AppendUint16(nil, size))
}

func TestSegmentSize(t *testing.T) {
	pktinfo := cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, make([]byte, unix.SizeofInet6Pktinfo))
	tos := cmsg(unix.IPPROTO_IP, unix.IP_TOS, []byte{2})
	broken := segmentMsg(1200)
	(*unix.Cmsghdr)(unsafe.Pointer(&broken[0])).SetLen(len(broken) + 8)
	tests := []struct {
		name string
		oob  []byte
		want int
	}{
		{"none", nil, 0},
		{"alone", segmentMsg(1200), 1200},
		{"after packet info and ECN", cat(pktinfo, tos, segmentMsg(1452)), 1452},
		{"packet info only", pktinfo, 0},
		{"length past the end", broken, 0},
		{"cut header", segmentMsg(1200)[:unix.CmsgLen(0)-1], 0},
	}
	for _, tt := range tests {
		if got := segmentSize(tt.oob); got != tt.want {
			t.Errorf("%s: segment size %d, want %d", tt.name, got, tt.want)
		}
	}
}

// FuzzInspect: inspect never reads out of bounds, and what it returns is
// consistent: IDs only from long headers, distinct, within the bound.
func FuzzInspect(f *testing.F) {
	v1 := uint32(quicclass.Version1)
	f.Add(quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], []byte("tok"), 100))
	f.Add(cat(quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 100), quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], idB[:], nil, 40), quicclasstest.ShortHeader(30)))
	f.Add(quicclasstest.AppendLongPacket(nil, quicclass.Version2, typeRetry, client, idB[:], []byte("t"), 0))
	f.Add(quicclasstest.ShortHeader(40))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := inspect(b)
		if s.nIDs > maxIDsPerDatagram || s.nIDs < 0 {
			t.Fatalf("%d IDs", s.nIDs)
		}
		if len(b) > 0 && b[0]&headerForm == 0 && (s.nIDs != 0 || s.odd != 0) {
			t.Fatalf("a short header gave IDs %x, odd %d", s.ids[:s.nIDs], s.odd)
		}
		for i, id := range s.ids[:s.nIDs] {
			if slices.Contains(s.ids[:i], id) {
				t.Fatalf("IDs %x repeat", s.ids[:s.nIDs])
			}
		}
	})
}
