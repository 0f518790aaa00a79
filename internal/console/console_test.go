package console

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// limiter is a limiter of the admin view with the counters given, one
// family, four levels.
func limiter(opening report.ClassCounters, established report.ClassCounters, invalid map[string]uint64, streams ...report.Stream) report.Limiter {
	return report.Limiter{
		Name: "default", Mode: "bpf", Listeners: []string{"[::]:443"},
		Config: report.Config{Limit: 1000, Window: report.Duration(time.Second), Classify: true, LevelLimits: []uint32{1000, 1000, 1000, 20000},
			EstablishedLevelLimits: []uint32{200000, 200000, 200000, 0}, IPv4Prefixes: []int{32, 24, 0}, IPv6Prefixes: []int{64, 48, 0}},
		Counters: map[string]report.Counters{"ipv4": {
			Classes: map[string]report.ClassCounters{"opening": opening, "established": established},
			Invalid: invalid, Negotiation: map[string]uint64{"passed": 0},
		}},
		LimitedStreams: streams, LimitedStreamsTotal: len(streams),
		OpeningTotal: report.Total{Adaptive: true, CapPPS: 20000},
	}
}

// levels makes a by-level map from four counts.
func levels(v ...uint64) map[string]uint64 {
	m := map[string]uint64{}
	for i, x := range v {
		m[fmt.Sprint(i)] = x
	}
	return m
}

var t0 = time.Date(2026, 11, 23, 3, 0, 0, 0, time.UTC)

// snapshots are two readings 2 s apart: prev all zero, cur with the
// given limiter.
func snapshots(cur report.Limiter) (Snapshot, Snapshot) {
	zero := limiter(report.ClassCounters{}, report.ClassCounters{}, nil)
	return Snapshot{At: t0, View: report.View{Limiters: []report.Limiter{zero}}}, Snapshot{At: t0.Add(2 * time.Second), View: report.View{Limiters: []report.Limiter{cur}}}
}

func TestRates(t *testing.T) {
	cur := limiter(report.ClassCounters{Passed: 2000, Limited: levels(10, 0, 0, 0), Dropped: levels(8000, 0, 4000, 200)},
		report.ClassCounters{Passed: 600}, map[string]uint64{"small_initial": 300})
	prev, now := snapshots(cur)
	r := RatesOf(prev, now, "default")
	if r == nil {
		t.Fatal("no rates")
	}
	open := r.Class("opening")
	if open == nil || open.Passed != 1000 || open.Limited != 5 || open.DroppedTotal() != 6100 || open.Dropped[3] != 100 {
		t.Errorf("opening rates %+v, want passed 1000, limited 5, dropped 6100 (100 at level 3)", open)
	}
	if r.Classes[0].Name != "opening" || r.Classes[1].Name != "established" {
		t.Errorf("classes in order %v, want opening first, established second", r.Classes)
	}
	if got := r.InvalidTotal(); got != 150 {
		t.Errorf("invalid %v/s, want 150", got)
	}
	// A counter that went back counts as 0, not as a huge rate.
	if r := RatesOf(now, Snapshot{At: now.At.Add(time.Second), View: prev.View}, "default"); r.Class("opening").Passed != 0 {
		t.Errorf("a counter that went back gives %v/s", r.Class("opening").Passed)
	}
	if RatesOf(prev, now, "other") != nil || RatesOf(now, prev, "default") != nil {
		t.Error("rates of a missing limiter, or of snapshots out of order")
	}
}

