package quicclass

import "testing"

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
		class  Class
		reason Reason
	}{
		{"empty", 50000, nil, Invalid, Empty},
		{"blocked port 53", 53, LongHeader(Version1, initial1, 8, 8, 1200), Invalid, SourcePort},
		{"blocked port 0", 0, ShortHeader(100), Invalid, SourcePort},
		{"blocked port 11211", 11211, ShortHeader(100), Invalid, SourcePort},
		{"port 1024", 1024, ShortHeader(100), Established, NotInvalid},
		{"short header", 50000, ShortHeader(1200), Established, NotInvalid},
		{"short header at 21 bytes", 50000, ShortHeader(21), Established, NotInvalid},
		{"short header at 20 bytes", 50000, ShortHeader(20), Invalid, Truncated},
		{"one byte", 50000, ShortHeader(1), Invalid, Truncated},
		{"short header fixed bit 0", 50000, with(ShortHeader(100), func(b []byte) { b[0] &^= fixedBit }), Invalid, FixedBit},
		{"dns-like zero byte", 50000, make([]byte, 40), Invalid, FixedBit},
		{"v1 initial", 50000, LongHeader(Version1, initial1, 8, 8, 1200), Opening, NotInvalid},
		{"v1 initial 1199", 50000, LongHeader(Version1, initial1, 8, 8, 1199), Invalid, SmallInitial},
		{"v1 0-rtt small", 50000, LongHeader(Version1, zeroRTT1, 8, 8, 100), Opening, NotInvalid},
		{"v1 handshake small", 50000, LongHeader(Version1, handshake1, 4, 0, 60), Opening, NotInvalid},
		{"v1 retry", 50000, LongHeader(Version1, retry1, 8, 8, 1200), Invalid, ServerOnly},
		{"v2 initial", 50000, LongHeader(Version2, initial2, 8, 8, 1250), Opening, NotInvalid},
		{"v2 initial small", 50000, LongHeader(Version2, initial2, 8, 8, 500), Invalid, SmallInitial},
		{"v2 type 0 is retry", 50000, LongHeader(Version2, retry2, 8, 8, 1200), Invalid, ServerOnly},
		{"v2 handshake small", 50000, LongHeader(Version2, 3, 8, 8, 100), Opening, NotInvalid},
		{"v1 fixed bit 0", 50000, with(LongHeader(Version1, initial1, 8, 8, 1200), func(b []byte) { b[0] &^= fixedBit }), Invalid, FixedBit},
		{"v1 dcid 20", 50000, LongHeader(Version1, initial1, 20, 20, 1200), Opening, NotInvalid},
		{"v1 dcid 21", 50000, LongHeader(Version1, initial1, 21, 0, 1200), Invalid, ConnectionIDLength},
		{"v1 scid 21", 50000, LongHeader(Version1, initial1, 0, 21, 1200), Invalid, ConnectionIDLength},
		{"v1 long header, 6 bytes", 50000, LongHeader(Version1, handshake1, 0, 0, 6), Invalid, Truncated},
		{"v1 long header, 7 bytes", 50000, LongHeader(Version1, handshake1, 0, 0, 7), Opening, NotInvalid},
		{"v1 dcid cut", 50000, LongHeader(Version1, handshake1, 8, 0, 14), Invalid, Truncated},
		{"v1 scid cut", 50000, LongHeader(Version1, handshake1, 8, 8, 22), Invalid, Truncated},
		{"v1 header exact", 50000, LongHeader(Version1, handshake1, 8, 8, 23), Opening, NotInvalid},
		{"version negotiation", 50000, LongHeader(0, 0, 8, 8, 1200), Invalid, ServerOnly},
		{"unknown version 1200", 50000, LongHeader(0x1a2a3a4a, 0, 8, 8, 1200), Negotiation, NotInvalid},
		{"unknown version fixed bit 0", 50000, with(LongHeader(0xff00001d, 0, 8, 8, 1300), func(b []byte) { b[0] &^= fixedBit }), Negotiation, NotInvalid},
		{"unknown version long cid", 50000, LongHeader(0x1a2a3a4a, 0, 200, 8, 1300), Negotiation, NotInvalid},
		{"unknown version 1199", 50000, LongHeader(0x1a2a3a4a, 0, 8, 8, 1199), Invalid, SmallUnknownVersion},
		{"long header, 4 bytes", 50000, LongHeader(Version1, initial1, 0, 0, 4), Invalid, Truncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			probe := tt.data[:min(len(tt.data), ProbeBytes)]
			c, r := Classify(DefaultBlockedPorts(), tt.sport, probe, len(tt.data))
			if c != tt.class || r != tt.reason {
				t.Fatalf("Classify = %v/%v, want %v/%v", c, r, tt.class, tt.reason)
			}
		})
	}
}

