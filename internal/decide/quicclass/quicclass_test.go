package quicclass_test

import (
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
)

// fixedBit is the fixed bit of a QUIC packet's first byte.
const fixedBit = 0x40

func with(b []byte, fn func([]byte)) []byte { fn(b); return b }

func TestClassify(t *testing.T) {
	const (
		initial1   = 0 // v1 type fields
		zeroRTT1   = 1
		handshake1 = 2
		retry1     = 3
		initial2   = 1 // v2
		retry2     = 0
	)
	tests := []struct {
		name   string
		sport  uint16
		data   []byte
		class  quicclass.Class
		reason quicclass.Reason
	}{
		{"empty", 50000, nil, quicclass.Invalid, quicclass.Empty},
		{"blocked port 53", 53, quicclasstest.LongHeader(quicclass.Version1, initial1, 8, 8, 1200), quicclass.Invalid, quicclass.SourcePort},
		{"blocked port 0", 0, quicclasstest.ShortHeader(100), quicclass.Invalid, quicclass.SourcePort},
		{"blocked port 11211", 11211, quicclasstest.ShortHeader(100), quicclass.Invalid, quicclass.SourcePort},
		{"port 1024", 1024, quicclasstest.ShortHeader(100), quicclass.Established, quicclass.NotInvalid},
		{"short header", 50000, quicclasstest.ShortHeader(1200), quicclass.Established, quicclass.NotInvalid},
		{"short header at 21 bytes", 50000, quicclasstest.ShortHeader(21), quicclass.Established, quicclass.NotInvalid},
		{"short header at 20 bytes", 50000, quicclasstest.ShortHeader(20), quicclass.Invalid, quicclass.Truncated},
		{"one byte", 50000, quicclasstest.ShortHeader(1), quicclass.Invalid, quicclass.Truncated},
		{"short header fixed bit 0", 50000, with(quicclasstest.ShortHeader(100), func(b []byte) { b[0] &^= fixedBit }), quicclass.Invalid, quicclass.FixedBit},
		{"dns-like zero byte", 50000, make([]byte, 40), quicclass.Invalid, quicclass.FixedBit},
		{"v1 initial", 50000, quicclasstest.LongHeader(quicclass.Version1, initial1, 8, 8, 1200), quicclass.Opening, quicclass.NotInvalid},
		{"v1 initial 1199", 50000, quicclasstest.LongHeader(quicclass.Version1, initial1, 8, 8, 1199), quicclass.Invalid, quicclass.SmallInitial},
		{"v1 0-rtt small", 50000, quicclasstest.LongHeader(quicclass.Version1, zeroRTT1, 8, 8, 100), quicclass.Opening, quicclass.NotInvalid},
		{"v1 handshake small", 50000, quicclasstest.LongHeader(quicclass.Version1, handshake1, 4, 0, 60), quicclass.Opening, quicclass.NotInvalid},
		{"v1 retry", 50000, quicclasstest.LongHeader(quicclass.Version1, retry1, 8, 8, 1200), quicclass.Invalid, quicclass.ServerOnly},
		{"v2 initial", 50000, quicclasstest.LongHeader(quicclass.Version2, initial2, 8, 8, 1250), quicclass.Opening, quicclass.NotInvalid},
		{"v2 initial small", 50000, quicclasstest.LongHeader(quicclass.Version2, initial2, 8, 8, 500), quicclass.Invalid, quicclass.SmallInitial},
		{"v2 type 0 is retry", 50000, quicclasstest.LongHeader(quicclass.Version2, retry2, 8, 8, 1200), quicclass.Invalid, quicclass.ServerOnly},
		{"v2 handshake small", 50000, quicclasstest.LongHeader(quicclass.Version2, 3, 8, 8, 100), quicclass.Opening, quicclass.NotInvalid},
		{"v1 fixed bit 0", 50000, with(quicclasstest.LongHeader(quicclass.Version1, initial1, 8, 8, 1200), func(b []byte) { b[0] &^= fixedBit }), quicclass.Invalid, quicclass.FixedBit},
		{"v1 dcid 20", 50000, quicclasstest.LongHeader(quicclass.Version1, initial1, 20, 20, 1200), quicclass.Opening, quicclass.NotInvalid},
		{"v1 dcid 21", 50000, quicclasstest.LongHeader(quicclass.Version1, initial1, 21, 0, 1200), quicclass.Invalid, quicclass.ConnectionIDLength},
		{"v1 scid 21", 50000, quicclasstest.LongHeader(quicclass.Version1, initial1, 0, 21, 1200), quicclass.Invalid, quicclass.ConnectionIDLength},
		{"v1 long header, 6 bytes", 50000, quicclasstest.LongHeader(quicclass.Version1, handshake1, 0, 0, 6), quicclass.Invalid, quicclass.Truncated},
		{"v1 long header, 7 bytes", 50000, quicclasstest.LongHeader(quicclass.Version1, handshake1, 0, 0, 7), quicclass.Opening, quicclass.NotInvalid},
		{"v1 dcid cut", 50000, quicclasstest.LongHeader(quicclass.Version1, handshake1, 8, 0, 14), quicclass.Invalid, quicclass.Truncated},
		{"v1 scid cut", 50000, quicclasstest.LongHeader(quicclass.Version1, handshake1, 8, 8, 22), quicclass.Invalid, quicclass.Truncated},
		{"v1 header exact", 50000, quicclasstest.LongHeader(quicclass.Version1, handshake1, 8, 8, 23), quicclass.Opening, quicclass.NotInvalid},
		{"version negotiation", 50000, quicclasstest.LongHeader(0, 0, 8, 8, 1200), quicclass.Invalid, quicclass.ServerOnly},
		{"unknown version 1200", 50000, quicclasstest.LongHeader(0x1a2a3a4a, 0, 8, 8, 1200), quicclass.Negotiation, quicclass.NotInvalid},
		{"unknown version fixed bit 0", 50000, with(quicclasstest.LongHeader(0xff00001d, 0, 8, 8, 1300), func(b []byte) { b[0] &^= fixedBit }), quicclass.Negotiation, quicclass.NotInvalid},
		{"unknown version long cid", 50000, quicclasstest.LongHeader(0x1a2a3a4a, 0, 200, 8, 1300), quicclass.Negotiation, quicclass.NotInvalid},
		{"unknown version 1199", 50000, quicclasstest.LongHeader(0x1a2a3a4a, 0, 8, 8, 1199), quicclass.Invalid, quicclass.SmallUnknownVersion},
		{"long header, 4 bytes", 50000, quicclasstest.LongHeader(quicclass.Version1, initial1, 0, 0, 4), quicclass.Invalid, quicclass.Truncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			probe := tt.data[:min(len(tt.data), quicclass.ProbeBytes)]
			c, r := quicclass.Classify(quicclass.DefaultBlockedPorts(), tt.sport, probe, len(tt.data))
			if c != tt.class || r != tt.reason {
				t.Fatalf("Classify = %v/%v, want %v/%v", c, r, tt.class, tt.reason)
			}
		})
	}
}

