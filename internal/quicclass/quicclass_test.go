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
