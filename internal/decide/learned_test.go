package decide

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

var (
	serverID = ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	otherID  = ServerID{0x01, 0x02, 0x03, 0x04}
	clientID = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	peer     = netip.MustParseAddr("192.0.2.50")
	peer6    = netip.MustParseAddr("2001:db8::50")
)

func verifying() Config {
	c := quicConfig()
	c.VerifyIDs = true
	return c
}

// TestVerify: with VerifyIDs, each kind of datagram from a stranger or a
// peer, to a server ID or another, gets the class and verification of the
// rules in package quicclass, and is counted by both; without it, the
// classes are those of Classify.
func TestVerify(t *testing.T) {
	sid := serverID[:]
	initial := quicclass.LongPacket(quicclass.Version1, 0, clientID, clientID, nil, 1200)
	retried := quicclass.LongPacket(quicclass.Version2, 1, sid, clientID, []byte("token"), 1200)
	handshake := quicclass.LongPacket(quicclass.Version1, 2, sid, clientID, nil, 90)
	strangeHandshake := quicclass.LongPacket(quicclass.Version2, 3, otherID[:], clientID, nil, 90)
	tiny := []byte{0xe0, 0, 0, 0, 1, 0, 0}
	tests := []struct {
		name     string
		verify   bool
		src      string
		data     []byte
		class    quicclass.Class
		reason   quicclass.Reason
		verified quicclass.Verification
	}{
		{"short, server id", true, "198.51.100.1:50000", quicclass.ShortPacket(serverID, 100), quicclass.Established, 0, quicclass.ShortByID},
		{"short, peer", true, "192.0.2.50:50000", quicclass.ShortPacket(otherID, 100), quicclass.Established, 0, quicclass.ShortByPeer},
		{"short, ipv6 peer", true, "[2001:db8::50]:50000", quicclass.ShortPacket(otherID, 100), quicclass.Established, 0, quicclass.ShortByPeer},
		{"short, peer and server id", true, "192.0.2.50:50000", quicclass.ShortPacket(serverID, 100), quicclass.Established, 0, quicclass.ShortByID},
		{"short, stranger", true, "198.51.100.1:50000", quicclass.ShortPacket(otherID, 100), quicclass.Unverified, 0, 0},
		{"short, peer's /24", true, "192.0.2.51:50000", quicclass.ShortPacket(otherID, 100), quicclass.Unverified, 0, 0},
		{"initial, stranger", true, "198.51.100.1:50000", initial, quicclass.Opening, 0, 0},
		{"initial, peer", true, "192.0.2.50:50000", initial, quicclass.Opening, 0, quicclass.OpeningFromPeer},
		{"initial to a server id", true, "198.51.100.1:50000", retried, quicclass.Established, 0, quicclass.OpeningByID},
		{"handshake to a server id", true, "198.51.100.1:50000", handshake, quicclass.Established, 0, quicclass.OpeningByID},
		{"handshake to another id, from a peer", true, "192.0.2.50:50000", strangeHandshake, quicclass.Established, 0, quicclass.HandshakeFromPeer},
		{"7-byte handshake", true, "198.51.100.1:50000", tiny, quicclass.Invalid, quicclass.Length, 0},
		{"not verifying: short, stranger", false, "198.51.100.1:50000", quicclass.ShortPacket(otherID, 100), quicclass.Established, 0, 0},
		{"not verifying: handshake to another id", false, "198.51.100.1:50000", strangeHandshake, quicclass.Opening, 0, 0},
		{"not verifying: 7-byte handshake", false, "198.51.100.1:50000", tiny, quicclass.Opening, 0, 0},
		{"not verifying: initial, peer", false, "192.0.2.50:50000", initial, quicclass.Opening, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := quicConfig()
			c.VerifyIDs = tt.verify
			f := newFilter(t, c)
			f.LearnServerID(serverID, start)
			for _, a := range []netip.Addr{peer, peer6} {
				if err := f.LearnPeer(a, start); err != nil {
					t.Fatal(err)
				}
			}
			d := dgram(tt.src, tt.data)
			d.Probe = tt.data
			out := f.Decide(d, start, 0)
			if out.Class != tt.class || out.Reason != tt.reason || out.Verified != tt.verified {
				t.Fatalf("Decide = %+v, want %v/%v/%v", out, tt.class, tt.reason, tt.verified)
			}
			st := f.Stats()
			fam := FamilyIndex(d.Key.Family)
			var verified uint64
			for _, n := range st.Verified[fam] {
				verified += n
			}
			if tt.verified != 0 && st.Verified[fam][tt.verified] != 1 || tt.verified == 0 && verified != 0 {
				t.Fatalf("verified counters %v", st.Verified[fam])
			}
			if tt.class < quicclass.LimiterClasses && st.Passed[tt.class][fam] != 1 ||
				tt.class == quicclass.Invalid && st.Invalid[0][fam][tt.reason] != 1 {
				t.Fatalf("not counted in its class: %+v", st)
			}
		})
	}
}

