//go:build linux

package bench

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixedReport is a run of idle, one-source and transfers with plain and
// rakelimit, three repetitions, with made-up but consistent figures.
func fixedReport() *Report {
	all := Scenarios()
	var scenarios []Scenario
	for _, s := range all {
		if s.Name == "idle" || s.Name == "one-source" || s.Name == "transfers" {
			scenarios = append(scenarios, s)
		}
	}
	rep := &Report{
		Date: "2026-11-23T10:00:00Z", Command: []string{"rakebench", "-reps", "3"},
		Machine:  Machine{CPU: "Test CPU <2>", Cores: 2, Kernel: "Linux 6.18", Go: "go1.26.8", Caddy: "v2.11.9", Gtlsclient: "installed"},
		Settings: Settings{Reps: 3, Scale: 1, FloodSeconds: 10, FloodMax: 20e6, RequestRate: 25, TimeoutSeconds: 3, GtlsFetches: 3, Sizes: sizesFor(1), StallSeconds: 10, TransferTimeoutSeconds: 60, StopTimeoutSeconds: 30, FloodStopTimeoutSeconds: 10},
		Variants: builtinVariants(), Scenarios: scenarios,
	}
	plainP99 := []float64{100, 50, 300}
	rakeP99 := []float64{10, 20, 30}
	for r := 1; r <= 3; r++ {
		for _, v := range []string{Plain, "rakelimit"} {
			rake := v != Plain
			legitOf := func(attempted, ok int, p99 float64) *LegitStats {
				s := &LegitStats{Attempted: attempted, OK: ok, SuccessPct: 100 * float64(ok) / float64(attempted), P50Ms: ptr(p99 / 10), P99Ms: ptr(p99)}
				if ok < attempted {
					s.Errors = map[string]int{"timeout": attempted - ok}
				}
				return s
			}
			legit := func(ok int, p99 float64) *LegitStats { return legitOf(250, ok, p99) }
			idle := RunResult{Scenario: "idle", Variant: v, Rep: r, NewConn: legit(250, 5), Established: legit(250, 2), Gtls: legitOf(3, 3, 40),
				Server: ServerStats{CPUPct: 10, PeakRSSBytes: 65e6}}
			flood := RunResult{Scenario: "one-source", Variant: v, Rep: r,
				Flood:       &FloodResult{Kind: PacketInitial, Sockets: 1, Addresses: 1, Sent: 4e6, OfferedPPS: 400e3, Reflected: 70e3},
				Established: legit(250, 50), Gtls: legitOf(3, 3, 60),
				Server:      ServerStats{CPUPct: 80, PeakRSSBytes: 500e6, SocketDrops: 1e6, RcvbufDrops: 1e6},
				StopSeconds: 10, StopTimedOut: true}
			flood.NewConn = legit(150, plainP99[r-1])
			if r == 2 {
				flood.NewConn = &LegitStats{Attempted: 250, Errors: map[string]int{"timeout": 250}} // nothing succeeded
			}
			if rake {
				flood.NewConn = legit(250, rakeP99[r-1])
				flood.Flood.OfferedPPS, flood.Flood.Reflected, flood.Flood.Sent = 600e3, 0, 6.25e6
				flood.StopSeconds, flood.StopTimedOut = 0.1, false
				flood.Server = ServerStats{CPUPct: 20, PeakRSSBytes: 200e6, SocketDrops: 6e6, ModuleRefused: 6e6, ModuleDelivered: 13e3,
					Module: []ModuleGroup{
						{Name: "dropped", Verdict: true, Total: 6e6, By: map[string]map[string]float64{"level": {"0": 6e6}}},
						{Name: "passed", Verdict: true, Total: 13e3},
					}}
			}
			tr := RunResult{Scenario: "transfers", Variant: v, Rep: r, Server: ServerStats{CPUPct: 70, PeakRSSBytes: 80e6}, StopSeconds: 0.01}
			for _, n := range TransferNames() {
				t := TransferResult{Name: n, Connections: 1, Streams: 1, Expected: 100e6, Got: 100e6, Seconds: 1, Mbps: 800}
				if rake && n == transferUpload && r == 3 {
					t.TimedOut, t.Got, t.Seconds, t.Mbps, t.Error = true, 5e6, 14, 5e6*8/14/1e6, "no progress for 10s: stalled"
				}
				tr.Transfers = append(tr.Transfers, t)
			}
			rep.Runs = append(rep.Runs, idle, flood, tr)
		}
	}
	rep.Summary = summarizeRuns(rep.Runs, rep.Variants, rep.Scenarios)
	return rep
}

