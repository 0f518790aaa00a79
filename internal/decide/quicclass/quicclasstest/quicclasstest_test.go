package quicclasstest

import (
	"bytes"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// serverID and clientID are connection IDs: one the server issued (4
// bytes), one a client chose (8 bytes).
var (
	serverID = [quicclass.ServerIDLen]byte{0xa1, 0xb2, 0xc3, 0xd4}
	clientID = []byte{1, 2, 3, 4, 5, 6, 7, 8}
)

// Long header packet types as numbered by QUIC v1, past those of the
// builders.
const (
	typeZeroRTT   = 1
	typeHandshake = 2
)

// TestBuilders: each builder's datagram is of the class and verification
// check it is meant to be; AppendLongPacket's packets are typed as v1 or v2
// numbers them, and coalesce.
func TestBuilders(t *testing.T) {
	sid := serverID[:]
	handshake := AppendLongPacket(nil, quicclass.Version1, typeHandshake, sid, clientID, nil, 100)
	tests := []struct {
		name    string
		data    []byte
		verify  bool
		class   quicclass.Class
		reason  quicclass.Reason
		check   quicclass.Check
		wantLen int
	}{
		{"Initial", Initial(), false, quicclass.Opening, quicclass.NotInvalid, quicclass.CheckNone, quicclass.MinInitialDatagram},
		{"Initial, verified: a quicclass.Length of 0", Initial(), true, quicclass.Invalid, quicclass.Length, quicclass.CheckNone, quicclass.MinInitialDatagram},
		{"UnknownVersion", UnknownVersion(), false, quicclass.Negotiation, quicclass.NotInvalid, quicclass.CheckNone, quicclass.MinInitialDatagram},
		{"v1 Initial with a token", AppendLongPacket(nil, quicclass.Version1, typeInitial, clientID, clientID, []byte("token"), 1200-32),
			true, quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, 1200},
		{"v2 Initial", AppendLongPacket(nil, quicclass.Version2, typeInitial, clientID, clientID, nil, 1200-27),
			true, quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, 1200},
		{"v2 0-RTT", AppendLongPacket(nil, quicclass.Version2, typeZeroRTT, sid, clientID, nil, 100), true, quicclass.Opening, quicclass.NotInvalid, quicclass.CheckOpening, 121},
		{"v1 Handshake", handshake, true, quicclass.Opening, quicclass.NotInvalid, quicclass.CheckHandshake, 121},
		{"v2 Handshake", AppendLongPacket(nil, quicclass.Version2, typeHandshake, sid, clientID, nil, 100),
			true, quicclass.Opening, quicclass.NotInvalid, quicclass.CheckHandshake, 121},
		{"Handshake and Handshake", AppendLongPacket(bytes.Clone(handshake), quicclass.Version1, typeHandshake, sid, nil, nil, 30),
			true, quicclass.Opening, quicclass.NotInvalid, quicclass.CheckHandshake, 121 + 43},
		{"v1 Retry", AppendLongPacket(nil, quicclass.Version1, typeRetry, clientID, sid, []byte("token"), 0), false, quicclass.Invalid, quicclass.ServerOnly, quicclass.CheckNone,
			7 + 12 + 5 + retryTagLen},
		{"v2 Retry", AppendLongPacket(nil, quicclass.Version2, typeRetry, clientID, sid, []byte("token"), 0), false, quicclass.Invalid, quicclass.ServerOnly, quicclass.CheckNone,
			7 + 12 + 5 + retryTagLen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.data) != tt.wantLen {
				t.Fatalf("%d bytes, want %d", len(tt.data), tt.wantLen)
			}
			h := quicclass.Inspect(quicclass.DefaultBlockedPorts(), 50000, tt.data, len(tt.data), tt.verify)
			if h.Class != tt.class || h.Reason != tt.reason || h.Check != tt.check {
				t.Fatalf("quicclass.Inspect = %v/%v check %v, want %v/%v check %v", h.Class, h.Reason, h.Check, tt.class, tt.reason, tt.check)
			}
		})
	}
}