func TestVerdict(t *testing.T) {
	flood := report.Stream{Stream: "203.0.113.0/24 sport=* -> :443", Class: "opening", Level: 2, RatePPS: 9000, LimitPPS: 1000}
	junk := report.Stream{Stream: "198.51.100.7 -> :443", Class: "invalid", Reason: "small_initial", Level: -1}
	reflect := report.Stream{Stream: "* sport=4433 -> :443", Class: "opening", Level: 2}
	tests := []struct {
		name    string
		l       report.Limiter
		noRates bool
		want    []string
		not     []string
	}{
		{"quiet", limiter(report.ClassCounters{Passed: 100}, report.ClassCounters{}, nil), false,
			[]string{"quiet: nothing dropped in the last 2 s"}, []string{"dropping"}},
		{"a flood held at level 2, total with room",
			limiter(report.ClassCounters{Passed: 2000, Dropped: levels(0, 0, 16000, 0)}, report.ClassCounters{}, nil, flood), false,
			[]string{"dropping a flood from 203.0.113.0/24 at level 2; the opening total has room"}, []string{"full"}},
		{"the total full", limiter(report.ClassCounters{Dropped: levels(0, 0, 0, 5000)}, report.ClassCounters{}, nil, flood), false,
			[]string{"the opening total is full (20000/s): networks over their fair share lose whole sources",
				"dropping a flood from 203.0.113.0/24 at level 2"}, []string{"has room"}},
		{"invalid datagrams", limiter(report.ClassCounters{}, report.ClassCounters{}, map[string]uint64{"small_initial": 50}, junk), false,
			[]string{"dropping invalid datagrams (small_initial) from 198.51.100.7"}, nil},
		{"established dropped", limiter(report.ClassCounters{}, report.ClassCounters{Dropped: levels(10, 0, 0, 0)}, nil), false,
			[]string{"established datagrams dropped"}, nil},
		{"reflection", limiter(report.ClassCounters{Dropped: levels(0, 0, 10, 0)}, report.ClassCounters{}, nil, reflect), false,
			[]string{"from every source from port 4433 at level 2"}, nil},
		{"spoofed", func() report.Limiter {
			l := limiter(report.ClassCounters{Dropped: levels(0, 0, 0, 90000)}, report.ClassCounters{}, nil)
			l.UntrackedDrops = 80000
			return l
		}(), false, []string{"dropping 40.0k/s from sources too many to list (a new source on every packet: spoofed)"}, nil},
		{"no rates yet", limiter(report.ClassCounters{}, report.ClassCounters{}, nil, flood), true,
			[]string{"dropping a flood from 203.0.113.0/24 at level 2"}, []string{"room", "full"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev, cur := snapshots(tt.l)
			r := RatesOf(prev, cur, "default")
			if tt.noRates {
				r = nil
			}
			got := Verdict(tt.l, r)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("verdict %q lacks %q", got, w)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(got, n) {
					t.Errorf("verdict %q has %q", got, n)
				}
			}
		})
	}
	dry := limiter(report.ClassCounters{DryRun: levels(100, 0, 0, 0)}, report.ClassCounters{}, nil, flood)
	dry.Config.DryRun = true
	if got := Verdict(dry, nil); !strings.HasPrefix(got, "would drop (dry run) a flood") {
		t.Errorf("dry run verdict %q", got)
	}
}

func TestLinesFit(t *testing.T) {
	var streams []report.Stream
	for i := range 20 {
		streams = append(streams, report.Stream{Stream: fmt.Sprintf("127.0.0.%d/32 sport=1 -> :443", i), Class: "opening", RatePPS: float64(100 - i)})
	}
	l := limiter(report.ClassCounters{Dropped: levels(500, 0, 0, 0)}, report.ClassCounters{}, nil, streams...)
	prev, cur := snapshots(l)
	tests := []struct {
		name          string
		width, height int
		streams       int
	}{
		{"unbounded", 0, 0, 20},
		{"80x24", 80, 24, 9},
		{"too small for streams", 40, 10, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := Lines(Screen{Address: "localhost:2019", Prev: &prev, Cur: cur, Width: tt.width, Height: tt.height})
			if tt.height > 0 && len(lines) > tt.height {
				t.Errorf("%d lines, more than %d", len(lines), tt.height)
			}
			n := 0
			for _, line := range lines {
				if tt.width > 0 && len([]rune(line)) > tt.width {
					t.Errorf("line wider than %d: %q", tt.width, line)
				}
				if strings.Contains(line, "/32 sport") {
					n++
				}
			}
			if n != tt.streams {
				t.Errorf("%d streams shown, want %d:\n%s", n, tt.streams, strings.Join(lines, "\n"))
			}
			if tt.height == 0 || tt.height >= 24 {
				if last := lines[len(lines)-1]; !strings.Contains(last, "verdict: dropping a flood from 127.0.0.0/32") {
					t.Errorf("the last line is not the verdict: %q", last)
				}
			}
		})
	}
}

func TestFetchErrors(t *testing.T) {
	rakelimit := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case Path:
				fmt.Fprint(w, body)
			case "/config/":
				fmt.Fprint(w, `{"apps":{}}`)
			default:
				http.NotFound(w, r)
			}
		}
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	tests := []struct {
		name    string
		handler http.Handler // nil: nothing listens
		want    string
	}{
		{"unreachable", nil, "cannot reach Caddy's admin endpoint at"},
		{"another web server", http.NotFoundHandler(), "is not a Caddy with rakelimit: GET /rakelimit/ answered 404 Not Found"},
		{"Caddy without rakelimit", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/config/" {
				fmt.Fprint(w, "null")
				return
			}
			http.NotFound(w, r)
		}), "has no rakelimit: GET /rakelimit/ is not found; build Caddy with xcaddy build --with github.com/rakelimit/caddy-rakelimit"},
		{"not JSON", rakelimit("<html>hello</html>"), "did not answer rakelimit's JSON: <html>hello</html>"},
		{"no limiter", rakelimit(`{"limiters":[]}`), "runs no rakelimit: no HTTP/3 listener has the rakelimit directive"},
		{"one limiter", rakelimit(`{"limiters":[{"name":"default","mode":"bpf"}]}`), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := closedAddr
			if tt.handler != nil {
				srv := httptest.NewServer(tt.handler)
				defer srv.Close()
				addr = strings.TrimPrefix(srv.URL, "http://")
			}
			c := Client{Address: addr, Origin: "http://" + addr, HTTP: &http.Client{}}
			v, err := c.Fetch(context.Background())
			switch {
			case tt.want == "" && (err != nil || len(v.Limiters) != 1 || v.Limiters[0].Mode != "bpf"):
				t.Fatalf("Fetch: %+v, %v", v, err)
			case tt.want == "":
			case err == nil:
				t.Fatalf("Fetch: no error, want %q", tt.want)
			case !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n"):
				t.Fatalf("Fetch: %q, want one line with %q", err, tt.want)
			}
		})
	}
}