func TestSummarizeRuns(t *testing.T) {
	rep := fixedReport()
	if len(rep.Summary) != 6 {
		t.Fatalf("%d summaries, want 6", len(rep.Summary))
	}
	plain := summaryOf(rep, "one-source", Plain)
	rake := summaryOf(rep, "one-source", "rakelimit")
	// Plain's p99: 100, (none), 300 → 200. rakelimit's: 10, 20, 30 → 20;
	// its ratios 0.1, (none), 0.1 → 0.1.
	if f := plain.Figures[figNewP99]; f.Median == nil || *f.Median != 200 || f.Ratio != nil {
		t.Errorf("plain p99 %+v", f)
	}
	if f := rake.Figures[figNewP99]; f.Median == nil || *f.Median != 20 || f.Ratio == nil || math.Abs(*f.Ratio-0.1) > 1e-9 {
		t.Errorf("rakelimit p99 %+v", f)
	}
	if f := rake.Figures[figNewOK]; *f.Median != 100 || math.Abs(*f.Ratio-100.0/60) > 1e-9 {
		t.Errorf("rakelimit success %v (ratio %v), want 100 (1.67)", *f.Median, *f.Ratio)
	}
	// Plain refused nothing: no ratio.
	if f := rake.Figures[figRefused]; *f.Median != 6e6 || f.Ratio != nil {
		t.Errorf("refused %+v", f)
	}
	if f := rake.Figures[moduleFigure("dropped", "level", "0")]; f.Median == nil || *f.Median != 6e6 {
		t.Errorf("dropped at level 0: %+v", f)
	}
	tr := summaryOf(rep, "transfers", "rakelimit")
	if tr.TransferTimeouts[transferUpload] != 1 || len(tr.TransferTimeouts) != 1 || plain.StopTimeouts != 3 || rake.StopTimeouts != 0 {
		t.Errorf("timeouts: transfers %v, stops %d %d", tr.TransferTimeouts, plain.StopTimeouts, rake.StopTimeouts)
	}
}

