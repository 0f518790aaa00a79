package prefilter

import (
	"math"
	"net/netip"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// streamAt is a stream of class at node i of p from src.
func streamAt(p *sketch.Params, i int, class quicclass.Class, src string) datagram.Stream {
	k := sketch.KeyFrom(netip.MustParseAddrPort(src), 443)
	return datagram.Stream{Class: class, Node: p.Nodes[i], Level: p.Nodes[i].Level(), Key: k, Estimate: 1}
}

// TestRulesOf checks which streams become rules, with what probability,
// form and match, and in which order.
func TestRulesOf(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	thresh := float64(p.Thresh[0][0])
	rates := func(mult ...float64) RateFunc {
		return func(s *datagram.Stream) uint64 { return uint64(mult[s.Key.SrcPort%uint16(len(mult))] * thresh) }
	}
	none := func(ruleKey) float64 { return 0 }
	last := len(p.Nodes) - 1
	dry := streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")
	dry.DryRun = true
	invalid := streamAt(p, 0, quicclass.Invalid, "127.0.0.2:40000")
	invalid.Level = -1
	tests := []struct {
		name    string
		c       datagram.Config
		streams []datagram.Stream
		rate    RateFunc
		peff    func(ruleKey) float64
		want    []float64 // drop probabilities, in order
		form    Form
	}{
		{"ten times the limit", c, []datagram.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")}, rates(10), none,
			[]float64{math.Floor(0.8*64) / 64}, LongForm},
		{"the same stream, 80% dropped in the kernel", c, []datagram.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")},
			rates(2), func(ruleKey) float64 { return 0.8 }, []float64{math.Floor(0.8*64) / 64}, LongForm},
		{"under twice the limit", c, []datagram.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")}, rates(1.5), none, nil, 0},
		{"capped", c, []datagram.Stream{streamAt(p, 0, quicclass.Established, "[::1]:40000")}, rates(1e6), none,
			[]float64{math.Floor(MaxDrop*64) / 64}, ShortForm},
		{"largest first", c, []datagram.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000"),
			streamAt(p, 0, quicclass.Opening, "127.0.0.3:40001")}, rates(4, 40), none,
			[]float64{math.Floor((1-2.0/40)*64) / 64, math.Floor(0.5*64) / 64}, LongForm},
		{"not classifying", testutil.Limits(200), []datagram.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")},
			rates(10), none, []float64{math.Floor(0.8*64) / 64}, AnyForm},
		{"dry run", c, []datagram.Stream{dry}, rates(10), none, nil, 0},
		{"invalid", c, []datagram.Stream{invalid}, rates(10), none, nil, 0},
		{"the whole socket", c, []datagram.Stream{streamAt(p, last, quicclass.Opening, "127.0.0.2:40000")}, rates(10), none, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := RulesOf(tt.c, p, tt.streams, tt.rate, tt.peff)
			if len(rules) != len(tt.want) {
				t.Fatalf("%d rules %+v, want %d", len(rules), rules, len(tt.want))
			}
			for i, r := range rules {
				if r.Drop != tt.want[i] || r.Form != tt.form {
					t.Errorf("rule %d: drop %v form %v, want %v and %v", i, r.Drop, r.Form, tt.want[i], tt.form)
				}
				n := p.Nodes[0]
				if r.Bits != p.PrefixLen(r.Family, n.Prefix()) || r.MatchSrcPort == n.SrcPortAny() {
					t.Errorf("rule %d: /%d, source port %v: not node %v's stream", i, r.Bits, r.MatchSrcPort, n)
				}
			}
		})
	}
}
