package quicclass

import (
	"bytes"
	"testing"
)

// TestBuilders: each builder's datagram is of the class and verification
// check it is meant to be; AppendLongPacket's packets are typed as v1 or v2
// numbers them, and coalesce.
func TestBuilders(t *testing.T) {
	sid := serverID[:]
	handshake := AppendLongPacket(nil, Version1, typeHandshake, sid, clientID, nil, 100)
	tests := []struct {
		name    string
		data    []byte
		verify  bool
		class   Class
		reason  Reason
		check   Check
		wantLen int
	}{
		{"Initial", Initial(), false, Opening, NotInvalid, CheckNone, MinInitialDatagram},
		{"Initial, verified: a Length of 0", Initial(), true, Invalid, Length, CheckNone, MinInitialDatagram},
		{"UnknownVersion", UnknownVersion(), false, Negotiation, NotInvalid, CheckNone, MinInitialDatagram},
		{"v1 Initial with a token", AppendLongPacket(nil, Version1, typeInitial, clientID, clientID, []byte("token"), 1200-32),
			true, Opening, NotInvalid, CheckOpening, 1200},
		{"v2 Initial", AppendLongPacket(nil, Version2, typeInitial, clientID, clientID, nil, 1200-27),
			true, Opening, NotInvalid, CheckOpening, 1200},
		{"v2 0-RTT", AppendLongPacket(nil, Version2, typeZeroRTT, sid, clientID, nil, 100), true, Opening, NotInvalid, CheckOpening, 121},
		{"v1 Handshake", handshake, true, Opening, NotInvalid, CheckHandshake, 121},
		{"v2 Handshake", AppendLongPacket(nil, Version2, typeHandshake, sid, clientID, nil, 100),
			true, Opening, NotInvalid, CheckHandshake, 121},
		{"Handshake and Handshake", AppendLongPacket(bytes.Clone(handshake), Version1, typeHandshake, sid, nil, nil, 30),
			true, Opening, NotInvalid, CheckHandshake, 121 + 43},
		{"v1 Retry", AppendLongPacket(nil, Version1, typeRetry, clientID, sid, []byte("token"), 0), false, Invalid, ServerOnly, CheckNone,
			7 + 12 + 5 + retryTagLen},
		{"v2 Retry", AppendLongPacket(nil, Version2, typeRetry, clientID, sid, []byte("token"), 0), false, Invalid, ServerOnly, CheckNone,
			7 + 12 + 5 + retryTagLen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.data) != tt.wantLen {
				t.Fatalf("%d bytes, want %d", len(tt.data), tt.wantLen)
			}
			h := Inspect(DefaultBlockedPorts(), 50000, tt.data, len(tt.data), tt.verify)
			if h.Class != tt.class || h.Reason != tt.reason || h.Check != tt.check {
				t.Fatalf("Inspect = %v/%v check %v, want %v/%v check %v", h.Class, h.Reason, h.Check, tt.class, tt.reason, tt.check)
			}
		})
	}
}