func TestWriteOutputs(t *testing.T) {
	rep := fixedReport()
	dir := t.TempDir()
	readme := filepath.Join(dir, "README.md")
	if err := os.WriteFile(readme, []byte("# x\n\n## Bench\n\n<!-- bench:begin -->\nold\n<!-- bench:end -->\n\n## Next\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "docs", "bench")
	if err := writeOutputs(rep, out, readme); err != nil {
		t.Fatal(err)
	}
	// results.json holds everything and reads back.
	js, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back.Date != rep.Date || back.Machine.CPU != "Test CPU <2>" || len(back.Runs) != 18 || len(back.Summary) != 6 ||
		back.Runs[1].Flood.OfferedPPS != 400e3 || back.Settings.Sizes.Download != 200e6 {
		t.Errorf("results.json read back: %+v", back.Settings)
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Command: `rakebench -reps 3`",
		"- Machine: Test CPU <2>, 2 cores, Linux 6.18",
		"- **rakelimit**: `rakelimit`",
		"| one-source | plain | 400k | 60.0% | 20.0 ms | 200.0 ms | 100.0% | 5.0 ms | 50.0 ms | 100.0% |",
		"| one-source | rakelimit | 600k (1.50×) | 100.0% (1.67×) | 2.0 ms (0.10×) | 20.0 ms (0.10×) |",
		"| one-source | plain | 80.0% | 500 MB | 1M | 1M | – | 70k | > 10 s, killed (3 of 3) | – |",
		"| one-source | rakelimit | 20.0% (0.25×) | 200 MB (0.40×) | 6M (6.00×) | 0 (0.00×) | 96.0% (–) | 0 (0.00×) | 0.10 s (–) | dropped 6M (level 0 6M); passed 13k |",
		"| upload | rakelimit | 800 (1.00×) | 1.00 s (1.00×) | 100 MB (1.00×) | 1 of 3 |",
		"| Caddy's stop | plain | | 10.0 ms | | 0 of 3 |",
		"- rep 3 transfers/rakelimit: upload: no progress for 10s: stalled (got 5 MB of 100 MB)",
		"- rep 1 one-source/plain: Caddy did not stop within 10 s of SIGTERM and was killed",
		"- rep 1 one-source/plain: new connection: 100 of 250 failed: 100 × timeout",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks\n%s", want)
		}
	}
	if t.Failed() {
		t.Logf("results.md:\n%s", md)
	}
	// Charts: well-formed SVG, one bar per measured value.
	wantBars := map[string]int{
		"legit-success.svg": 2 * 4, // 2 flood scenarios x (2 variants x 2 clients)
		"legit-p99.svg":     2 * 4,
		"transfers.svg":     4 * 2,
		"caddy-cpu.svg":     3 * 2,
	}
	for file, n := range wantBars {
		b, err := os.ReadFile(filepath.Join(out, file))
		if err != nil {
			t.Fatal(err)
		}
		bars, texts := svgContents(t, b)
		if bars != n {
			t.Errorf("%s: %d bars, want %d", file, bars, n)
		}
		if file == "transfers.svg" && !strings.Contains(texts, "timeout 1/3") {
			t.Errorf("%s lacks the timeout mark: %s", file, texts)
		}
		if !strings.Contains(texts, "Test CPU <2>, 2 cores; median of 3") {
			t.Errorf("%s lacks its provenance: %s", file, texts)
		}
	}
	// The README's section is replaced, the rest kept.
	rd, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# x\n\n## Bench\n\n<!-- bench:begin -->\nFrom `rakebench -reps 3` on 2026-11-23: Test CPU <2>, 2 cores",
		"Tables: [docs/bench/results.md](docs/bench/results.md)", "(docs/bench/legit-p99.svg)\n", "<!-- bench:end -->\n\n## Next\n"} {
		if !strings.Contains(string(rd), want) {
			t.Errorf("README lacks %q:\n%s", want, rd)
		}
	}
	if strings.Contains(string(rd), "old") {
		t.Errorf("README keeps the old section:\n%s", rd)
	}
	os.WriteFile(readme, []byte("# no markers\n"), 0o644)
	if err := writeOutputs(rep, out, readme); err == nil || !strings.Contains(err.Error(), "no <!-- bench:begin --> ... <!-- bench:end --> section") {
		t.Errorf("README without markers: err = %v", err)
	}
}

// svgContents parses an SVG document and returns its number of bars (rects
// with a title) and its text.
func svgContents(t *testing.T, b []byte) (bars int, texts string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(string(b)))
	var sb strings.Builder
	inRect := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG does not parse: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if e.Name.Local == "rect" {
				inRect = true
			}
			if e.Name.Local == "title" && inRect {
				bars++
			}
		case xml.EndElement:
			if e.Name.Local == "rect" {
				inRect = false
			}
		case xml.CharData:
			sb.Write(e)
			sb.WriteByte(' ')
		}
	}
	return bars, sb.String()
}

func TestChartMissingValues(t *testing.T) {
	c := barChart{title: "t", groups: []string{"a", "b"}, series: []barSeries{{name: "s", color: "#000", values: []float64{math.NaN(), 5}}}}
	bars, texts := svgContents(t, []byte(c.svg()))
	if bars != 1 || !strings.Contains(texts, "n/a") {
		t.Errorf("%d bars, texts %q: want 1 bar and an n/a", bars, texts)
	}
	empty := barChart{title: "none", groups: []string{"a"}, series: []barSeries{{name: "s", values: []float64{math.NaN()}}}}
	if bars, _ := svgContents(t, []byte(empty.svg())); bars != 0 {
		t.Errorf("all missing: %d bars", bars)
	}
}