func TestBlockedPorts(t *testing.T) {
	s := DefaultBlockedPorts()
	for p, want := range map[uint16]bool{0: true, 53: true, 443: true, 1023: true, 1024: false, 1900: true,
		3702: true, 5353: true, 5683: true, 11211: true, 11212: false, 49152: false, 65535: false} {
		if s.Has(p) != want {
			t.Errorf("port %d blocked = %v, want %v", p, !want, want)
		}
	}
	var none Ports
	none.Add(65535, 65535)
	if !none.Has(65535) || none.Has(65534) {
		t.Error("Add(65535, 65535)")
	}
	if c, _ := Classify(nil, 53, ShortHeader(100), 100); c != Established {
		t.Errorf("no blocked ports: port 53 is %v", c)
	}
}

// FuzzClassify: any input classifies without panicking, and a valid class
// has no reason.
func FuzzClassify(f *testing.F) {
	f.Add(uint16(443), LongHeader(Version1, 0, 8, 8, 1200))
	f.Add(uint16(50000), ShortHeader(30))
	f.Add(uint16(50000), []byte{0xc0, 0, 0, 0, 1, 25})
	f.Fuzz(func(t *testing.T, sport uint16, data []byte) {
		probe := data[:min(len(data), ProbeBytes)]
		c, r := Classify(DefaultBlockedPorts(), sport, probe, len(data))
		if (c == Invalid) != (r != NotInvalid) || c >= NumClasses || r >= NumReasons {
			t.Fatalf("Classify(%d, %x) = %v/%v", sport, data, c, r)
		}
	})
}

// serverID and clientID are connection IDs for the verification tests: one
// the server issued (4 bytes), one a client chose (8 bytes).
var (
	serverID = [ServerIDLen]byte{0xa1, 0xb2, 0xc3, 0xd4}
	clientID = []byte{1, 2, 3, 4, 5, 6, 7, 8}
)