func TestBlockedPorts(t *testing.T) {
	s := quicclass.DefaultBlockedPorts()
	for p, want := range map[uint16]bool{0: true, 53: true, 443: true, 1023: true, 1024: false, 1900: true,
		3702: true, 5353: true, 5683: true, 11211: true, 11212: false, 49152: false, 65535: false} {
		if s.Has(p) != want {
			t.Errorf("port %d blocked = %v, want %v", p, !want, want)
		}
	}
	var none quicclass.Ports
	none.Add(65535, 65535)
	if !none.Has(65535) || none.Has(65534) {
		t.Error("Add(65535, 65535)")
	}
	if c, _ := quicclass.Classify(nil, 53, quicclasstest.ShortHeader(100), 100); c != quicclass.Established {
		t.Errorf("no blocked ports: port 53 is %v", c)
	}
}

// FuzzClassify: any input classifies without panicking, and a valid class
// has no reason.
func FuzzClassify(f *testing.F) {
	f.Add(uint16(443), quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200))
	f.Add(uint16(50000), quicclasstest.ShortHeader(30))
	f.Add(uint16(50000), []byte{0xc0, 0, 0, 0, 1, 25})
	f.Fuzz(func(t *testing.T, sport uint16, data []byte) {
		probe := data[:min(len(data), quicclass.ProbeBytes)]
		c, r := quicclass.Classify(quicclass.DefaultBlockedPorts(), sport, probe, len(data))
		if (c == quicclass.Invalid) != (r != quicclass.NotInvalid) || c >= quicclass.NumClasses || r >= quicclass.NumReasons {
			t.Fatalf("Classify(%d, %x) = %v/%v", sport, data, c, r)
		}
	})
}