// TestRerender: the outputs rendered again from results.json are the
// outputs of the run.
func TestRerender(t *testing.T) {
	rep := fixedReport()
	first, second := t.TempDir(), t.TempDir()
	if err := writeOutputs(rep, first, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Rerender(&Options{From: filepath.Join(first, "results.json"), Out: second}, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.md", "results.json", "legit-success.svg", "legit-p99.svg", "transfers.svg", "caddy-cpu.svg"} {
		a, _ := os.ReadFile(filepath.Join(first, f))
		b, err := os.ReadFile(filepath.Join(second, f))
		if err != nil || len(a) == 0 || string(a) != string(b) {
			t.Errorf("%s differs when rendered again (%v)", f, err)
		}
	}
	bad := filepath.Join(t.TempDir(), "results.json")
	os.WriteFile(bad, []byte(`{"runs":[]}`), 0o644)
	for from, want := range map[string]string{bad: "no runs", filepath.Join(second, "missing.json"): "no such file"} {
		if _, err := Rerender(&Options{From: from, Out: t.TempDir()}, io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("-from %s: err = %v, want %q", from, err, want)
		}
	}
}

func TestShellJoin(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rakebench", "-out", "lab/docs/bench"}, "rakebench -out lab/docs/bench"},
		{[]string{"rakebench", "-variant", "u=rakelimit { mode userspace }"}, "rakebench -variant 'u=rakelimit { mode userspace }'"},
		{[]string{"x", "it's"}, `x 'it'\''s'`},
		{[]string{"x", ""}, "x ''"},
	} {
		if got := shellJoin(tc.args); got != tc.want {
			t.Errorf("shellJoin(%q) = %s, want %s", tc.args, got, tc.want)
		}
	}
}

func TestKernelRefusedAndSpoofedReflection(t *testing.T) {
	flood := func(spoofed string) *FloodResult {
		return &FloodResult{Kind: PacketShortSmall, Sent: 2e6, Reflected: 0, Spoofed: spoofed}
	}
	kernel := ServerStats{ModuleRefused: 1.99e6, ModuleDelivered: 30e3}
	for _, tc := range []struct {
		name          string
		run           RunResult
		refused       float64 // NaN: not measured
		reflectedSeen bool
	}{
		{"kernel filter, spoofed", RunResult{Flood: flood("127.128.0.0/9"), Server: kernel}, 99.5, false},
		{"kernel filter, bound sockets", RunResult{Flood: flood(""), Server: kernel}, 99.5, true},
		{"nothing refused", RunResult{Flood: flood(""), Server: ServerStats{ModuleDelivered: 2e6}}, 0, true},
		{"plain Caddy", RunResult{Flood: flood("127.128.0.0/9"), Server: ServerStats{SocketDrops: 1e6}}, math.NaN(), false},
		{"userspace", RunResult{Flood: flood(""), Server: ServerStats{ModuleRefused: 1e6, ModuleDelivered: 1e3, Userspace: true}}, math.NaN(), true},
		{"no flood", RunResult{Server: kernel}, math.NaN(), false},
	} {
		f := figures(tc.run)
		got, ok := f[figKernelDrop]
		if math.IsNaN(tc.refused) && ok || !math.IsNaN(tc.refused) && (!ok || math.Abs(got-tc.refused) > 1e-9) {
			t.Errorf("%s: refused in the kernel %v (measured %v), want %v", tc.name, got, ok, tc.refused)
		}
		if _, ok := f[figReflected]; ok != tc.reflectedSeen {
			t.Errorf("%s: reflection measured %v, want %v", tc.name, ok, tc.reflectedSeen)
		}
	}
}

