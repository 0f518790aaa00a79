package userspace

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestFairStreams floods the fair total (the socket's total, the only
// limited level) from 16 networks, with a quiet network beside them: the
// networks it drops packets of are tracked by network (the node below the
// total), for the pre-filter, the quiet one is not, the limited streams
// the events report stay the total's own, and idle networks expire.
func TestFairStreams(t *testing.T) {
	c := testutil.QUICLimits(1000, 1000)
	c.Limiter.LevelLimits = map[int]uint32{0: sketch.Unlimited, 1: sketch.Unlimited, 2: sketch.Unlimited, 3: 2000}
	clk := &testutil.Clock{}
	clk.Advance(time.Hour)
	l := newTestDecider(t, c, clk, 0)
	p := l.Params()
	if p.FairNode < 0 || p.FairSource < 0 {
		t.Fatalf("no fair total in %+v", p.Nodes)
	}
	quiet := dgram("127.91.0.1:4000", quicclasstest.Initial())
	// 16 networks of 4 sources at 1,000 datagrams a second each, 32
	// times the total, for 3 seconds; the quiet network 10 a second.
	for ms := range 3000 {
		for n := range 16 {
			for h := range 4 {
				d := dgram(fmt.Sprintf("127.90.%d.%d:5000", n, h+1), quicclasstest.Initial())
				l.Decide(&d)
			}
		}
		if ms%100 == 0 {
			q := quiet
			l.Decide(&q)
		}
		clk.Advance(time.Millisecond)
	}
	fair := l.FairStreams()
	networks := map[netip.Prefix]bool{}
	for _, s := range fair {
		if s.Node != p.Nodes[p.FairSource] {
			t.Errorf("fair stream %+v at node %v, want the network node %v", s, s.Node, p.Nodes[p.FairSource])
		}
		a := netip.AddrFrom4([4]byte{byte(s.Key.Words[0] >> 24), byte(s.Key.Words[0] >> 16), byte(s.Key.Words[0] >> 8),
			byte(s.Key.Words[0])})
		networks[netip.PrefixFrom(a, 24)] = true
	}
	for n := range 16 {
		if pfx := netip.MustParsePrefix(fmt.Sprintf("127.90.%d.0/24", n)); !networks[pfx] {
			t.Errorf("flooding network %v not tracked; tracked %v", pfx, networks)
		}
	}
	if len(networks) != 16 {
		t.Errorf("tracked %d networks %v, want the 16 that flood", len(networks), networks)
	}
	select {
	case <-l.Tracked():
	default:
		t.Error("no signal on Tracked after streams and networks started being tracked")
	}
	for ms := range 10 { // the same networks: no new signal
		d := dgram(fmt.Sprintf("127.90.%d.1:5000", ms), quicclasstest.Initial())
		l.Decide(&d)
	}
	select {
	case <-l.Tracked():
		t.Error("a signal on Tracked without a new stream or network")
	default:
	}
	streams, _ := l.Streams()
	for _, s := range streams {
		if s.Node == p.Nodes[p.FairSource] {
			t.Errorf("a limited stream at the network node %+v: the fair tracking leaked into the events", s)
		}
	}
	clk.Advance(10 * time.Second)
	if _, err := l.ExpireStreams(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if fair := l.FairStreams(); len(fair) != 0 {
		t.Errorf("%d networks still tracked after 10 s without a drop", len(fair))
	}
}