// TestLearnedTimes: a verified datagram moves its server ID's stamp on only
// when the stamp is behind its time's (IDStamp); expiry forgets what was
// neither learned nor used since, and what is forgotten no longer verifies.
func TestLearnedTimes(t *testing.T) {
	const u = time.Duration(1) << IDStampShift // a stamp's unit
	base := (start>>IDStampShift + 1) << IDStampShift
	stamp := base >> IDStampShift
	f := newFilter(t, verifying())
	f.LearnServerID(serverID, base+int64(u/10))
	if err := f.LearnPeer(peer, base+int64(u/10)); err != nil {
		t.Fatal(err)
	}
	if got := f.ServerIDs()[serverID]; got != stamp {
		t.Fatalf("learned with stamp %d, want %d", got, stamp)
	}
	short := func(src string, at time.Duration) quicclass.Class {
		d := dgram(src, quicclass.ShortPacket(serverID, 100))
		return f.Decide(d, base+int64(at), 0).Class
	}
	steps := []struct {
		at   time.Duration
		want int64 // the ID's stamp after a short header at base+at
	}{
		{u / 2, stamp},
		{u - 1, stamp},
		{u, stamp + 1},
		{u + u/2, stamp + 1},
		{u / 2, stamp + 1}, // an older reading leaves it
		{3 * u, stamp + 3},
	}
	for _, s := range steps {
		if c := short("198.51.100.1:50000", s.at); c != quicclass.Established {
			t.Fatalf("at %v: class %v", s.at, c)
		}
		if got := f.ServerIDs()[serverID]; got != s.want {
			t.Fatalf("after a datagram at +%v the ID's stamp is %d, want %d", s.at, got-stamp, s.want-stamp)
		}
	}
	// The peer was learned at +u/10 and never since; the ID used at +3u.
	ids, peers := f.ExpireLearned(base + int64(2*u))
	if ids != 0 || peers != 1 || len(f.Peers()) != 0 || len(f.ServerIDs()) != 1 {
		t.Fatalf("expired %d IDs and %d peers; left %v and %v", ids, peers, f.ServerIDs(), f.Peers())
	}
	d := dgram("192.0.2.50:50000", quicclass.ShortPacket(otherID, 100))
	if out := f.Decide(d, base+int64(4*u), 0); out.Class != quicclass.Unverified {
		t.Fatalf("a forgotten peer's short header: %+v", out)
	}
	// A cutoff before the clock's zero expires nothing.
	if ids, peers = f.ExpireLearned(-int64(time.Hour)); ids != 0 || peers != 0 {
		t.Fatalf("a cutoff before the clock's zero expired %d IDs and %d peers", ids, peers)
	}
	// Expiry by stamp: a cutoff within the stamp's unit keeps the ID.
	if ids, _ = f.ExpireLearned(base + int64(3*u+u-1)); ids != 0 {
		t.Fatalf("expired %d IDs with a cutoff in the ID's own stamp", ids)
	}
	ids, peers = f.ExpireLearned(base + int64(4*u))
	if ids != 1 || peers != 0 || short("198.51.100.1:50000", 5*u) != quicclass.Unverified {
		t.Fatalf("expired %d IDs and %d peers; the forgotten ID still verifies", ids, peers)
	}
	// Learning again sets the stamp, even back.
	f.LearnServerID(serverID, base+int64(10*u))
	f.LearnServerID(serverID, base+int64(9*u))
	if got := f.ServerIDs()[serverID]; got != stamp+9 {
		t.Fatalf("stamp %d after learning twice", got-stamp)
	}
	if err := f.LearnPeer(netip.Addr{}, start); err == nil || !strings.Contains(err.Error(), "peer address invalid IP: want an IPv4 or IPv6 address") {
		t.Fatalf("LearnPeer(invalid): %v", err)
	}
}

// TestLearnedBounded: a full set evicts a key to take a new one, sparing
// those looked up since the clock hand last passed.
func TestLearnedBounded(t *testing.T) {
	s := newLearned[int](4)
	for k := range 4 {
		s.learn(k, int64(k))
	}
	s.lookup(0)
	s.lookup(2)
	s.learn(10, 10)
	s.learn(11, 11)
	got := s.all()
	if len(got) != 4 || got[0] != 0 || got[2] != 2 || got[10] != 10 || got[11] != 11 {
		t.Fatalf("after two new keys in a full set of 4: %v, want 0, 2, 10 and 11", got)
	}
	if n := s.expire(11); n != 3 || len(s.all()) != 1 {
		t.Fatalf("expired %d, left %v", n, s.all())
	}
	s.learn(12, 12)
	if len(s.slots) != 4 || len(s.all()) != 2 {
		t.Fatalf("a freed slot was not reused: %d slots, %v", len(s.slots), s.all())
	}
}

// TestPeerKey: IPv4 addresses are keyed IPv4-mapped, however given, and a
// datagram's source is keyed as LearnPeer keys its address.
func TestPeerKey(t *testing.T) {
	for _, a := range []string{"192.0.2.50", "::ffff:192.0.2.50", "2001:db8::50", "::1"} {
		addr := netip.MustParseAddr(a)
		k, err := PeerKeyOf(addr)
		if err != nil {
			t.Fatal(err)
		}
		src := dgram(netip.AddrPortFrom(addr, 5000).String(), nil)
		if pk, ok := peerKey(&src.Key); !ok || pk != k || k.Addr() != addr.Unmap() {
			t.Fatalf("%s: key %x, from a datagram %x, address %v", a, k, pk, k.Addr())
		}
	}
	if k, _ := PeerKeyOf(peer); k != (PeerKey{0, 0, 0xffff, 0xc0000232}) {
		t.Fatalf("IPv4 key %x", k)
	}
}
