package userspace

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestReturningSources: the limiter lists, for the pre-filter, the sources
// whose datagrams it verified through their address (a returning user's
// opening at once, a kept connection's datagrams within a sample), the most
// recent first, never a source on its credit (which a spoofer earns for an
// address it names), over it or a stranger, and forgets each ReturningTTL
// after its last.
func TestReturningSources(t *testing.T) {
	c := verifyingLimits()
	clk := &testutil.Clock{}
	clk.Advance(time.Hour)
	l := newTestDecider(t, c, clk, -1)
	sid, proof := decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}, decide.ServerID{0xe5, 0xf6, 0x07, 0x18}
	answered, kept, stranger, spent := netip.MustParseAddr("127.132.0.3"), netip.MustParseAddr("127.132.0.7"),
		netip.MustParseAddr("127.132.0.9"), netip.MustParseAddr("127.132.0.11")
	onCredit := netip.MustParseAddr("127.132.0.13")
	for _, a := range []netip.Addr{answered, kept, onCredit} {
		if err := l.LearnPeer(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.LearnServerID(sid, kept); err != nil {
		t.Fatal(err)
	}
	if err := l.LearnServerID(proof, answered); err != nil {
		t.Fatal(err)
	}
	send := func(src netip.Addr, payload []byte, n int) decide.Outcome {
		t.Helper()
		var out decide.Outcome
		for range n {
			clk.Advance(time.Microsecond)
			d := decide.Datagram{Key: sketch.KeyFrom(netip.AddrPortFrom(src, 40000), 443), Length: len(payload), Probe: payload}
			out = l.Decide(&d)
		}
		return out
	}
	initial := quicclasstest.LongPacket(quicclass.Version1, 0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, nil, 1200)
	// An answered peer's Initial on credit is a stranger's: not listed.
	if out := send(onCredit, initial, 1); out.Verified != quicclass.OpeningFromAnswered || out.Verified.Returning() {
		t.Fatalf("an answered peer's Initial on credit: %v, want a stranger's", out.Verified)
	}
	if got := l.Returning(); len(got) != 0 {
		t.Fatalf("after an Initial on credit: %v listed", got)
	}
	// The answered peer proves its address (a Handshake to the ID the
	// server sent it); its opening is a returning user's: listed at once.
	send(answered, quicclasstest.LongPacket(quicclass.Version1, 2, proof[:], nil, nil, 100), 1)
	if out := send(answered, initial, 1); !out.Verified.Returning() {
		t.Fatalf("a proven peer's Initial: %v, want a returning user's", out.Verified)
	}
	if got := l.Returning(); !slices.Equal(got, []netip.Addr{answered}) {
		t.Fatalf("after a returning opening: %v, want [%v]", got, answered)
	}
	// A kept connection's short headers by ID: noted within a sample.
	if out := send(kept, quicclasstest.ShortPacket(sid, 100), 1<<(returningSample+3)); out.Verified != quicclass.ShortByID {
		t.Fatalf("the kept connection's datagram: %v", out.Verified)
	}
	// A stranger's datagrams.
	send(stranger, quicclasstest.ShortPacket(decide.ServerID{9, 9, 9, 9}, 100), 1<<(returningSample+3))
	clk.Advance(time.Second)
	if got := l.Returning(); !slices.Equal(got, []netip.Addr{kept, answered}) {
		t.Fatalf("listed %v, want [%v %v] (the most recent first)", got, kept, answered)
	}
	// An answered peer spends its first credits (not listed: credit),
	// then goes on past them.
	if err := l.LearnPeer(spent); err != nil {
		t.Fatal(err)
	}
	other := quicclasstest.ShortPacket(decide.ServerID{9, 9, 9, 9}, 100)
	if out := send(spent, other, decide.CreditFirst); out.Verified != quicclass.FromAnswered {
		t.Fatalf("on its first credit: %v, want from_answered", out.Verified)
	}
	// Forgotten ReturningTTL after the last trusted datagram, whatever
	// follows over credit.
	clk.Advance(ReturningTTL - time.Second)
	send(answered, initial, 1)
	if out := send(spent, other, 1<<(returningSample+3)); out.Verified != quicclass.OverCredit {
		t.Fatalf("past its credit: %v, want over_credit", out.Verified)
	}
	clk.Advance(2 * time.Second)
	if got := l.Returning(); !slices.Equal(got, []netip.Addr{answered}) {
		t.Fatalf("after %v: %v, want [%v]", ReturningTTL, got, answered)
	}
}

// TestReturningListKeepsLatest: a full list makes room for a new source by
// forgetting the one seen longest ago, so that sources listed once (a
// spoofer's, say) do not keep the latest returning users out.
func TestReturningListKeepsLatest(t *testing.T) {
	clk := &testutil.Clock{}
	clk.Advance(time.Hour)
	l := newTestDecider(t, verifyingLimits(), clk, -1)
	out := decide.Outcome{Verified: quicclass.OpeningFromPeer}
	src := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 140, byte(i >> 8), byte(i)}) }
	l.mu.Lock()
	for i := range MaxReturning + 1 {
		k := sketch.KeyFrom(netip.AddrPortFrom(src(i), 40000), 443)
		l.noteReturning(&k, &out, int64(time.Hour)+int64(i), 0)
	}
	l.mu.Unlock()
	got := l.Returning()
	if len(got) != MaxReturning || got[0] != src(MaxReturning) || slices.Contains(got, src(0)) {
		t.Fatalf("listed %d, the first %v; want %d with %v first and without %v", len(got), got[0], MaxReturning,
			src(MaxReturning), src(0))
	}
}
