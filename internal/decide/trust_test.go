package decide

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Attacks on what the filter trusts, each run against the Go twin (the
// kernel's tests run the same decisions through the C program, bit for
// bit, on their traces).

// boundTo counts the IDs of ids the filter holds bound to addr.
func boundTo(f *Filter, ids []ServerID, addr netip.Addr) int {
	pk, _ := PeerKeyOf(addr)
	n := 0
	for _, id := range ids {
		if f.learned.IDs.Find(BoundHash(&f.hk, id, &pk)) >= 0 {
			n++
		}
	}
	return n
}

// TestIDsPerAddress: however many IDs the server is made to bind to one
// address (a spoofer has it answer Initials "from" a victim at the rate it
// likes), the filter holds at most LearnedWays of them, the latest; an ID
// bound to another address stays.
func TestIDsPerAddress(t *testing.T) {
	f := newFilter(t, verifying())
	victim, other := netip.MustParseAddr("203.0.113.77"), netip.MustParseAddr("198.51.100.1")
	if err := f.LearnServerID(serverID, other, start); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	ids := make([]ServerID, 40_000)
	for i := range ids {
		binary.BigEndian.PutUint32(ids[i][:], rng.Uint32())
		// A stamp's worth of time apart, every 1,000: the stalest goes.
		if err := f.LearnServerID(ids[i], victim, start+int64(i/1000)<<StampShift); err != nil {
			t.Fatal(err)
		}
	}
	if n := boundTo(f, ids, victim); n > LearnedWays {
		t.Fatalf("%d IDs held bound to the victim, want at most %d", n, LearnedWays)
	}
	if boundTo(f, ids[len(ids)-LearnedWays:], victim) == 0 {
		t.Fatal("none of the latest IDs is held")
	}
	if boundTo(f, []ServerID{serverID}, other) != 1 {
		t.Fatal("another address's ID was forgotten")
	}
}

// TestGuessing: a spoofer binds as many IDs to a victim's address as the
// filter holds, then sends guesses from that address at a million a second
// for two seconds: Handshake packets and Initials to random 4-byte IDs (the
// long headers that can prove an address), and short headers (which cannot).
// The proof pacer lets ProofAttemptsPerSecond attempts be looked up for a
// proof, a burst of as many aside; the rest prove nothing whatever their
// ID; no proof is made (one in 2^32/8 attempts would be); and the flood is
// held: at least 99% dropped.
func TestGuessing(t *testing.T) {
	f := newFilter(t, verifying())
	victim := netip.MustParseAddr("203.0.113.77")
	if err := f.LearnPeer(victim, start); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	for range 1000 {
		var id ServerID
		binary.BigEndian.PutUint32(id[:], rng.Uint32())
		if err := f.LearnServerID(id, victim, start); err != nil {
			t.Fatal(err)
		}
	}
	const n = 2_000_000
	passed := 0
	for i := range n {
		var id ServerID
		binary.BigEndian.PutUint32(id[:], rng.Uint32())
		var b []byte
		switch i % 3 {
		case 0:
			b = quicclasstest.LongPacket(quicclass.Version1, 2, id[:], clientID, nil, 60)
		case 1:
			b = quicclasstest.LongPacket(quicclass.Version1, 0, id[:], clientID, nil, quicclass.MinInitialDatagram)
		default:
			b = quicclasstest.ShortPacket(id, 40)
		}
		d := dgram(netip.AddrPortFrom(victim, uint16(1024+rng.IntN(60000))).String(), b)
		if !f.Decide(d, start+int64(i)*int64(time.Microsecond), rng.Uint32()).Drop {
			passed++
		}
	}
	st := f.Stats()
	attempts := 2 * n / 3
	paced := 2*ProofAttemptsPerSecond + ProofAttemptsPerSecond // two seconds, and the burst
	if st.Proofs != 0 || int(st.UnpacedAttempts) < attempts-paced*11/10 {
		t.Fatalf("%d proofs; %d of %d attempts unpaced, want all but %d", st.Proofs, st.UnpacedAttempts, attempts, paced)
	}
	if passed > n/100 {
		t.Fatalf("the guesses: %d of %d passed", passed, n)
	}
	t.Logf("%d of %d guesses passed; %d of %d attempts found the proof pacer full; no proof", passed, n,
		st.UnpacedAttempts, attempts)
}

// TestAnsweredUnderRandomFlood: a client the server talks to (an answered
// peer, granted credit by what the server sends it), which sends Handshake
// and short-header packets to IDs no learner saw (as a quic-go client does
// once its handshake completes), keeps them under a flood of short headers
// from a new random address on every packet, 200,000 a second: the flood
// is held at the unverified class's total, which the client's packets,
// verified by its credit, never meet.
func TestAnsweredUnderRandomFlood(t *testing.T) {
	f := newFilter(t, verifying())
	client := netip.MustParseAddr("192.0.2.70")
	if err := f.LearnPeer(client, start); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	sent, kept, junk := 0, 0, 0
	for i := range 400_000 { // 2 s
		now := start + int64(i)*5000
		var id ServerID
		binary.BigEndian.PutUint32(id[:], rng.Uint32())
		src := netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())})
		if !f.Decide(dgram(netip.AddrPortFrom(src, uint16(1024+rng.IntN(60000))).String(), quicclasstest.ShortPacket(id, 30)), now, rng.Uint32()).Drop {
			junk++
		}
		if i%4000 == 0 { // 50 a second, each answered by the server
			b := quicclasstest.ShortPacket(otherID, 60)
			if i%8000 == 0 {
				b = quicclasstest.LongPacket(quicclass.Version1, 2, otherID[:], clientID, nil, 60)
			}
			sent++
			if !f.Decide(dgram("192.0.2.70:50000", b), now, rng.Uint32()).Drop {
				kept++
			}
			if err := f.Grant(client, CreditPerDatagram); err != nil {
				t.Fatal(err)
			}
		}
	}
	if kept < sent*99/100 {
		t.Fatalf("the client kept %d of %d", kept, sent)
	}
	// The proportional floor lets a flood from a new network on every
	// packet through at about three times the total (see
	// sketch.DefaultUnverifiedTotal).
	if junk > 2*4*int(sketch.DefaultUnverifiedTotal) {
		t.Fatalf("the flood passed %d in 2 s, at an unverified total of %d a second", junk, sketch.DefaultUnverifiedTotal)
	}
	t.Logf("the client kept %d of %d; the flood passed %d of 400,000", kept, sent, junk)
}