// serverID and clientID are connection IDs for the verification tests: one
// the server issued (4 bytes), one a client chose (8 bytes).
var (
	serverID = [quicclass.ServerIDLen]byte{0xa1, 0xb2, 0xc3, 0xd4}
	clientID = []byte{1, 2, 3, 4, 5, 6, 7, 8}
)

// TestInspect: with verification, every long header of a known version has
// its lengths checked, and every datagram that may be verified says what to
// look up; without it, Inspect is Classify. Both versions.
func TestInspect(t *testing.T) {
	type want struct {
		class  quicclass.Class
		reason quicclass.Reason
		check  quicclass.Check
		hasID  bool
	}
	sid := serverID[:]
	for _, v := range []struct {
		name                        string
		version                     uint32
		initial, zeroRTT, handshake uint8
	}{{"v1", quicclass.Version1, 0, 1, 2}, {"v2", quicclass.Version2, 1, 2, 3}} {
		ver := v.version
		tests := []struct {
			name     string
			data     []byte
			verified want
			plain    want // without verification
		}{
			{"initial", quicclasstest.LongPacket(ver, v.initial, clientID, clientID, nil, 1200),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial to a server id", quicclasstest.LongPacket(ver, v.initial, sid, clientID, []byte("a retry token"), 1200),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, true}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial with a long token", quicclasstest.LongPacket(ver, v.initial, clientID, clientID, make([]byte, 300), 1250),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial with a 1100-byte token", quicclasstest.LongPacket(ver, v.initial, clientID, nil, make([]byte, 1100), 1200),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial, token past the end", with(quicclasstest.LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16:], quicclasstest.AppendVarint(nil, 1200))
			}), want{quicclass.Invalid, quicclass.Length, quicclass.CheckNone, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial, zero length", quicclasstest.LongHeader(ver, v.initial, 8, 8, 1200),
				want{quicclass.Invalid, quicclass.Length, quicclass.CheckNone, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial, length 19", with(quicclasstest.LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], []byte{0x40, 19})
			}), want{quicclass.Invalid, quicclass.Length, quicclass.CheckNone, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial, length one past the end", with(quicclasstest.LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], quicclasstest.AppendVarint(nil, 1200-(7+16+1+2)+1))
			}), want{quicclass.Invalid, quicclass.Length, quicclass.CheckNone, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial, length shorter than the datagram (coalesced)", with(quicclasstest.LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], quicclasstest.AppendVarint(nil, 400))
			}), want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"initial, 8-byte length", with(quicclasstest.LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], []byte{0xc0, 0, 0, 0, 0, 0, 0, 100})
			}), want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"0-rtt", quicclasstest.LongPacket(ver, v.zeroRTT, clientID, clientID, nil, 300),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"0-rtt to a server id", quicclasstest.LongPacket(ver, v.zeroRTT, sid, clientID, nil, 300),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, true}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"handshake", quicclasstest.LongPacket(ver, v.handshake, sid, clientID, nil, 80),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckHandshake, true}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"handshake to an 8-byte id", quicclasstest.LongPacket(ver, v.handshake, clientID, clientID, nil, 80),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckHandshake, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"handshake, smallest", quicclasstest.LongPacket(ver, v.handshake, sid, nil, nil, 7+4+2+20),
				want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckHandshake, true}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"handshake, 7 bytes", with(quicclasstest.LongHeader(ver, v.handshake, 0, 0, 7), func(b []byte) {}),
				want{quicclass.Invalid, quicclass.Length, quicclass.CheckNone, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"handshake, length cut", quicclasstest.LongPacket(ver, v.handshake, sid, nil, nil, 80)[:7+4+1],
				want{quicclass.Invalid, quicclass.Length, quicclass.CheckNone, false}, want{quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, false}},
			{"retry stays server only", quicclasstest.LongHeader(ver, map[uint32]uint8{quicclass.Version1: 3, quicclass.Version2: 0}[ver], 4, 8, 100),
				want{quicclass.Invalid, quicclass.ServerOnly, quicclass.CheckNone, false}, want{quicclass.Invalid, quicclass.ServerOnly, quicclass.CheckNone, false}},
			{"small initial stays small", quicclasstest.LongPacket(ver, v.initial, clientID, clientID, nil, 1000),
				want{quicclass.Invalid, quicclass.SmallInitial, quicclass.CheckNone, false}, want{quicclass.Invalid, quicclass.SmallInitial, quicclass.CheckNone, false}},
		}
		for _, tt := range tests {
			t.Run(v.name+" "+tt.name, func(t *testing.T) {
				for _, verify := range []bool{true, false} {
					w := tt.plain
					if verify {
						w = tt.verified
					}
					h := quicclass.Inspect(quicclass.DefaultBlockedPorts(), 50000, tt.data, len(tt.data), verify)
					if h.Class != w.class || h.Reason != w.reason || h.Check != w.check || h.HasID != w.hasID {
						t.Fatalf("verify=%v: Inspect = %+v, want %+v", verify, h, w)
					}
					if h.HasID && h.ID != serverID {
						t.Fatalf("ID %x, want %x", h.ID, serverID)
					}
					// What the BPF program reads: the probe, and the rest
					// of the datagram through loads.
					if !verify {
						if c, r := quicclass.Classify(quicclass.DefaultBlockedPorts(), 50000, tt.data[:min(len(tt.data), quicclass.ProbeBytes)], len(tt.data)); c != h.Class || r != h.Reason {
							t.Fatalf("Classify = %v/%v, Inspect %v/%v", c, r, h.Class, h.Reason)
						}
					}
				}
			})
		}
	}
	t.Run("short header", func(t *testing.T) {
		h := quicclass.Inspect(nil, 50000, quicclasstest.ShortPacket(serverID, 100), 100, true)
		if h.Class != quicclass.Unverified || h.Check != quicclass.CheckShort || !h.HasID || h.ID != serverID {
			t.Fatalf("Inspect = %+v", h)
		}
		if h := quicclass.Inspect(nil, 50000, quicclasstest.ShortPacket(serverID, 100), 100, false); h.Class != quicclass.Established || h.Check != quicclass.CheckNone {
			t.Fatalf("without verification: Inspect = %+v", h)
		}
		if h := quicclass.Inspect(nil, 50000, quicclasstest.ShortPacket(serverID, 20), 20, true); h.Class != quicclass.Invalid || h.Reason != quicclass.Truncated {
			t.Fatalf("20 bytes: Inspect = %+v", h)
		}
	})
	t.Run("fields beyond the bytes given pass", func(t *testing.T) {
		b := quicclasstest.LongPacket(quicclass.Version1, 0, clientID, clientID, make([]byte, 100), 1200)
		if h := quicclass.Inspect(nil, 50000, b[:quicclass.ProbeBytes], len(b), true); h.Class != quicclass.Opening || h.Check != quicclass.CheckOpening {
			t.Fatalf("Inspect = %+v", h)
		}
	})
}

