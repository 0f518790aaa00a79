//go:build linux

package prefilter

import (
	"math"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestEstimates: the kernel's invalid drops are the sampled count times
// 2^SampleShift-1; a stream's are its arrival rate times p.
func TestEstimates(t *testing.T) {
	c := testutil.QUICLimits(200, 1000)
	p, err := sketch.Compile(c.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEnforcer()
	ln := testutil.Listen(t, "udp", "[::]:0")
	if err := e.Attach(ln, c); err != nil {
		t.Fatal(err)
	}
	streams := []datagram.Stream{streamAt(p, 0, quicclass.Opening, "127.0.0.2:40000")}
	thresh := p.Thresh[0][0]
	rate := func(*datagram.Stream) uint64 { return 10 * uint64(thresh) }
	var st datagram.Stats
	now := time.Now()
	if err := e.Update(c, p, streams, rate, st, now); err != nil {
		t.Fatal(err)
	}
	if s := e.Stats(); s.Rules != 1 || s.Sockets != 1 || !s.Stateless {
		t.Fatalf("stats %+v, want one rule on one socket", s)
	}
	st.Invalid[0][1][quicclass.FixedBit] = 10
	if err := e.Update(c, p, streams, rate, st, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	s := e.Stats()
	if got, want := s.InvalidDropped[quicclass.FixedBit], uint64(10*63); got != want {
		t.Errorf("invalid drops %d, want %d", got, want)
	}
	want := p.PPS(10*uint64(thresh)) * math.Floor(0.8*64) / 64
	if got := float64(s.StreamDropped[quicclass.Opening]); math.Abs(got-want) > 1 {
		t.Errorf("stream drops %v, want %v", got, want)
	}
	// Unchanged streams, rates and configuration leave the program in
	// place; a dry run replaces it with one that drops nothing.
	updates := s.Updates
	if err := e.Update(c, p, streams, rate, st, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	dry := c
	dry.DryRun = true
	if err := e.Update(dry, p, streams, rate, st, now.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := e.Stats(); s.Updates != updates+1 || s.Rules != 0 || s.Stateless || s.Instructions != 1 {
		t.Errorf("after a dry run: %+v (updates were %d)", s, updates)
	}
	if err := e.Detach(ln); err != nil {
		t.Fatal(err)
	}
}