// TestSpoofedCreditGoesNotFirst: a spoofer has the server answer spoofed
// ClientHellos "from" 50 addresses of its choosing, one a network, so that
// each is an answered peer whose credit the answers keep topping up, then
// sends Initials from all of them, 900 a second each (under every
// per-address limit), against a fixed opening total of 2,000. Credit
// verifies what a client sends on a connection the server keeps with it,
// not who it is: those Initials are a stranger's, shared fairly with
// everyone's, and the returning part of the total stays a proven peer's,
// whose Initials (100 a second) all pass.
func TestSpoofedCreditGoesNotFirst(t *testing.T) {
	c := verifying()
	c.Limiter.Limit = 1000
	c.Limiter.LevelLimits = map[int]uint32{3: 2000}
	// A seeded key for the limiter too: the zero key of newFilter puts
	// sources that share a prefix in one cell, and this test's sources
	// are all over.
	f, err := New(c, sketch.SeededHashKey(12))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.LearnServerID(serverID, peer, start); err != nil {
		t.Fatal(err)
	}
	if err := f.LearnPeer(peer, start); err != nil {
		t.Fatal(err)
	}
	proof := quicclasstest.LongPacket(quicclass.Version1, 2, serverID[:], clientID, nil, 100)
	if out := f.Decide(dgram(netip.AddrPortFrom(peer, 40_000).String(), proof), start, 0); out.Verified != quicclass.OpeningByID || f.Stats().Proofs != 1 {
		t.Fatalf("the peer's proof: %+v", out)
	}
	var spoofed []netip.Addr
	for i := range 50 {
		a := netip.AddrFrom4([4]byte{10, byte(i), 7, 1})
		spoofed = append(spoofed, a)
		if err := f.LearnPeer(a, start); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(4, 4))
	// A client's Initial: a random 8-byte ID of its own, no token.
	initial := func() []byte {
		var id [8]byte
		binary.BigEndian.PutUint64(id[:], rng.Uint64())
		return quicclasstest.LongPacket(quicclass.Version1, 0, id[:], clientID, nil, 1200)
	}
	peerSent, peerKept, flood := 0, 0, 0
	for i := range 90_000 { // 2 s of 45,000 Initials a second
		now := start + int64(i)*int64(time.Second)/45_000
		src := spoofed[i%len(spoofed)]
		if i%len(spoofed) == 0 {
			for _, a := range spoofed { // the server's answers to them
				if err := f.Grant(a, CreditPerDatagram); err != nil {
					t.Fatal(err)
				}
			}
		}
		if !f.Decide(dgram(netip.AddrPortFrom(src, uint16(1024+i%50_000)).String(), initial()), now, rng.Uint32()).Drop {
			flood++
		}
		if i%450 == 0 && i >= 45_000 { // the peer, in the second second
			peerSent++
			if !f.Decide(dgram(netip.AddrPortFrom(peer, uint16(40_000+i%1000)).String(), initial()), now, rng.Uint32()).Drop {
				peerKept++
			}
		}
	}
	if peerKept < peerSent*95/100 {
		t.Errorf("the proven peer kept %d of its %d Initials: the spoofed answered addresses took the returning part", peerKept, peerSent)
	}
	t.Logf("the proven peer kept %d of %d; the spoofed Initials passed %d of 90,000", peerKept, peerSent, flood)
}