// TestResolve: every check with every answer.
func TestResolve(t *testing.T) {
	tests := []struct {
		check                             quicclass.Check
		idKnown, peer, answered, credited bool
		class                             quicclass.Class
		reason                            quicclass.Reason
		verified                          quicclass.Verification
		needsPeer, returning              bool
	}{
		{quicclass.CheckShort, true, false, false, false, quicclass.Established, quicclass.NotInvalid, quicclass.ShortByID, false, false},
		{quicclass.CheckShort, false, true, false, false, quicclass.Established, quicclass.NotInvalid, quicclass.ShortByPeer, true, false},
		{quicclass.CheckShort, false, false, true, true, quicclass.Established, quicclass.NotInvalid, quicclass.FromAnswered, true, false},
		{quicclass.CheckShort, false, false, true, false, quicclass.Unverified, quicclass.NotInvalid, quicclass.OverCredit, true, false},
		{quicclass.CheckShort, false, false, false, false, quicclass.Unverified, quicclass.NotInvalid, quicclass.NotVerified, true, false},
		{quicclass.CheckOpening, true, false, false, false, quicclass.Established, quicclass.NotInvalid, quicclass.OpeningByID, false, false},
		{quicclass.CheckOpening, false, true, false, false, quicclass.Opening, quicclass.NotInvalid, quicclass.OpeningFromPeer, true, true},
		{quicclass.CheckOpening, false, false, true, true, quicclass.Opening, quicclass.NotInvalid, quicclass.OpeningFromAnswered, true, false},
		{quicclass.CheckOpening, false, false, true, false, quicclass.Opening, quicclass.NotInvalid, quicclass.OverCredit, true, false},
		{quicclass.CheckOpening, false, false, false, false, quicclass.Opening, quicclass.NotInvalid, quicclass.NotVerified, true, false},
		{quicclass.CheckHandshake, true, false, false, false, quicclass.Established, quicclass.NotInvalid, quicclass.OpeningByID, false, false},
		{quicclass.CheckHandshake, false, true, false, false, quicclass.Established, quicclass.NotInvalid, quicclass.HandshakeFromPeer, true, false},
		{quicclass.CheckHandshake, false, false, true, true, quicclass.Established, quicclass.NotInvalid, quicclass.FromAnswered, true, false},
		{quicclass.CheckHandshake, false, false, true, false, quicclass.Unverified, quicclass.NotInvalid, quicclass.OverCredit, true, false},
		{quicclass.CheckHandshake, false, false, false, false, quicclass.Invalid, quicclass.UnknownConnectionID, quicclass.NotVerified, true, false},
		{quicclass.CheckNone, true, true, false, false, quicclass.Negotiation, quicclass.NotInvalid, quicclass.NotVerified, false, false},
	}
	for _, tt := range tests {
		h := quicclass.Header{Class: quicclass.Negotiation, Check: tt.check}
		if tt.check != quicclass.CheckNone {
			h.Class = quicclass.Opening
		}
		c, r, v := h.Resolve(tt.idKnown, tt.peer, tt.answered, tt.credited)
		if c != tt.class || r != tt.reason || v != tt.verified || h.NeedsPeer(tt.idKnown) != tt.needsPeer ||
			v.Returning() != tt.returning {
			t.Errorf("check %d id %v peer %v answered %v credited %v: %v/%v/%v needs peer %v returning %v, "+
				"want %v/%v/%v %v %v", tt.check, tt.idKnown, tt.peer, tt.answered, tt.credited,
				c, r, v, h.NeedsPeer(tt.idKnown), v.Returning(), tt.class, tt.reason, tt.verified, tt.needsPeer, tt.returning)
		}
	}
	if quicclass.Unverified.String() != "unverified" || quicclass.UnknownConnectionID.String() != "unknown_connection_id" ||
		quicclass.Length.String() != "length" || quicclass.OpeningFromPeer.String() != "opening_from_peer" || quicclass.OverCredit.String() != "over_credit" {
		t.Error("names")
	}
}