func TestGroupLabel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		width float64
		lines []string
	}{
		{"idle", 60, []string{"idle"}},
		{"spoofed-long-min", 200, []string{"spoofed-long-min"}},
		{"spoofed-long-min", 60, []string{"spoofed-", "long-min"}},
		{"spoofed-initial", 60, []string{"spoofed-", "initial"}},
		{"spread-1024", 60, []string{"spread-", "1024"}},
		{"transfers", 20, []string{"transfers"}}, // no hyphen: one line
	} {
		var lines []string
		d := xml.NewDecoder(strings.NewReader(groupLabel(100, 400, tc.name, tc.width)))
		for {
			tok, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if cd, ok := tok.(xml.CharData); ok && strings.TrimSpace(string(cd)) != "" {
				lines = append(lines, string(cd))
			}
		}
		if strings.Join(lines, "|") != strings.Join(tc.lines, "|") {
			t.Errorf("%s in %v: lines %q, want %q", tc.name, tc.width, lines, tc.lines)
		}
	}
}

func TestDeliveredPct(t *testing.T) {
	flood := &FloodResult{Kind: PacketIDShort, Sent: 1000}
	for _, tc := range []struct {
		name    string
		run     RunResult
		want    float64 // NaN: not measured
		drop    float64
		refused float64
	}{
		{"plain, nothing lost", RunResult{Flood: flood}, 100, 0, math.NaN()},
		{"kernel filter", RunResult{Flood: flood, Server: ServerStats{SocketDrops: 100, ModuleRefused: 90}}, 90, 10, 9},
		{"userspace", RunResult{Flood: flood, Server: ServerStats{SocketDrops: 100, ModuleRefused: 500, Userspace: true}}, 40, 10, 50},
		{"more lost than sent", RunResult{Flood: flood, Server: ServerStats{SocketDrops: 1200}}, 0, 120, math.NaN()},
		{"no flood", RunResult{Server: ServerStats{SocketDrops: 10}}, math.NaN(), math.NaN(), math.NaN()},
		{"nothing sent", RunResult{Flood: &FloodResult{}}, math.NaN(), math.NaN(), math.NaN()},
	} {
		f := figures(tc.run)
		refused, ok := f[figModuleRefused]
		if math.IsNaN(tc.refused) && ok || !math.IsNaN(tc.refused) && (!ok || math.Abs(refused-tc.refused) > 1e-9) {
			t.Errorf("%s: refused by the module %v (measured %v), want %v", tc.name, refused, ok, tc.refused)
		}
		got, ok := f[figFloodDelivery]
		if math.IsNaN(tc.want) && ok || !math.IsNaN(tc.want) && (!ok || math.Abs(got-tc.want) > 1e-9) {
			t.Errorf("%s: delivered %v (measured %v), want %v", tc.name, got, ok, tc.want)
		}
		drop, ok := f[figKernelDropped]
		if math.IsNaN(tc.drop) && ok || !math.IsNaN(tc.drop) && (!ok || math.Abs(drop-tc.drop) > 1e-9) {
			t.Errorf("%s: dropped in the kernel %v (measured %v), want %v", tc.name, drop, ok, tc.drop)
		}
	}
}

