package decide

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

var (
	serverID = ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	otherID  = ServerID{0x01, 0x02, 0x03, 0x04}
	clientID = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	// peer and peer6 were sent serverID and proved their address with it;
	// answered was sent a connection's packets and granted credit, and
	// proved nothing; spent was sent a connection's packets and has no
	// credit.
	peer     = netip.MustParseAddr("192.0.2.50")
	peer6    = netip.MustParseAddr("2001:db8::50")
	answered = netip.MustParseAddr("192.0.2.60")
	spent    = netip.MustParseAddr("192.0.2.61")
)

func verifying() Config {
	c := quicConfig()
	c.VerifyIDs = true
	return c
}

// learnedFilter returns a filter that sent serverID to peer and peer6,
// which proved their addresses with it at start (a Handshake packet), and
// a connection's packets to answered, granted 100 credits, and to spent.
func learnedFilter(t *testing.T, c Config) *Filter {
	t.Helper()
	f := newFilter(t, c)
	for _, a := range []netip.Addr{peer, peer6, answered, spent} {
		if err := f.LearnPeer(a, start); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Grant(answered, 100); err != nil {
		t.Fatal(err)
	}
	// spent spends what a new peer starts with.
	for range CreditFirst {
		if out := f.Decide(dgram("192.0.2.61:50000", quicclasstest.ShortPacket(otherID, 100)), start, 0); c.VerifyIDs && out.Verified != quicclass.FromAnswered {
			t.Fatalf("a new peer's first credits: %+v", out)
		}
	}
	for _, a := range []netip.Addr{peer, peer6} {
		if err := f.LearnServerID(serverID, a, start); err != nil {
			t.Fatal(err)
		}
		if c.VerifyIDs {
			d := dgram(netip.AddrPortFrom(a, 40000).String(), quicclasstest.LongPacket(quicclass.Version1, 2, serverID[:], clientID, nil, 90))
			if out := f.Decide(d, start, 0); out.Verified != quicclass.OpeningByID {
				t.Fatalf("the proof from %v: %+v", a, out)
			}
		}
	}
	return f
}

// TestVerify: with VerifyIDs, each kind of datagram from a stranger, a
// proven peer or an answered one, to the server ID bound to its source or
// another, gets the class and verification of the rules in package
// quicclass, and is counted by both; without it, the classes are those of
// Classify. A server ID verifies nothing from another address.
func TestVerify(t *testing.T) {
	sid := serverID[:]
	initial := quicclasstest.LongPacket(quicclass.Version1, 0, clientID, clientID, nil, 1200)
	retried := quicclasstest.LongPacket(quicclass.Version2, 1, sid, clientID, []byte("token"), 1200)
	handshake := quicclasstest.LongPacket(quicclass.Version1, 2, sid, clientID, nil, 90)
	strangeHandshake := quicclasstest.LongPacket(quicclass.Version2, 3, otherID[:], clientID, nil, 90)
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
		{"short, server id from its address", true, "192.0.2.50:50000", quicclasstest.ShortPacket(serverID, 100), quicclass.Established, 0, quicclass.ShortByID},
		{"short, server id from its address, new port", true, "192.0.2.50:50001", quicclasstest.ShortPacket(serverID, 100), quicclass.Established, 0, quicclass.ShortByID},
		{"short, server id from another address", true, "198.51.100.1:50000", quicclasstest.ShortPacket(serverID, 100), quicclass.Unverified, 0, 0},
		{"short, server id from an answered address", true, "192.0.2.60:50000", quicclasstest.ShortPacket(serverID, 100), quicclass.Established, 0, quicclass.FromAnswered},
		// Peers are addresses, not ports: the proof came from port
		// 40000, and everyone behind that address is verified (a NAT's
		// clients share one).
		{"short, proven peer, another port", true, "192.0.2.50:50000", quicclasstest.ShortPacket(otherID, 100), quicclass.Established, 0, quicclass.ShortByPeer},
		{"short, ipv6 proven peer", true, "[2001:db8::50]:50000", quicclasstest.ShortPacket(otherID, 100), quicclass.Established, 0, quicclass.ShortByPeer},
		{"short, answered peer", true, "192.0.2.60:50000", quicclasstest.ShortPacket(otherID, 100), quicclass.Established, 0, quicclass.FromAnswered},
		{"short, answered peer out of credit", true, "192.0.2.61:50000", quicclasstest.ShortPacket(otherID, 100), quicclass.Unverified, 0, quicclass.OverCredit},
		{"short, stranger", true, "198.51.100.1:50000", quicclasstest.ShortPacket(otherID, 100), quicclass.Unverified, 0, 0},
		{"short, peer's /24", true, "192.0.2.51:50000", quicclasstest.ShortPacket(otherID, 100), quicclass.Unverified, 0, 0},
		{"initial, stranger", true, "198.51.100.1:50000", initial, quicclass.Opening, 0, 0},
		{"initial, proven peer", true, "192.0.2.50:50000", initial, quicclass.Opening, 0, quicclass.OpeningFromPeer},
		{"initial, answered peer", true, "192.0.2.60:50000", initial, quicclass.Opening, 0, quicclass.OpeningFromAnswered},
		{"initial, answered peer out of credit", true, "192.0.2.61:50000", initial, quicclass.Opening, 0, quicclass.OverCredit},
		{"initial to a server id from its address", true, "192.0.2.50:50000", retried, quicclass.Established, 0, quicclass.OpeningByID},
		{"initial to a server id from another address", true, "198.51.100.1:50000", retried, quicclass.Opening, 0, 0},
		{"handshake to a server id from its address", true, "[2001:db8::50]:50000", handshake, quicclass.Established, 0, quicclass.OpeningByID},
		{"handshake to a server id from another address", true, "198.51.100.1:50000", handshake, quicclass.Invalid, quicclass.UnknownConnectionID, 0},
		{"handshake to another id, from a proven peer", true, "192.0.2.50:50000", strangeHandshake, quicclass.Established, 0, quicclass.HandshakeFromPeer},
		{"handshake to another id, from an answered peer", true, "192.0.2.60:50000", strangeHandshake, quicclass.Established, 0, quicclass.FromAnswered},
		{"handshake to another id, out of credit", true, "192.0.2.61:50000", strangeHandshake, quicclass.Unverified, 0, quicclass.OverCredit},
		{"7-byte handshake", true, "198.51.100.1:50000", tiny, quicclass.Invalid, quicclass.Length, 0},
		{"not verifying: short, stranger", false, "198.51.100.1:50000", quicclasstest.ShortPacket(otherID, 100), quicclass.Established, 0, 0},
		{"not verifying: handshake to another id", false, "198.51.100.1:50000", strangeHandshake, quicclass.Opening, 0, 0},
		{"not verifying: 7-byte handshake", false, "198.51.100.1:50000", tiny, quicclass.Opening, 0, 0},
		{"not verifying: initial, peer", false, "192.0.2.50:50000", initial, quicclass.Opening, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := quicConfig()
			c.VerifyIDs = tt.verify
			f := learnedFilter(t, c)
			before := f.Stats()
			d := dgram(tt.src, tt.data)
			d.Probe = tt.data
			out := f.Decide(d, start, 0)
			if out.Class != tt.class || out.Reason != tt.reason || out.Verified != tt.verified {
				t.Fatalf("Decide = %+v, want %v/%v/%v", out, tt.class, tt.reason, tt.verified)
			}
			st := f.Stats()
			fam := FamilyIndex(d.Key.Family)
			var verified uint64
			for v, n := range st.Verified[fam] {
				verified += n - before.Verified[fam][v]
			}
			if tt.verified != 0 && st.Verified[fam][tt.verified]-before.Verified[fam][tt.verified] != 1 || tt.verified == 0 && verified != 0 {
				t.Fatalf("verified counters %v, before %v", st.Verified[fam], before.Verified[fam])
			}
			if tt.class < quicclass.LimiterClasses && st.Passed[tt.class][fam]-before.Passed[tt.class][fam] != 1 ||
				tt.class == quicclass.Invalid && st.Invalid[0][fam][tt.reason] != 1 {
				t.Fatalf("not counted in its class: %+v", st)
			}
			if st.Proofs != before.Proofs {
				t.Fatalf("%d proofs, want none (the peers proved themselves before)", st.Proofs-before.Proofs)
			}
		})
	}
}

