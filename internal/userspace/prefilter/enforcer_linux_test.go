//go:build linux

package prefilter

import (
	"math"
	"net"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// attachedEnforcer compiles c and returns it with an Enforcer attached to a
// dual-stack socket (returned), closed when the test ends.
func attachedEnforcer(t *testing.T, c decide.Config) (*sketch.Params, *Enforcer, *net.UDPConn) {
	t.Helper()
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEnforcer()
	ln := testutil.Listen(t, "udp", "[::]:0")
	if err := e.Attach(ln, c); err != nil {
		t.Fatal(err)
	}
	return p, e, ln
}

// TestEstimates: the kernel's invalid drops are the sampled count times
// 2^SampleShift-1; a stream's are its arrival rate times p.
func TestEstimates(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	p, e, ln := attachedEnforcer(t, c)
	streams := []decide.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")}
	thresh := p.Thresh[0][0]
	rate := func(*decide.Stream) uint64 { return 10 * uint64(thresh) }
	var st decide.Stats
	now := time.Now()
	if err := e.Update(c, p, streams, nil, nil, rate, st, now); err != nil {
		t.Fatal(err)
	}
	if s := e.Status(); s.Rules != 1 || s.Sockets != 1 || !s.Stateless {
		t.Fatalf("stats %+v, want one rule on one socket", s)
	}
	st.Invalid[0][1][quicclass.FixedBit] = 10
	if err := e.Update(c, p, streams, nil, nil, rate, st, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	s := e.Status()
	if got, want := s.InvalidDropped[quicclass.FixedBit], uint64(10*(1<<DefaultSampleShift-1)); got != want {
		t.Errorf("invalid drops %d, want %d", got, want)
	}
	want := p.PPS(10*uint64(thresh)) * quantized(0.8)
	if got := float64(s.StreamDropped[quicclass.Opening]); math.Abs(got-want) > 1 {
		t.Errorf("stream drops %v, want %v", got, want)
	}
	// Unchanged streams, rates and configuration leave the program in
	// place; a dry run replaces it with one that drops nothing.
	updates := s.Updates
	if err := e.Update(c, p, streams, nil, nil, rate, st, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	dry := c
	dry.DryRun = true
	if err := e.Update(dry, p, streams, nil, nil, rate, st, now.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := e.Status(); s.Updates != updates+1 || s.Rules != 0 || s.Stateless || s.Instructions != 1 {
		t.Errorf("after a dry run: %+v (updates were %d)", s, updates)
	}
	if err := e.Detach(ln); err != nil {
		t.Fatal(err)
	}
}

// TestNegotiationEstimates: the negotiation class gets a drop probability
// from its measured rate and the cap, corrected for the kernel's drops once
// the program is on a socket; the kernel's drops are estimated from it; a
// dry run or a configuration that does not classify drops none of it.
func TestNegotiationEstimates(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	c.Negotiation = 100
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	dry := c
	dry.DryRun = true
	tests := []struct {
		name string
		c    decide.Config
		drop bool
	}{
		{"classifying", c, true},
		{"dry run", dry, false},
		{"not classifying", testutil.Limits(200), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEnforcer()
			ln := testutil.Listen(t, "udp", "[::]:0")
			if err := e.Attach(ln, tt.c); err != nil {
				t.Fatal(err)
			}
			defer e.Detach(ln)
			var st decide.Stats
			now := time.Now()
			rate := func(*decide.Stream) uint64 { return 0 }
			// 10,000 unknown-version datagrams a second reach the
			// limiter: 100 paced, the rest over the cap.
			for i := range 2 {
				st.Negotiation[1][0] += 100
				st.Negotiation[1][1] += 9_900
				if err := e.Update(tt.c, p, nil, nil, nil, rate, st, now.Add(time.Duration(i)*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			s := e.Status()
			if !tt.drop {
				if s.Negotiation != 0 || s.NegotiationDropped != 0 {
					t.Fatalf("negotiation drop probability %v, %d dropped: want none", s.Negotiation, s.NegotiationDropped)
				}
				return
			}
			want := quantized(1 - 2*100.0/10_000)
			if s.Negotiation != want {
				t.Fatalf("negotiation drop probability %v, want %v", s.Negotiation, want)
			}
			// The kernel now drops that share: the limiter sees what
			// is left of the same 10,000 a second.
			seen := uint64(math.Round(10_000 * (1 - want)))
			st.Negotiation[1][0] += 100
			st.Negotiation[1][1] += seen - 100
			if err := e.Update(tt.c, p, nil, nil, nil, rate, st, now.Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
			s = e.Status()
			if got := float64(s.NegotiationDropped); math.Abs(got-10_000*want) > 100 {
				t.Errorf("estimated kernel drops %v, want about %v", got, 10_000*want)
			}
			if s.Negotiation != want {
				t.Errorf("corrected for the kernel's drops, the probability moved to %v, want %v", s.Negotiation, want)
			}
			if s.Dropped() != s.NegotiationDropped {
				t.Errorf("Dropped() %d leaves out the negotiation drops %d", s.Dropped(), s.NegotiationDropped)
			}
		})
	}
}

// TestShedEstimate: SetShed puts its probability on the socket at the next
// Update; the long headers the userspace limiter reads count p/(1-p) shed
// each, with the probability in force one count earlier (they waited in the
// queue), and the estimate joins Dropped.
func TestShedEstimate(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	p, e, _ := attachedEnforcer(t, c)
	rate := func(*decide.Stream) uint64 { return 0 }
	var st decide.Stats
	now := time.Now()
	openings := func(n uint64) decide.Stats {
		st.Passed[quicclass.Opening][1] = n
		return st
	}
	if !e.SetShed(0.75, openings(0)) {
		t.Fatal("SetShed(0.75) from none reported no change")
	}
	if e.SetShed(0.75, openings(0)) {
		t.Error("SetShed with the same probability reported a change")
	}
	if err := e.Update(c, p, nil, nil, nil, rate, openings(0), now); err != nil {
		t.Fatal(err)
	}
	if s := e.Status(); s.Shed != 0.75 || s.ShedDropped != 0 {
		t.Fatalf("stats %+v, want shed 0.75 in force and nothing shed yet", s)
	}
	for _, step := range []struct {
		seen uint64
		want uint64
	}{
		{100, 0},   // read under the probability of the last count: none
		{200, 300}, // 100 more under 0.75: 3 shed each
	} {
		e.Account(openings(step.seen))
		if s := e.Status(); s.ShedDropped != step.want || s.Dropped() != step.want {
			t.Errorf("after %d openings read: %d shed (%d dropped), want %d", step.seen, s.ShedDropped, s.Dropped(), step.want)
		}
	}
	dry := c
	dry.DryRun = true
	if err := e.Update(dry, p, nil, nil, nil, rate, openings(200), now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := e.Status(); s.Shed != 0 {
		t.Errorf("a dry run's program sheds %v, want none", s.Shed)
	}
}
