package userspace

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

func verifyingLimits() decide.Config {
	c := testutil.QUICLimits(100, 1000)
	c.VerifyIDs = true
	return c
}

// TestLearnVerifies: the limiter learns server IDs and peers on its own
// clock, verifies datagrams with them exactly as a decide.Filter given
// the same times and random numbers does, and forgets them after their
// lifetime.
func TestLearnVerifies(t *testing.T) {
	c := verifyingLimits()
	clk := &testutil.Clock{}
	clk.Advance(time.Hour)
	l := newTestDecider(t, c, clk, -1)
	twin, err := decide.New(c, sketch.SeededHashKey(1))
	if err != nil {
		t.Fatal(err)
	}
	rng := xorshift{0x9e3779b97f4a7c15}
	sid := decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	other := decide.ServerID{1, 2, 3, 4}
	// The server sent sid to client, and a connection's packets to
	// answered, which proves nothing: it has a new peer's credit.
	client, answered := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("192.0.2.50")
	if err := l.LearnServerID(sid, client); err != nil {
		t.Fatal(err)
	}
	if err := twin.LearnServerID(sid, client, clk.Now()); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{client, answered} {
		if err := l.LearnPeer(a); err != nil {
			t.Fatal(err)
		}
		if err := twin.LearnPeer(a, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		src      string
		payload  []byte
		class    quicclass.Class
		verified quicclass.Verification
	}{
		{"198.51.100.1:40000", quicclasstest.LongPacket(quicclass.Version1, 2, sid[:], nil, nil, 100), quicclass.Established,
			quicclass.OpeningByID}, // the proof
		{"198.51.100.1:40000", quicclasstest.ShortPacket(sid, 100), quicclass.Established, quicclass.ShortByID},
		{"198.51.100.1:40001", quicclasstest.ShortPacket(other, 100), quicclass.Established, quicclass.ShortByPeer},
		{"192.0.2.50:40000", quicclasstest.ShortPacket(other, 100), quicclass.Established, quicclass.FromAnswered},
		{"192.0.2.50:40000", quicclasstest.ShortPacket(sid, 100), quicclass.Established, quicclass.FromAnswered},
		{"203.0.113.1:40000", quicclasstest.ShortPacket(other, 100), quicclass.Unverified, 0},
		{"198.51.100.1:40000", quicclasstest.LongPacket(quicclass.Version1, 0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, nil, 1200),
			quicclass.Opening, quicclass.OpeningFromPeer},
		{"203.0.113.1:40000", quicclasstest.LongPacket(quicclass.Version2, 3, other[:], nil, nil, 100), quicclass.Invalid, 0},
	}
	for i, tt := range tests {
		clk.Advance(time.Millisecond)
		d := decide.Datagram{Key: sketch.KeyFrom(netip.MustParseAddrPort(tt.src), 443), Length: len(tt.payload), Probe: tt.payload}
		got := l.Decide(&d)
		want := twin.Decide(&d, clk.Now(), rng.next())
		if got != want || got.Class != tt.class || got.Verified != tt.verified {
			t.Fatalf("datagram %d: %+v, the twin %+v, want %v/%v", i, got, want, tt.class, tt.verified)
		}
	}
	if st, _ := l.Stats(); st != twin.Stats() {
		t.Fatalf("stats %+v, the twin's %+v", st, twin.Stats())
	}
	clk.Advance(5 * time.Second)
	// The ID was used 5 s ago (by the first datagram), the proof and the
	// peers as long ago.
	if n, err := l.ExpireLearned(10 * time.Second); err != nil || n != [decide.NumLearned]int{} {
		t.Fatalf("ExpireLearned(10s) = %v, %v", n, err)
	}
	if n, err := l.ExpireLearned(time.Second); err != nil || n != [decide.NumLearned]int{1, 1, 2} {
		t.Fatalf("ExpireLearned(1s) = %v, %v", n, err)
	}
	d := decide.Datagram{Key: sketch.KeyFrom(netip.MustParseAddrPort("198.51.100.1:40000"), 443), Length: 100,
		Probe: quicclasstest.ShortPacket(sid, 100)}
	if out := l.Decide(&d); out.Class != quicclass.Unverified {
		t.Fatalf("after expiry: %+v", out)
	}
	if err := l.LearnPeer(netip.Addr{}); err == nil {
		t.Fatal("LearnPeer accepted an invalid address")
	}
}

// TestLearnConcurrent: the learner's calls (LearnServerID, LearnPeer,
// ExpireLearned) race with the read path, deciding one by one and in
// batches, and with reconfiguration: run with -race. Every datagram is
// counted once, and those to IDs learned before they were sent are
// verified.
func TestLearnConcurrent(t *testing.T) {
	c := verifyingLimits()
	c.Limiter.Established.Limit = 1_000_000
	l := newTestDecider(t, c, nil, -1)
	var ids []decide.ServerID
	for i := range 64 {
		ids = append(ids, decide.ServerID{0xee, 0, 0, byte(i)})
	}
	// Each address holds at most decide.LearnedWays IDs: the workers'
	// sources are sent as many, the background's other addresses others.
	const own = decide.LearnedWays
	src := func(w, j int) string { return fmt.Sprintf("192.0.%d.%d:4000%d", w, j, j%3) }
	for _, id := range ids[:own] {
		for w := range 2 {
			for j := range 8 {
				if err := l.LearnServerID(id, netip.MustParseAddrPort(src(w, j)).Addr()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	const perWorker = 20_000
	var wg, bg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds := make([]decide.Datagram, 8)
			drop := make([]bool, 8)
			for i := 0; i < perWorker; i += len(ds) {
				for j := range ds {
					ds[j] = dgram(src(w, j), quicclasstest.ShortPacket(ids[(i+j)%own], 100))
				}
				if w == 0 {
					l.DecideBatch(ds, drop)
				} else {
					for j := range ds {
						l.Decide(&ds[j])
					}
				}
			}
		}()
	}
	background := []func(i int){
		func(i int) { _ = l.LearnServerID(ids[32+i%32], netip.AddrFrom4([4]byte{192, 0, 9, byte(i % 8)})) },
		func(i int) { _ = l.LearnPeer(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})) },
		func(int) { _, _ = l.ExpireLearned(time.Hour) },
		func(int) { l.Stats() },
		func(i int) {
			next := c.Clone()
			next.DryRun = i%2 == 1
			if err := l.Configure(next); err != nil {
				panic(err)
			}
		},
	}
	hammer(stop, &bg, background)
	wg.Wait()
	close(stop)
	bg.Wait()
	st, _ := l.Stats()
	var total, verified uint64
	for class := range sketch.NumClasses {
		for f := range decide.Families {
			total += st.Passed[class][f]
			for lvl := range sketch.MaxLevels {
				total += st.Dropped[class][f][lvl] + st.WouldDrop[class][f][lvl]
			}
		}
	}
	for f := range decide.Families {
		verified += st.Verified[f][quicclass.ShortByID]
	}
	if total != 2*perWorker || verified != 2*perWorker {
		t.Fatalf("counted %d datagrams, verified %d; decided %d", total, verified, 2*perWorker)
	}
}