// TestProof: an address becomes a proven peer with the first long header
// from it, an answered peer, that carries a server ID bound to it (an
// Initial to a Retry's or the ServerHello's ID, a Handshake), and only
// then: the ID's slot is marked, later datagrams add nothing, a short
// header with the ID verifies itself and proves nothing, and a stranger
// who sends the same ID proves nothing.
func TestProof(t *testing.T) {
	f := newFilter(t, verifying())
	client := netip.MustParseAddr("203.0.113.5")
	if err := f.LearnServerID(serverID, client, start); err != nil {
		t.Fatal(err)
	}
	pk, err := PeerKeyOf(client)
	if err != nil {
		t.Fatal(err)
	}
	slot := func() uint64 { return f.learned.IDs.Slot(f.learned.IDs.Find(BoundHash(&f.hk, serverID, &pk))) }
	proven := func() bool { return f.learned.Proven.Find(PeerHash(&f.hk, &pk)) >= 0 }
	at := start + int64(time.Millisecond)
	short := func(src string, id ServerID) Outcome {
		return f.Decide(dgram(src, quicclasstest.ShortPacket(id, 100)), at, 0)
	}
	retried := quicclasstest.LongPacket(quicclass.Version1, 0, serverID[:], clientID, []byte("token"), 1200)
	if out := short("198.51.100.9:40000", serverID); out.Class != quicclass.Unverified || proven() || f.Stats().Proofs != 0 {
		t.Fatalf("the ID from a stranger: %+v, the client proven %v", out, proven())
	}
	// Before the server answered it, the client's ID verifies its
	// datagrams but proves nothing: it is not a peer.
	if out := f.Decide(dgram("203.0.113.5:40000", retried), at, 0); out.Verified != quicclass.OpeningByID || proven() {
		t.Fatalf("an unanswered client's Initial to its ID: %+v, proven %v", out, proven())
	}
	if err := f.LearnPeer(client, start); err != nil {
		t.Fatal(err)
	}
	if out := short("203.0.113.5:40000", serverID); out.Verified != quicclass.ShortByID || proven() {
		t.Fatalf("a short header to the ID: %+v, proven %v", out, proven())
	}
	if out := short("203.0.113.5:40000", otherID); out.Verified != quicclass.FromAnswered || proven() {
		t.Fatalf("before the proof: %+v, proven %v", out, proven())
	}
	if out := f.Decide(dgram("203.0.113.5:40000", retried), at, 0); out.Verified != quicclass.OpeningByID {
		t.Fatalf("the proof: %+v", out)
	}
	if !proven() || slot()&SlotMark == 0 || f.Stats().Proofs != 1 {
		t.Fatalf("after the proof: proven %v, slot %#x, %d proofs", proven(), slot(), f.Stats().Proofs)
	}
	if out := short("203.0.113.5:40001", otherID); out.Verified != quicclass.ShortByPeer {
		t.Fatalf("after the proof: %+v", out)
	}
	f.Decide(dgram("203.0.113.5:40000", retried), at, 0)
	if f.Stats().Proofs != 1 || f.learned.Proven.Len() != 1 {
		t.Fatalf("%d proofs and %d proven peers after a second datagram with the ID", f.Stats().Proofs, f.learned.Proven.Len())
	}
	// Learned again (a retransmission of the server's flight), the ID
	// keeps its mark.
	if err := f.LearnServerID(serverID, client, start+int64(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if slot()&SlotMark == 0 {
		t.Fatalf("learning the ID again cleared its mark: %#x", slot())
	}
}

// TestLearnedTimes: a verified datagram moves its server ID's stamp on only
// when the stamp is behind its time's (Stamp); expiry forgets what was
// neither learned nor used for the lifetime, and what is forgotten no
// longer verifies.
func TestLearnedTimes(t *testing.T) {
	const u = time.Duration(1) << StampShift // a stamp's unit
	base := (start>>StampShift + 1) << StampShift
	stamp := uint32(base >> StampShift)
	f := newFilter(t, verifying())
	client := netip.MustParseAddr("198.51.100.1")
	if err := f.LearnServerID(serverID, client, base+int64(u/10)); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{peer, client} {
		if err := f.LearnPeer(a, base+int64(u/10)); err != nil {
			t.Fatal(err)
		}
	}
	pk, _ := PeerKeyOf(client)
	idStamp := func() uint32 {
		i := f.learned.IDs.Find(BoundHash(&f.hk, serverID, &pk))
		if i < 0 {
			return 0
		}
		return uint32(f.learned.IDs.Slot(i)) & StampMask
	}
	if got := idStamp(); got != stamp {
		t.Fatalf("learned with stamp %d, want %d", got, stamp)
	}
	short := func(src string, at time.Duration) quicclass.Class {
		d := dgram(src, quicclasstest.ShortPacket(serverID, 100))
		return f.Decide(d, base+int64(at), 0).Class
	}
	// The client proves its address with its Handshake at +u/2.
	hs := dgram("198.51.100.1:50000", quicclasstest.LongPacket(quicclass.Version1, 2, serverID[:], clientID, nil, 90))
	if out := f.Decide(hs, base+int64(u/2), 0); out.Verified != quicclass.OpeningByID || f.Stats().Proofs != 1 {
		t.Fatalf("the client's Handshake: %+v, %d proofs", out, f.Stats().Proofs)
	}
	for _, s := range []struct {
		at   time.Duration
		want uint32 // the ID's stamp after a short header at base+at
	}{
		{u / 2, stamp},
		{u - 1, stamp},
		{u, stamp + 1},
		{u + u/2, stamp + 1},
		{u / 2, stamp + 1}, // an older reading leaves it
		{3 * u, stamp + 3},
	} {
		if c := short("198.51.100.1:50000", s.at); c != quicclass.Established {
			t.Fatalf("at %v: class %v", s.at, c)
		}
		if got := idStamp(); got != s.want {
			t.Fatalf("after a datagram at +%v the ID's stamp is %d, want %d", s.at, got-stamp, s.want-stamp)
		}
	}
	// The answered peers were learned at +u/10 and never since, the ID
	// used at +3u, and the client proven at +u/2: with a lifetime of one
	// stamp, at +3u the peers are older than it.
	if got := f.ExpireLearned(base+int64(3*u), int64(u)); got != [NumLearned]int{0, 1, 2} {
		t.Fatalf("expired %v, want the proof and the answered peers", got)
	}
	d := dgram("198.51.100.1:50000", quicclasstest.ShortPacket(otherID, 100))
	if out := f.Decide(d, base+int64(3*u), 0); out.Class != quicclass.Unverified {
		t.Fatalf("a forgotten peer's short header: %+v", out)
	}
	if got := f.ExpireLearned(base+int64(4*u), int64(u)); got != [NumLearned]int{} {
		t.Fatalf("expired %v with the ID one stamp old", got)
	}
	if got := f.ExpireLearned(base+int64(5*u), int64(u)); got != [NumLearned]int{1, 0, 0} || short("198.51.100.1:50000", 5*u) != quicclass.Unverified {
		t.Fatalf("expired %v; the forgotten ID still verifies", got)
	}
	if err := f.LearnPeer(netip.Addr{}, start); err == nil || !strings.Contains(err.Error(), "peer address invalid IP: want an IPv4 or IPv6 address") {
		t.Fatalf("LearnPeer(invalid): %v", err)
	}
	if err := f.LearnServerID(serverID, netip.Addr{}, start); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("LearnServerID(invalid address): %v", err)
	}
}

// TestLearnedSet: a key takes its own slot, else the first empty one of its
// set, else the stalest key's (a stamp from the future counts as the
// freshest); learning it again moves its stamp on, never back; expiry
// clears the old keys, whatever the stamps' wrap, and rebuilds the
// quick-reject filter from the slots, keeping bits set meanwhile.
func TestLearnedSet(t *testing.T) {
	s := NewLearnedSet()
	// Hashes of one set: the same top LearnedSetShift bits, tags 1 to 9.
	key := func(tag uint64) uint64 { return 7<<(64-LearnedSetShift) | tag<<(64-LearnedSetShift-TagBits) }
	first := setFirst(key(1))
	stamps := []uint32{5, 3, 9, 4, StampMask, 8, 6, 7} // StampMask: one before 0, wrapped
	for i, st := range stamps {
		if !s.Learn(key(uint64(i+1)), st) {
			t.Fatal("learn failed")
		}
	}
	for i := range stamps {
		if got := s.Find(key(uint64(i + 1))); got != first+i {
			t.Fatalf("key %d in slot %d, want %d", i+1, got-first, i)
		}
	}
	// At stamp 10 the stalest is the wrapped one (11 stamps old).
	s.Learn(key(9), 10)
	if s.Find(key(5)) >= 0 || s.Find(key(9)) != first+4 {
		t.Fatalf("the ninth key evicted %v: slot of 9 is %d", s.Find(key(5)) < 0, s.Find(key(9))-first)
	}
	// A stamp from the future is the freshest: at stamp 4, slot 2 (9) is
	// five stamps ahead and stays; the stalest is key 1 (5: also ahead),
	// key 2 (3, one old) is evicted.
	s.Learn(key(10), 4)
	if s.Find(key(2)) >= 0 || s.Find(key(10)) != first+1 {
		t.Fatalf("at stamp 4: key 2 kept %v, key 10 in slot %d", s.Find(key(2)) >= 0, s.Find(key(10))-first)
	}
	// Learning again moves a stamp on, and never back.
	s.Learn(key(3), 20)
	s.Learn(key(3), 15)
	if st := uint32(s.Slot(s.Find(key(3)))) & StampMask; st != 20 {
		t.Fatalf("stamp %d after learning at 20 then 15", st)
	}
	// Expiry at stamp 22 with a lifetime of 10: keys stamped before 12
	// go, the one at 20 stays, and so does one from the future.
	s.Learn(key(11), 30) // evicts the stalest
	n := s.Expire(22, 10)
	if s.Len() != 2 || n != 6 || s.Find(key(3)) < 0 || s.Find(key(11)) < 0 {
		t.Fatalf("expired %d, %d left", n, s.Len())
	}
	for tag := uint64(1); tag <= 10; tag++ {
		if tag != 3 && s.MaybeIn(key(tag)) && !quickShared(key(tag), key(3), key(11)) {
			t.Fatalf("the quick-reject bit of expired key %d is set", tag)
		}
	}
	if !s.MaybeIn(key(3)) || !s.MaybeIn(key(11)) {
		t.Fatal("a kept key's quick-reject bit is clear")
	}
}

// quickShared reports whether h's quick-reject bit is one of the others'.
func quickShared(h uint64, others ...uint64) bool {
	w, m := quickBit(h)
	for _, o := range others {
		if ow, om := quickBit(o); ow == w && om == m {
			return true
		}
	}
	return false
}

// TestQuickFilter: learning sets a key's bit; expiry clears the bits of
// the keys it clears unless a kept key shares them; a key learned while a
// rebuild runs keeps its bit.
func TestQuickFilter(t *testing.T) {
	hk := sketch.SeededHashKey(3)
	s := NewLearnedSet()
	pk := func(a string) PeerKey {
		k, err := PeerKeyOf(netip.MustParseAddr(a))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	oldKey, keptKey := pk("198.51.100.7"), pk("2001:db8::1")
	old, kept := PeerHash(&hk, &oldKey), PeerHash(&hk, &keptKey)
	if quickShared(old, kept) {
		t.Fatal("the two keys share a bit: pick others")
	}
	if s.MaybeIn(old) || s.MaybeIn(kept) {
		t.Fatal("bits set before anything was learned")
	}
	s.Learn(old, 100)
	s.Learn(kept, 200)
	if !s.MaybeIn(old) || !s.MaybeIn(kept) {
		t.Fatal("a learned key's bit is clear")
	}
	if n := s.Expire(210, 50); n != 1 || s.MaybeIn(old) || !s.MaybeIn(kept) {
		t.Fatalf("expired %d; the expired key's bit %v (want clear), the kept key's %v", n, s.MaybeIn(old), s.MaybeIn(kept))
	}
	// slotHash recovers the bits the filter needs from a slot.
	i := s.Find(kept)
	w, m := quickBit(slotHash(i, s.Slot(i)))
	if kw, km := quickBit(kept); w != kw || m != km {
		t.Fatal("a slot's hash does not give its key's bit")
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

// TestCopyFrom: a new engine takes the keys of the old one's sets, each
// stamped on its own clock, and its filter with them.
func TestCopyFrom(t *testing.T) {
	hk := sketch.SeededHashKey(5)
	from, to := NewLearned(), NewLearned()
	if err := from.LearnServerID(&hk, serverID, peer, int64(1000*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := from.LearnPeer(&hk, answered, int64(1000*time.Hour)); err != nil {
		t.Fatal(err)
	}
	to.CopyFrom(from, 7)
	pk, _ := PeerKeyOf(peer)
	ak, _ := PeerKeyOf(answered)
	i, j := to.IDs.Find(BoundHash(&hk, serverID, &pk)), to.Answered.Find(PeerHash(&hk, &ak))
	if i < 0 || j < 0 || uint32(to.IDs.Slot(i))&StampMask != 7 || uint32(to.Answered.Slot(j))&StampMask != 7 {
		t.Fatalf("copied: ID slot %d, answered slot %d", i, j)
	}
}

// BenchmarkExpire times the sweep that forgets expired keys (every 5 s, on
// each of the three sets) over a set holding MaxLearned keys, half of them
// expired: the kernel's sets are swept by this code through their mapping,
// with no system call.
func BenchmarkExpire(b *testing.B) {
	hk := sketch.SeededHashKey(9)
	s := NewLearnedSet()
	fill := func() {
		for i := range MaxLearned {
			pk := PeerKey{0, 0, ipv4MappedWord, uint32(i)}
			s.Learn(PeerHash(&hk, &pk), uint32(10+i%2*100)) // half at stamp 10, half at 110
		}
	}
	fill()
	b.ResetTimer()
	for b.Loop() {
		if n := s.Expire(120, 50); n == 0 {
			b.StopTimer()
			fill()
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(LearnedSlots), "slots")
}
