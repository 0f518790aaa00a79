package engine

import (
	"net"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// TestReportClassNames: the report names the classes as the engine's
// counters and logs do.
func TestReportClassNames(t *testing.T) {
	for _, classify := range []bool{true, false} {
		c := decide.Config{Classify: classify}
		limits := report.Config{Classify: classify}.Limits()
		if len(limits) != len(LimiterClasses) {
			t.Fatalf("the report has limits of %d classes, the engine %d", len(limits), len(LimiterClasses))
		}
		for i, class := range LimiterClasses {
			if got, want := limits[i].Class, ClassName(c, class); got != want {
				t.Errorf("classify %v: the report names class %d %q, the engine %q", classify, i, got, want)
			}
		}
	}
	if quicclass.Negotiation.String() != report.ClassNegotiation || quicclass.Invalid.String() != report.ClassInvalid {
		t.Errorf("the report names negotiation and invalid %q and %q, quicclass %q and %q", report.ClassNegotiation,
			report.ClassInvalid, quicclass.Negotiation, quicclass.Invalid)
	}
}

// TestReport: a limiter's report has its mode, listeners, configuration
// with defaults filled in, counters of every family and class, and its
// attach errors.
func TestReport(t *testing.T) {
	l, _, _, _ := startFake(t, ModeBPF, nil)
	conn := listen(t)
	if _, _, err := l.Attach(conn); err != nil {
		t.Fatal(err)
	}
	l.AttachError()
	r, err := l.Report()
	if err != nil {
		t.Fatal(err)
	}
	lc := testConfig(100).Limiter.WithDefaults()
	levels := lc.Levels()
	if r.Name != "test" || r.Mode != ModeBPF || !slices.Equal(r.Listeners, []string{conn.LocalAddr().String()}) ||
		r.AttachErrors != 1 || r.Prefilter != nil {
		t.Errorf("report %+v: want limiter test in mode bpf on %v, one attach error, no pre-filter", r, conn.LocalAddr())
	}
	if r.Config.Limit != 100 || r.Config.Window != report.Duration(time.Second) || len(r.Config.LevelLimits) != levels ||
		len(r.Config.UnverifiedLevelLimits) != levels || len(r.Config.IPv4Prefixes) != len(lc.IPv4Prefixes) {
		t.Errorf("config %+v: want limit 100, window 1s, %d levels", r.Config, levels)
	}
	for _, fam := range report.Families {
		fc, ok := r.Counters[fam]
		if !ok || len(fc.Classes) != len(LimiterClasses) || len(fc.Invalid) != int(quicclass.NumReasons)-1 ||
			len(fc.Verified) != int(quicclass.NumVerifications)-1 || len(fc.Negotiation) != 3 {
			t.Errorf("counters of %s: %+v", fam, fc)
		}
		for name, cc := range fc.Classes {
			if len(cc.Dropped) != levels {
				t.Errorf("class %s of %s: %d levels of drops, want %d", name, fam, len(cc.Dropped), levels)
			}
		}
	}
}

// TestRegistry: a socket has one limiter; the registry forgets a limiter
// and its sockets when it closes it, and keeps the newer of two limiters of
// one name.
func TestRegistry(t *testing.T) {
	reg := NewRegistry()
	// held starts a limiter on a fake BPF engine and holds it, as Start
	// does; close says whether the test closes it at its end.
	held := func(name string, close bool) *Limiter {
		l, err := start(name, newFake(t, ModeBPF, nil), Setting{Config: testConfig(100), Mode: ModeBPF, Logger: zap.NewNop()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if close {
			t.Cleanup(func() { l.Close() })
		}
		reg.mu.Lock()
		reg.limiters[name] = l
		reg.mu.Unlock()
		return l
	}
	a, b := held("a", false), held("b", true)
	conn := listen(t)
	if _, attached, err := reg.Attach(a, conn); err != nil || !attached {
		t.Fatalf("Attach: %v, %v", attached, err)
	}
	if _, _, err := reg.Attach(b, conn); err == nil {
		t.Fatal("a socket another limiter owns was attached")
	}
	is := func(c *net.UDPConn) bool { return c == conn }
	if owner, ok := reg.Owner(is); !ok || owner != a {
		t.Fatalf("owner %v, %v; want a", owner, ok)
	}
	if got := reg.Limiters(); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("limiters %v, want a and b", got)
	}
	if err := reg.Close(a); err != nil {
		t.Fatal(err)
	}
	if _, ok := reg.Owner(is); ok || reg.Named("a") != nil {
		t.Fatal("the closed limiter and its socket are still held")
	}
	if _, _, err := reg.Attach(b, conn); err != nil {
		t.Fatalf("the freed socket: %v", err)
	}
	older, newer := held("c", false), held("c", true)
	if err := reg.Close(older); err != nil || reg.Named("c") != newer {
		t.Fatalf("closing the older of two limiters called c: %v; the registry holds %p, want the newer %p", err, reg.Named("c"), newer)
	}
}
