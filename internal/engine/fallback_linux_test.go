//go:build linux

package engine

import (
	"net/netip"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestFallBackKeepsLearned: with two real engines, the userspace limiter a
// fallback opens on the BPF filter's hash key finds what the filter
// learned and its clients proved once it adopts the filter's sets: a
// server ID bound to its client, a proven peer, an answered peer's credit.
// Opened on a key of its own, it would find none of them.
func TestFallBackKeepsLearned(t *testing.T) {
	c := testutil.QUICLimits(1000, 200_000)
	c.VerifyIDs = true
	k, err := OpenKernel(c, Options{})
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	id := decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	client, proven, answered := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	if err := k.LearnServerID(id, client); err != nil {
		t.Fatal(err)
	}
	if err := k.LearnPeer(answered); err != nil {
		t.Fatal(err)
	}
	if err := k.Grant(answered, 100); err != nil {
		t.Fatal(err)
	}
	f, _ := Kernel(k)
	if err := f.ProveForBench(proven); err != nil {
		t.Fatal(err)
	}
	other := decide.ServerID{1, 2, 3, 4}
	datagrams := []struct {
		from netip.Addr
		id   decide.ServerID
		want quicclass.Verification
	}{
		{client, id, quicclass.ShortByID},
		{proven, other, quicclass.ShortByPeer},
		{answered, other, quicclass.FromAnswered},
	}
	for _, tt := range []struct {
		name string
		same bool
	}{{"on the filter's key", true}, {"on a key of its own", false}} {
		t.Run(tt.name, func(t *testing.T) {
			var o Options
			if tt.same {
				hk := k.HashKey()
				o.HashKey = &hk
			}
			u, err := OpenUserspace(c, o)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			u.AdoptLearned(k.Learned())
			ul := u.(*userEngine).Decider
			for _, d := range datagrams {
				b := quicclasstest.ShortPacket(d.id, 100)
				dg := decide.Datagram{Key: sketch.KeyFrom(netip.AddrPortFrom(d.from, 50000), 443), Length: len(b), Probe: b}
				got := ul.Decide(&dg).Verified
				if want := map[bool]quicclass.Verification{true: d.want, false: quicclass.NotVerified}[tt.same]; got != want {
					t.Errorf("a short header to %x from %v: %v, want %v", d.id, d.from, got, want)
				}
			}
		})
	}
}