func TestTop(t *testing.T) {
	flood := report.Stream{Stream: "127.0.0.6/32 sport=4000 -> :443", Class: "opening", Level: 0, RatePPS: 5000, LimitPPS: 1000}
	var n uint64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fetch := func(context.Context) (report.View, error) {
		n++
		if n == 3 {
			cancel() // the operator presses Ctrl-C during the third screen
		}
		return report.View{Limiters: []report.Limiter{limiter(report.ClassCounters{Dropped: levels(n*1000, 0, 0, 0)}, report.ClassCounters{}, nil, flood)}}, nil
	}
	tests := []struct {
		name     string
		terminal bool
	}{{"plain", false}, {"terminal", true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n = 0
			ctx, cancel = context.WithCancel(context.Background())
			defer cancel()
			var out bytes.Buffer
			err := Top(ctx, fetch, &out, Options{Address: "a", Interval: 10 * time.Millisecond, Terminal: tt.terminal,
				Size: func() (int, int) { return 100, 30 }})
			if err != nil {
				t.Fatal(err)
			}
			s := out.String()
			if got := strings.Count(s, "rakelimit at a"); got != 3 {
				t.Errorf("%d screens, want 3:\n%s", got, s)
			}
			if got := strings.Count(s, "\x1b[2J"); (got == 3) != tt.terminal || (got == 0) == tt.terminal {
				t.Errorf("%d clear-screen escapes on terminal=%v", got, tt.terminal)
			}
			if !strings.Contains(s, "127.0.0.6/32 sport=4000") || !strings.Contains(s, "verdict: dropping a flood from 127.0.0.6/32 at level 0; the opening total has room") {
				t.Errorf("the stream or the verdict is missing:\n%s", s)
			}
		})
	}
	// The first read's error is Top's.
	if err := Top(context.Background(), func(context.Context) (report.View, error) { return report.View{}, fmt.Errorf("down") },
		&bytes.Buffer{}, Options{Interval: time.Millisecond}); err == nil || err.Error() != "down" {
		t.Errorf("Top with the endpoint down: %v", err)
	}
}

// TestXDPHeader: a limiter in mode xdp says where its XDP program runs,
// how, and for which listeners, or that it runs nowhere; and the
// interfaces where the socket filter alone decides.
func TestXDPHeader(t *testing.T) {
	for _, tt := range []struct {
		xdp  []report.XDPInterface
		want string
	}{
		{[]report.XDPInterface{{Name: "eth0", Attach: report.XDPNative, Listeners: []string{"[::]:443"}},
			{Name: "eth1", Attach: report.XDPNative, Listeners: []string{"[::]:443"}}},
			"  xdp on eth0 (native: [::]:443), eth1 (native: [::]:443); elsewhere the socket filter"},
		{nil, "  xdp on no interface: the socket filter decides everything"},
		{[]report.XDPInterface{{Name: "docker0", Attach: report.XDPSocketFilterOnly, Reason: "a bridge", LeftOut: true,
			Listeners: []string{"[::]:443"}}, {Name: "eth0", Attach: report.XDPNative, Listeners: []string{"[::]:443"}},
			{Name: "vlan7", Attach: report.XDPSocketFilterOnly, Reason: "a VLAN", LeftOut: true, Listeners: []string{"[::]:443"}}},
			"  xdp on eth0 (native: [::]:443); elsewhere the socket filter (socket filter only on docker0 vlan7)"},
		{[]report.XDPInterface{{Name: "eth0", Attach: report.XDPSocketFilterOnly, Reason: "no native XDP",
			Listeners: []string{"[::]:443"}}},
			"  xdp on no interface: the socket filter decides everything (socket filter only on eth0)"},
	} {
		l := limiter(report.ClassCounters{}, report.ClassCounters{}, nil)
		l.Mode, l.XDP = "xdp", tt.xdp
		_, cur := snapshots(l)
		lines := Lines(Screen{Address: "localhost:2019", Cur: cur})
		if !strings.Contains(strings.Join(lines, "\n"), "mode xdp") || !slices.Contains(lines, tt.want) {
			t.Errorf("the screen of a limiter in mode xdp on %v:\n%s\nwant the line %q", tt.xdp, strings.Join(lines, "\n"), tt.want)
		}
	}
}