// TestInspect: with verification, every long header of a known version has
// its lengths checked, and every datagram that may be verified says what to
// look up; without it, Inspect is Classify. Both versions.
func TestInspect(t *testing.T) {
	type want struct {
		class  Class
		reason Reason
		check  Check
		hasID  bool
	}
	sid := serverID[:]
	for _, v := range []struct {
		name                        string
		version                     uint32
		initial, zeroRTT, handshake uint8
	}{{"v1", Version1, 0, 1, 2}, {"v2", Version2, 1, 2, 3}} {
		ver := v.version
		tests := []struct {
			name     string
			data     []byte
			verified want
			plain    want // without verification
		}{
			{"initial", LongPacket(ver, v.initial, clientID, clientID, nil, 1200),
				want{Opening, NotInvalid, CheckOpening, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial to a server id", LongPacket(ver, v.initial, sid, clientID, []byte("a retry token"), 1200),
				want{Opening, NotInvalid, CheckOpening, true}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial with a long token", LongPacket(ver, v.initial, clientID, clientID, make([]byte, 300), 1250),
				want{Opening, NotInvalid, CheckOpening, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial with a 1100-byte token", LongPacket(ver, v.initial, clientID, nil, make([]byte, 1100), 1200),
				want{Opening, NotInvalid, CheckOpening, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial, token past the end", with(LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16:], AppendVarint(nil, 1200))
			}), want{Invalid, Length, CheckNone, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial, zero length", LongHeader(ver, v.initial, 8, 8, 1200),
				want{Invalid, Length, CheckNone, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial, length 19", with(LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], []byte{0x40, 19})
			}), want{Invalid, Length, CheckNone, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial, length one past the end", with(LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], AppendVarint(nil, 1200-(7+16+1+2)+1))
			}), want{Invalid, Length, CheckNone, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial, length shorter than the datagram (coalesced)", with(LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], AppendVarint(nil, 400))
			}), want{Opening, NotInvalid, CheckOpening, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"initial, 8-byte length", with(LongPacket(ver, v.initial, clientID, clientID, nil, 1200), func(b []byte) {
				copy(b[7+16+1:], []byte{0xc0, 0, 0, 0, 0, 0, 0, 100})
			}), want{Opening, NotInvalid, CheckOpening, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"0-rtt", LongPacket(ver, v.zeroRTT, clientID, clientID, nil, 300),
				want{Opening, NotInvalid, CheckOpening, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"0-rtt to a server id", LongPacket(ver, v.zeroRTT, sid, clientID, nil, 300),
				want{Opening, NotInvalid, CheckOpening, true}, want{Opening, NotInvalid, CheckNone, false}},
			{"handshake", LongPacket(ver, v.handshake, sid, clientID, nil, 80),
				want{Opening, NotInvalid, CheckHandshake, true}, want{Opening, NotInvalid, CheckNone, false}},
			{"handshake to an 8-byte id", LongPacket(ver, v.handshake, clientID, clientID, nil, 80),
				want{Opening, NotInvalid, CheckHandshake, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"handshake, smallest", LongPacket(ver, v.handshake, sid, nil, nil, 7+4+2+20),
				want{Opening, NotInvalid, CheckHandshake, true}, want{Opening, NotInvalid, CheckNone, false}},
			{"handshake, 7 bytes", with(LongHeader(ver, v.handshake, 0, 0, 7), func(b []byte) {}),
				want{Invalid, Length, CheckNone, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"handshake, length cut", LongPacket(ver, v.handshake, sid, nil, nil, 80)[:7+4+1],
				want{Invalid, Length, CheckNone, false}, want{Opening, NotInvalid, CheckNone, false}},
			{"retry stays server only", LongHeader(ver, map[uint32]uint8{Version1: 3, Version2: 0}[ver], 4, 8, 100),
				want{Invalid, ServerOnly, CheckNone, false}, want{Invalid, ServerOnly, CheckNone, false}},
			{"small initial stays small", LongPacket(ver, v.initial, clientID, clientID, nil, 1000),
				want{Invalid, SmallInitial, CheckNone, false}, want{Invalid, SmallInitial, CheckNone, false}},
		}
		for _, tt := range tests {
			t.Run(v.name+" "+tt.name, func(t *testing.T) {
				for _, verify := range []bool{true, false} {
					w := tt.plain
					if verify {
						w = tt.verified
					}
					h := Inspect(DefaultBlockedPorts(), 50000, tt.data, len(tt.data), verify)
					if h.Class != w.class || h.Reason != w.reason || h.Check != w.check || h.HasID != w.hasID {
						t.Fatalf("verify=%v: Inspect = %+v, want %+v", verify, h, w)
					}
					if h.HasID && h.ID != serverID {
						t.Fatalf("ID %x, want %x", h.ID, serverID)
					}
					// What the BPF program reads: the probe, and the rest
					// of the datagram through loads.
					if !verify {
						if c, r := Classify(DefaultBlockedPorts(), 50000, tt.data[:min(len(tt.data), ProbeBytes)], len(tt.data)); c != h.Class || r != h.Reason {
							t.Fatalf("Classify = %v/%v, Inspect %v/%v", c, r, h.Class, h.Reason)
						}
					}
				}
			})
		}
	}
	t.Run("short header", func(t *testing.T) {
		h := Inspect(nil, 50000, ShortPacket(serverID, 100), 100, true)
		if h.Class != Unverified || h.Check != CheckShort || !h.HasID || h.ID != serverID {
			t.Fatalf("Inspect = %+v", h)
		}
		if h := Inspect(nil, 50000, ShortPacket(serverID, 100), 100, false); h.Class != Established || h.Check != CheckNone {
			t.Fatalf("without verification: Inspect = %+v", h)
		}
		if h := Inspect(nil, 50000, ShortPacket(serverID, 20), 20, true); h.Class != Invalid || h.Reason != Truncated {
			t.Fatalf("20 bytes: Inspect = %+v", h)
		}
	})
	t.Run("fields beyond the bytes given pass", func(t *testing.T) {
		b := LongPacket(Version1, 0, clientID, clientID, make([]byte, 100), 1200)
		if h := Inspect(nil, 50000, b[:ProbeBytes], len(b), true); h.Class != Opening || h.Check != CheckOpening {
			t.Fatalf("Inspect = %+v", h)
		}
	})
}

// TestResolve: every check with every answer.
func TestResolve(t *testing.T) {
	tests := []struct {
		check                             Check
		idKnown, peer, answered, credited bool
		class                             Class
		reason                            Reason
		verified                          Verification
		needsPeer, returning              bool
	}{
		{CheckShort, true, false, false, false, Established, NotInvalid, ShortByID, false, false},
		{CheckShort, false, true, false, false, Established, NotInvalid, ShortByPeer, true, false},
		{CheckShort, false, false, true, true, Established, NotInvalid, FromAnswered, true, false},
		{CheckShort, false, false, true, false, Unverified, NotInvalid, OverCredit, true, false},
		{CheckShort, false, false, false, false, Unverified, NotInvalid, NotVerified, true, false},
		{CheckOpening, true, false, false, false, Established, NotInvalid, OpeningByID, false, false},
		{CheckOpening, false, true, false, false, Opening, NotInvalid, OpeningFromPeer, true, true},
		{CheckOpening, false, false, true, true, Opening, NotInvalid, OpeningFromAnswered, true, true},
		{CheckOpening, false, false, true, false, Opening, NotInvalid, OverCredit, true, false},
		{CheckOpening, false, false, false, false, Opening, NotInvalid, NotVerified, true, false},
		{CheckHandshake, true, false, false, false, Established, NotInvalid, OpeningByID, false, false},
		{CheckHandshake, false, true, false, false, Established, NotInvalid, HandshakeFromPeer, true, false},
		{CheckHandshake, false, false, true, true, Established, NotInvalid, FromAnswered, true, false},
		{CheckHandshake, false, false, true, false, Unverified, NotInvalid, OverCredit, true, false},
		{CheckHandshake, false, false, false, false, Invalid, UnknownConnectionID, NotVerified, true, false},
		{CheckNone, true, true, false, false, Negotiation, NotInvalid, NotVerified, false, false},
	}
	for _, tt := range tests {
		h := Header{Class: Negotiation, Check: tt.check}
		if tt.check != CheckNone {
			h.Class = Opening
		}
		c, r, v := h.Resolve(tt.idKnown, tt.peer, tt.answered, tt.credited)
		if c != tt.class || r != tt.reason || v != tt.verified || h.NeedsPeer(tt.idKnown) != tt.needsPeer ||
			v.Returning() != tt.returning {
			t.Errorf("check %d id %v peer %v answered %v credited %v: %v/%v/%v needs peer %v returning %v, "+
				"want %v/%v/%v %v %v", tt.check, tt.idKnown, tt.peer, tt.answered, tt.credited,
				c, r, v, h.NeedsPeer(tt.idKnown), v.Returning(), tt.class, tt.reason, tt.verified, tt.needsPeer, tt.returning)
		}
	}
	if Unverified.String() != "unverified" || UnknownConnectionID.String() != "unknown_connection_id" ||
		Length.String() != "length" || OpeningFromPeer.String() != "opening_from_peer" || OverCredit.String() != "over_credit" {
		t.Error("names")
	}
}

// TestAttempts: only a long header with an ID that may be a server's is
// an attempt at a proof; a short header never is, whatever its ID.
func TestAttempts(t *testing.T) {
	for _, tt := range []struct {
		check Check
		hasID bool
		want  bool
	}{
		{CheckShort, true, false},
		{CheckOpening, true, true},
		{CheckOpening, false, false},
		{CheckHandshake, true, true},
		{CheckHandshake, false, false},
		{CheckNone, true, false},
	} {
		h := Header{Check: tt.check, HasID: tt.hasID}
		if h.Attempts() != tt.want {
			t.Errorf("check %d has ID %v: attempts %v, want %v", tt.check, tt.hasID, h.Attempts(), tt.want)
		}
	}
}

// FuzzInspect: any input inspects without panicking, verified or not, and
// without verification Inspect is Classify.
func FuzzInspect(f *testing.F) {
	f.Add(uint16(50000), LongPacket(Version1, 0, clientID, clientID, []byte("tok"), 1200))
	f.Add(uint16(50000), LongPacket(Version2, 3, serverID[:], nil, nil, 60))
	f.Add(uint16(50000), []byte{0xe0, 0, 0, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, sport uint16, data []byte) {
		h := Inspect(DefaultBlockedPorts(), sport, data, len(data), true)
		if (h.Class == Invalid) != (h.Reason != NotInvalid) || h.Class >= NumClasses || h.Reason >= NumReasons {
			t.Fatalf("Inspect(%d, %x) = %+v", sport, data, h)
		}
		c, r, _ := h.Resolve(true, true, true, true)
		if (c == Invalid) != (r != NotInvalid) {
			t.Fatalf("Resolve = %v/%v", c, r)
		}
	})
}