// TestAttempts: only a long header with an ID that may be a server's is
// an attempt at a proof; a short header never is, whatever its ID.
func TestAttempts(t *testing.T) {
	for _, tt := range []struct {
		check quicclass.Check
		hasID bool
		want  bool
	}{
		{quicclass.CheckShort, true, false},
		{quicclass.CheckOpening, true, true},
		{quicclass.CheckOpening, false, false},
		{quicclass.CheckHandshake, true, true},
		{quicclass.CheckHandshake, false, false},
		{quicclass.CheckNone, true, false},
	} {
		h := quicclass.Header{Check: tt.check, HasID: tt.hasID}
		if h.Attempts() != tt.want {
			t.Errorf("check %d has ID %v: attempts %v, want %v", tt.check, tt.hasID, h.Attempts(), tt.want)
		}
	}
}

// FuzzInspect: any input inspects without panicking, verified or not, and
// without verification Inspect is Classify.
func FuzzInspect(f *testing.F) {
	f.Add(uint16(50000), quicclasstest.LongPacket(quicclass.Version1, 0, clientID, clientID, []byte("tok"), 1200))
	f.Add(uint16(50000), quicclasstest.LongPacket(quicclass.Version2, 3, serverID[:], nil, nil, 60))
	f.Add(uint16(50000), []byte{0xe0, 0, 0, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, sport uint16, data []byte) {
		h := quicclass.Inspect(quicclass.DefaultBlockedPorts(), sport, data, len(data), true)
		if (h.Class == quicclass.Invalid) != (h.Reason != quicclass.NotInvalid) || h.Class >= quicclass.NumClasses || h.Reason >= quicclass.NumReasons {
			t.Fatalf("Inspect(%d, %x) = %+v", sport, data, h)
		}
		c, r, _ := h.Resolve(true, true, true, true)
		if (c == quicclass.Invalid) != (r != quicclass.NotInvalid) {
			t.Fatalf("Resolve = %v/%v", c, r)
		}
	})
}