// TestAttackReport: the attack table of results.md, with CPU over idle's,
// the attacker's connection and the returning client.
func TestAttackReport(t *testing.T) {
	var scenarios []Scenario
	for _, s := range Scenarios() {
		if s.Name == "idle" || s.Name == "one-source" || s.Name == "id-spray-spoofed" || s.Name == "answered-reuse" {
			scenarios = append(scenarios, s)
		}
	}
	rep := &Report{Date: "2026-11-23T10:00:00Z", Command: []string{"rakebench"}, Settings: Settings{Reps: 1},
		Variants: builtinVariants(), Scenarios: scenarios}
	legit := func(ok int) *LegitStats {
		return &LegitStats{Attempted: 50, OK: ok, SuccessPct: 2 * float64(ok), P50Ms: ptr(3.0), P99Ms: ptr(9.0)}
	}
	for _, v := range []string{Plain, "rakelimit"} {
		rake := v != Plain
		cpu := map[bool]float64{false: 80, true: 40}[rake]
		spray := RunResult{Scenario: "id-spray-spoofed", Variant: v, Rep: 1, NewConn: legit(50), Established: legit(50), Attacker: legit(10),
			Flood:  &FloodResult{Kind: PacketIDShort, Sent: 2e6, Spoofed: "127.128.0.0/9", ServerID: "a1b2c3d4"},
			Server: ServerStats{CPUPct: cpu, SocketDrops: 5e5}}
		if rake {
			spray.Server.ModuleRefused, spray.Server.ModuleDelivered = 4e5, 1.6e6
		}
		reuse := RunResult{Scenario: "answered-reuse", Variant: v, Rep: 1, NewConn: legit(50), Established: legit(50), Returning: legit(25),
			Flood:  &FloodResult{Kind: PacketReuse, Sent: 1e6, WarmupSent: 900, Spoofed: "127.129.0.0/16"},
			Server: ServerStats{CPUPct: cpu / 2}}
		one := RunResult{Scenario: "one-source", Variant: v, Rep: 1, NewConn: legit(50), Established: legit(50),
			Flood: &FloodResult{Kind: PacketInitial, Sent: 1e6}, Server: ServerStats{CPUPct: cpu}}
		idle := RunResult{Scenario: "idle", Variant: v, Rep: 1, NewConn: legit(50), Established: legit(50), Server: ServerStats{CPUPct: 10}}
		rep.Runs = append(rep.Runs, idle, one, spray, reuse)
	}
	rep.Summary = summarizeRuns(rep.Runs, rep.Variants, rep.Scenarios)
	if f := summaryOf(rep, "id-spray-spoofed", "rakelimit").Figures[figCPUIdle]; f.Median == nil || *f.Median != 4 {
		t.Errorf("CPU over idle's: %+v", f)
	}
	if _, ok := summaryOf(rep, "idle", Plain).Figures[figCPUIdle]; ok {
		t.Error("idle has a CPU over idle's")
	}
	var md strings.Builder
	writeMarkdown(&md, rep)
	for _, want := range []string{
		"## Attacks on verification",
		"| id-spray-spoofed | plain | 2M | – | 75.0% | 25.0% | 80.0% | 8.00× | 100.0% | 100.0% | 20.0% | – |",
		"| id-spray-spoofed | rakelimit | 2M (1.00×) | 20.0% | 75.0% (1.00×) | 25.0% (1.00×) | 40.0% (0.50×) | 4.00× | 100.0% (1.00×) | 100.0% (1.00×) | 20.0% | – |",
		"| answered-reuse | rakelimit | 1M (1.00×) | – | 100.0% (1.00×) | 0.0% (–) | 20.0% (0.50×) | 2.00× | 100.0% (1.00×) | 100.0% (1.00×) | – | 50.0% |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("results.md lacks\n%s", want)
		}
	}
	if strings.Contains(md.String(), "| one-source | plain | 1M |") {
		t.Error("one-source, not an attack, is in the attack table")
	}
	if t.Failed() {
		t.Logf("results.md:\n%s", md.String())
	}
}

// TestProofsReport: the table of the attacks on proofs, with the proofs
// and unpaced attempts of the window, the bots, the path probes, the
// opening timeline and the returning client's kept connection.
func TestProofsReport(t *testing.T) {
	var scenarios []Scenario
	for _, s := range Scenarios() {
		if s.Name == "borrowed-proof" || s.Name == "proven-botnet" || s.Name == "returning-flooded-24" {
			scenarios = append(scenarios, s)
		}
	}
	rep := &Report{Date: "2026-11-29T10:00:00Z", Command: []string{"rakebench"}, Settings: Settings{Reps: 1},
		Variants: builtinVariants(), Scenarios: scenarios}
	legit := func(ok int) *LegitStats {
		return &LegitStats{Attempted: 50, OK: ok, SuccessPct: 2 * float64(ok), P50Ms: ptr(3.0), P99Ms: ptr(9.0)}
	}
	learned := func(kind string, v float64) Series {
		return Series{Metric: learnedMetric, Labels: map[string]string{"limiter": "default", "kind": kind}, Value: v}
	}
	for _, v := range []string{Plain, "rakelimit"} {
		rake := v != Plain
		borrowed := RunResult{Scenario: "borrowed-proof", Variant: v, Rep: 1, NewConn: legit(50), Established: legit(50), Attacker: legit(50),
			Flood:  &FloodResult{Kind: PacketShort, Sent: 1e6, WarmupSent: 1, Spoofed: "127.133.0.0/24"},
			Probes: &ProbeResult{Paths: 60, Datagrams: 61, Answers: 30}}
		total := 20000.0
		botnet := RunResult{Scenario: "proven-botnet", Variant: v, Rep: 1, NewConn: legit(49), Established: legit(50),
			Flood: &FloodResult{Kind: PacketInitial, Sent: 540000, Spoofed: "127.131.0.0/16"}, Bots: &BotsResult{Bots: 60},
			Stranger: legit(map[bool]int{false: 40, true: 48}[rake])}
		flooded := RunResult{Scenario: "returning-flooded-24", Variant: v, Rep: 1, NewConn: legit(50), Established: legit(50),
			Returning: legit(48), ReturningEstablished: legit(50), Flood: &FloodResult{Kind: PacketShortInitial, Sent: 2e6, Spoofed: "127.132.0.0/24"}}
		if rake {
			borrowed.Server = ServerStats{ModuleRefused: 990000, ModuleDelivered: 10000, Series: []Series{learned(unpacedKind, 0)}}
			botnet.Server = ServerStats{ModuleRefused: 340000, ModuleDelivered: 200000, Series: []Series{learned(proofsKind, 0), learned("credits", 9),
				{Metric: verifiedMetric, Labels: map[string]string{"how": "opening_from_peer"}, Value: 53000},
				{Metric: verifiedMetric, Labels: map[string]string{"how": "short_by_peer"}, Value: 1000},
				{Metric: verifiedMetric, Labels: map[string]string{"how": "from_answered"}, Value: 7}}}
			botnet.Bots.Proofs = ptr(60.0)
			botnet.Opening = &OpeningTimeline{Seconds: []OpeningSecond{{At: 1, TotalPPS: &total, PassedPPS: 19000, FromPeerPPS: 54000},
				{At: 2, TotalPPS: &total, PassedPPS: 20000, FromPeerPPS: 54000}}}
			flooded.Server = ServerStats{ModuleRefused: 1.9e6, ModuleDelivered: 1e5, Series: []Series{learned(proofsKind, 1)}}
		}
		rep.Runs = append(rep.Runs, borrowed, botnet, flooded)
	}
	rep.Summary = summarizeRuns(rep.Runs, rep.Variants, rep.Scenarios)
	var md strings.Builder
	writeMarkdown(&md, rep)
	for _, want := range []string{
		"## Proofs, credit and the opening total",
		"| borrowed-proof | plain | – | – | – | – | – | 60 (61, 30, 0) | – | – | – | – | – | – |",
		"| borrowed-proof | rakelimit | 0 | 0 | 0 | 99.0% | – | 60 (61, 30, 0) | – | – | – | – | – | – |",
		"| proven-botnet | plain | – | – | – | – | 60 (–) | – | – | – | – | – | – | 80.0% |",
		"| proven-botnet | rakelimit | 0 | 0 | 54k | 63.0% | 60 (60) | – | 20k | 20k | 1.00 | – | – | 96.0% (1.20×) |",
		"| returning-flooded-24 | rakelimit | 1 | 0 | 0 | 95.0% | – | – | – | – | – | 96.0% | 100.0% | – |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("results.md lacks\n%s", want)
		}
	}
	if t.Failed() {
		t.Logf("results.md:\n%s", md.String())
	}
}
