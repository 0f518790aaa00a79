package dashboard

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// deployed is the dashboard the project ships.
var deployed = filepath.Join("..", "..", "deploy", "grafana", "rakelimit.json")

// TestDeployedDashboardParses requires every query of the shipped dashboard
// to be in the subset: a query the rendering cannot evaluate fails here.
func TestDeployedDashboardParses(t *testing.T) {
	d, err := Load(deployed)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := d.Values(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if vals[RateInterval] != "4s" {
		t.Errorf("$__rate_interval = %q, want 4s for 1s scrapes", vals[RateInterval])
	}
	c, err := Compile(d, vals)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no queries", p.Title)
		}
		for j, q := range c.Queries[i] {
			n++
			if !strings.HasPrefix(q.Selector.Metric, "caddy_rakelimit_") {
				t.Errorf("panel %q: %q reads %s, not a rakelimit metric", p.Title, p.Targets[j].Expr, q.Selector.Metric)
			}
			if strings.Contains(p.Targets[j].Expr, "rate(") != (q.Window > 0) {
				t.Errorf("panel %q: %q parsed with window %v", p.Title, p.Targets[j].Expr, q.Window)
			}
		}
	}
	if !slices.Contains(c.Metrics(), "caddy_rakelimit_packets_total") {
		t.Errorf("metrics %v: no caddy_rakelimit_packets_total", c.Metrics())
	}
	t.Logf("%d panels, %d queries, metrics %v", len(d.Panels), n, c.Metrics())
}

func TestParseExpr(t *testing.T) {
	vals := map[string]string{"limiter": ".*", RateInterval: "4s"}
	good := []struct {
		expr   string
		agg    string
		by     []string
		window time.Duration
		metric string
		nm     int
		cmp    string
	}{
		{`m`, "", nil, 0, "m", 0, ""},
		{`m{}`, "", nil, 0, "m", 0, ""},
		{`m{a="x", b!="y", c=~"p|q", d!~'z'}`, "", nil, 0, "m", 4, ""},
		{`rate(m{a="x"}[1m])`, "", nil, time.Minute, "m", 1, ""},
		{`sum by (a, b) (rate(m{l=~"$limiter"}[$__rate_interval]))`, "sum", []string{"a", "b"}, 4 * time.Second, "m", 1, ""},
		{`max by (a) (m)`, "max", []string{"a"}, 0, "m", 0, ""},
		{`min by(a)(m{x="1"})`, "min", []string{"a"}, 0, "m", 1, ""},
		{`m{l=~"${limiter}"} == 1`, "", nil, 0, "m", 1, "=="},
		{`m >= 0.5`, "", nil, 0, "m", 0, ">="},
	}
	for _, tc := range good {
		e, err := ParseExpr(tc.expr, vals)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if e.Agg != tc.agg || !slices.Equal(e.By, tc.by) || e.Window != tc.window || e.Selector.Metric != tc.metric ||
			len(e.Selector.Matchers) != tc.nm || e.Cmp != tc.cmp {
			t.Errorf("%s: parsed %+v", tc.expr, e)
		}
	}
	bad := []struct{ expr, want string }{
		{`increase(m[1m])`, "unsupported function"},
		{`avg by (a) (m)`, "unsupported function"},
		{`sum(m)`, "want by"},
		{`sum without (a) (m)`, "want by"},
		{`m + 1`, "unsupported character"},
		{`m{a="x"} * 2`, "unsupported character"},
		{`rate(m[5m] offset 1m)`, `want ")"`},
		{`m{a=~"$nope"}`, "unknown variable $nope"},
		{`m{a=~"("}`, "missing closing"},
		{`m{a="x}`, "unterminated string"},
		{`rate(m)`, "want a range"},
		{`rate(m[0s])`, "above 0"},
		{`m{a}`, "want =, !=, =~ or !~"},
		{`m == x`, "want a number"},
		{`m m`, "unsupported"},
		{``, "want a metric"},
	}
	for _, tc := range bad {
		_, err := ParseExpr(tc.expr, vals)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.expr, err, tc.want)
		}
	}
}

// exposition writes a Prometheus text exposition: a counter family with
// the given series (labels -> value), a gauge and a histogram.
func exposition(counters map[string]float64, gauges map[string]float64) string {
	var b strings.Builder
	b.WriteString("# TYPE c_total counter\n")
	for _, k := range sortedKeys(counters) {
		fmt.Fprintf(&b, "c_total{%s} %v\n", k, counters[k])
	}
	b.WriteString("# TYPE g gauge\n")
	for _, k := range sortedKeys(gauges) {
		fmt.Fprintf(&b, "g{%s} %v\n", k, gauges[k])
	}
	b.WriteString("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 3\n")
	return b.String()
}

// scrapes returns five scrapes one second apart: series a grows by 10 a
// second, b by 5, d by 100 with a reset at the fourth scrape; gauge g is 1
// for listener x and 0 for y.
func scrapes(t *testing.T) []Scrape {
	t.Helper()
	t0 := time.Unix(1_000_000, 0)
	d := []float64{0, 100, 200, 50, 150}
	var out []Scrape
	for i := range 5 {
		text := exposition(map[string]float64{
			`class="opening",verdict="passed",limiter="a",listener="x"`:  float64(10 * i),
			`class="opening",verdict="passed",limiter="b",listener="y"`:  float64(5 * i),
			`class="opening",verdict="dropped",limiter="a",listener="x"`: d[i],
		}, map[string]float64{`listener="x",mode="bpf"`: 1, `listener="y",mode="userspace"`: 0})
		s, err := ParseScrape(t0.Add(time.Duration(i)*time.Second), strings.NewReader(text), nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func TestParseScrape(t *testing.T) {
	s := scrapes(t)[1]
	var names []string
	for _, x := range s.Samples {
		names = append(names, x.Metric)
	}
	if got, want := len(s.Samples), 5; got != want || slices.Contains(names, "h") || slices.Contains(names, "h_bucket") {
		t.Errorf("samples %v: want %d, counters and gauges only", names, want)
	}
	kept, err := ParseScrape(s.At, strings.NewReader(exposition(map[string]float64{`a="1"`: 1}, map[string]float64{`a="1"`: 2})),
		func(m string) bool { return m == "g" })
	if err != nil {
		t.Fatal(err)
	}
	if len(kept.Samples) != 1 || kept.Samples[0].Metric != "g" || kept.Samples[0].Value != 2 || kept.Samples[0].Labels["a"] != "1" {
		t.Errorf("kept %+v, want g{a=\"1\"} 2 alone", kept.Samples)
	}
	if _, err := ParseScrape(s.At, strings.NewReader("c_total{ 1\n"), nil); err == nil {
		t.Error("a broken exposition parsed")
	}
}

func TestEvaluate(t *testing.T) {
	sc := scrapes(t)
	cases := []struct {
		expr string
		at   int
		want map[string]float64 // labelKey -> value
	}{
		{`rate(c_total{limiter="a", verdict="passed"}[4s])`, 4,
			map[string]float64{labelKey(map[string]string{"class": "opening", "verdict": "passed", "limiter": "a", "listener": "x"}): 10}},
		// One sample in the range: no rate yet.
		{`rate(c_total[4s])`, 0, map[string]float64{}},
		{`sum by (class, verdict) (rate(c_total[4s]))`, 2, map[string]float64{
			`class="opening",verdict="passed",`:  15,
			`class="opening",verdict="dropped",`: 100,
		}},
		// The reset: 100 -> 200 -> 50 -> 150 in (t0, t4] is 100+50+100 over 3 s.
		{`sum by (verdict) (rate(c_total{verdict="dropped"}[4s]))`, 4, map[string]float64{`verdict="dropped",`: 250.0 / 3}},
		// A 2s range at t4 holds t3 and t4 only.
		{`sum by (verdict) (rate(c_total{verdict="dropped"}[2s]))`, 4, map[string]float64{`verdict="dropped",`: 100}},
		{`sum by (limiter) (rate(c_total{limiter=~"a|b", verdict!="dropped"}[4s]))`, 4, map[string]float64{
			`limiter="a",`: 10, `limiter="b",`: 5,
		}},
		{`sum by (limiter) (rate(c_total{limiter!~"a"}[4s]))`, 4, map[string]float64{`limiter="b",`: 5}},
		// A label no series has groups everything under the empty set.
		{`sum by (nope) (c_total{verdict="passed"})`, 2, map[string]float64{``: 30}},
		{`max by (class) (c_total)`, 2, map[string]float64{`class="opening",`: 200}},
		{`min by (class) (c_total)`, 2, map[string]float64{`class="opening",`: 10}},
		{`g == 1`, 0, map[string]float64{`listener="x",mode="bpf",`: 1}},
		{`g{mode=~".*"} < 1`, 0, map[string]float64{`listener="y",mode="userspace",`: 0}},
		{`g{mode="none"}`, 0, map[string]float64{}},
	}
	for _, tc := range cases {
		e, err := ParseExpr(tc.expr, nil)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		got := map[string]float64{}
		for k, s := range e.Instant(sc, tc.at) {
			if k != labelKey(s.Labels) {
				t.Errorf("%s: key %q for labels %v", tc.expr, k, s.Labels)
			}
			got[k] = s.Value
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s at %d: got %v, want %v", tc.expr, tc.at, got, tc.want)
			continue
		}
		for k, v := range tc.want {
			if g, ok := got[k]; !ok || math.Abs(g-v) > 1e-9 {
				t.Errorf("%s at %d: %s = %v (present %v), want %v", tc.expr, tc.at, k, g, ok, v)
			}
		}
	}
}

func TestRange(t *testing.T) {
	sc := scrapes(t)
	e, err := ParseExpr(`sum by (limiter) (rate(c_total{verdict="passed"}[4s]))`, nil)
	if err != nil {
		t.Fatal(err)
	}
	series := e.Range(sc)
	if len(series) != 2 || series[0].Labels["limiter"] != "a" || series[1].Labels["limiter"] != "b" {
		t.Fatalf("series %+v: want a then b", series)
	}
	// The first scrape has no rate: four points each, at scrapes 1 to 4.
	for _, s := range series {
		if len(s.Points) != 4 || !s.Points[0].T.Equal(sc[1].At) || !s.Points[3].T.Equal(sc[4].At) {
			t.Errorf("%v: points %+v, want scrapes 1 to 4", s.Labels, s.Points)
		}
	}
}

func TestFormatLegend(t *testing.T) {
	labels := map[string]string{"class": "opening", "level": "3"}
	for _, tc := range []struct{ format, want string }{
		{"{{class}} level {{ level }}", "opening level 3"},
		{"{{missing}}x", "x"},
		{"", `{class="opening", level="3"}`},
		{"__auto", `{class="opening", level="3"}`},
	} {
		if got := FormatLegend(tc.format, labels); got != tc.want {
			t.Errorf("FormatLegend(%q) = %q, want %q", tc.format, got, tc.want)
		}
	}
}

func TestParseAndValuesErrors(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"panels": []}`, "no panels"},
		{`{"panels": [{"type": "table", "title": "T", "gridPos": {"w": 1, "h": 1}}]}`, `type "table"`},
		{`{"panels": [{"type": "stat", "title": "T", "gridPos": {"x": 20, "w": 8, "h": 1}}]}`, "within 24 columns"},
		{`{"panels": [`, "parsing the dashboard"},
	} {
		if _, err := Parse([]byte(tc.json)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.json, err, tc.want)
		}
	}
	panel := `"panels": [{"type": "stat", "title": "T", "gridPos": {"w": 1, "h": 1}}]`
	for _, tc := range []struct{ vars, want string }{
		{`{"name": "v", "type": "query", "includeAll": true}`, "variable v: no allValue"},
		{`{"name": "v", "type": "interval"}`, `variable v: type "interval"`},
	} {
		d, err := Parse([]byte(`{` + panel + `, "templating": {"list": [` + tc.vars + `]}}`))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Values(time.Second); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.vars, err, tc.want)
		}
	}
}

// TestRender draws the shipped dashboard over hand-written scrapes of its
// own metrics and checks the page: well-formed, every panel's title, the
// legends, the flood's span, and "No data" where nothing matched.
func TestRender(t *testing.T) {
	d, err := Load(deployed)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := d.Values(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compile(d, vals)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(2_000_000, 0)
	var sc []Scrape
	for i := range 20 {
		flood := 0
		if i >= 5 && i < 15 {
			flood = 50_000 * (i - 4)
		}
		text := fmt.Sprintf(`# TYPE caddy_rakelimit_packets_total counter
caddy_rakelimit_packets_total{limiter="l0",listener="udp/:443",family="ipv6",class="opening",verdict="passed",level="0"} %d
caddy_rakelimit_packets_total{limiter="l0",listener="udp/:443",family="ipv6",class="opening",verdict="dropped",level="2"} %d
# TYPE caddy_rakelimit_mode gauge
caddy_rakelimit_mode{limiter="l0",listener="udp/:443",mode="bpf"} 1
caddy_rakelimit_mode{limiter="l0",listener="udp/:443",mode="userspace"} 0
# TYPE caddy_rakelimit_opening_total_per_second gauge
caddy_rakelimit_opening_total_per_second{limiter="l0",adaptive="false"} +Inf
# TYPE caddy_rakelimit_receive_queue_fill_ratio gauge
caddy_rakelimit_receive_queue_fill_ratio{limiter="l0"} NaN
# TYPE caddy_rakelimit_limited_streams gauge
caddy_rakelimit_limited_streams{limiter="l0"} %d
`, 25*i, flood, min(flood, 1))
		s, err := ParseScrape(t0.Add(time.Duration(i)*time.Second), strings.NewReader(text), nil)
		if err != nil {
			t.Fatal(err)
		}
		sc = append(sc, s)
	}
	data := c.Evaluate(sc)
	svg := Render(data, Page{Title: "rakelimit & co", Subtitle: "test", Interval: time.Second,
		Spans: []Span{{From: t0.Add(5 * time.Second), To: t0.Add(15 * time.Second), Label: "flood <one-source>"}}})

	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
	}
	for _, p := range d.Panels {
		if !strings.Contains(svg, ">"+strings.ReplaceAll(p.Title, "&", "&amp;")) {
			t.Errorf("no title %q", p.Title)
		}
	}
	for _, want := range []string{"rakelimit &amp; co", "opening passed", "opening dropped", "opening level 2",
		"l0 cap (adaptive false) (+Inf, not drawn)", "l0 (NaN, not drawn)",
		"udp/:443 bpf", "flood &lt;one-source&gt;", "No data"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG has no %q", want)
		}
	}
	if strings.Contains(svg, "udp/:443 userspace") {
		t.Error(`"Mode per listener" shows the mode at 0: == 1 did not filter`)
	}
	nodata := 0
	for _, p := range data {
		if len(p.Series) == 0 {
			nodata++
		}
	}
	if got := strings.Count(svg, "No data"); got != nodata || nodata == 0 {
		t.Errorf("%d panels say No data, %d have no series", got, nodata)
	}
}

func TestLayoutLegend(t *testing.T) {
	var series []Line
	for i := range 30 {
		series = append(series, Line{Legend: fmt.Sprintf("series number %d", i)})
	}
	items, lines := layoutLegend(series, 0, 0, 400, 2)
	if lines != 2 {
		t.Errorf("%d lines, want 2", lines)
	}
	last := items[len(items)-1]
	if want := fmt.Sprintf("+%d more", len(series)-len(items)+1); last.label != want {
		t.Errorf("last entry %q, want %q", last.label, want)
	}
	for _, it := range items {
		if it.x+24+6.6*float64(len(it.label)) > 400+1e-9 || it.y > legendLine {
			t.Errorf("entry %+v outside 400 x 2 lines", it)
		}
	}
	if items, lines := layoutLegend(series[:2], 0, 0, 400, 3); len(items) != 2 || lines != 1 {
		t.Errorf("two short entries: %d items on %d lines, want 2 on 1", len(items), lines)
	}
}

func TestPanelOptions(t *testing.T) {
	d, err := Parse([]byte(`{"panels": [
		{"type": "timeseries", "title": "L", "gridPos": {"w": 12, "h": 8},
		 "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "log", "log": 10}}}}},
		{"type": "stat", "title": "S", "gridPos": {"x": 12, "w": 12, "h": 8},
		 "fieldConfig": {"defaults": {"thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": null}, {"color": "red", "value": 1}]}}},
		 "options": {"textMode": "name", "colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}}},
		{"type": "stat", "title": "D", "gridPos": {"y": 8, "w": 12, "h": 8}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	l, s, def := d.Panels[0], d.Panels[1], d.Panels[2]
	if !l.Log || s.Log || s.TextMode != "name" || s.ColorMode != "background" {
		t.Errorf("panels %+v", d.Panels)
	}
	if len(s.Thresholds) != 2 || !math.IsInf(s.Thresholds[0].Value, -1) || s.Thresholds[1] != (Threshold{1, "red"}) {
		t.Errorf("thresholds %+v", s.Thresholds)
	}
	if !slices.Equal(def.Thresholds, defaultThresholds) {
		t.Errorf("default thresholds %+v, want Grafana's %+v", def.Thresholds, defaultThresholds)
	}
	for _, tc := range []struct{ panel, want string }{
		{`"fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "symlog"}}}}`, `scaleDistribution "symlog"`},
		{`"fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "log", "log": 2}}}}`, "want base 10"},
		{`"fieldConfig": {"defaults": {"thresholds": {"mode": "percentage", "steps": [{"color": "red", "value": null}]}}}`, `mode "percentage"`},
		{`"fieldConfig": {"defaults": {"thresholds": {"steps": [{"color": "red", "value": null}, {"color": "x", "value": null}]}}}`, "step 1"},
		{`"fieldConfig": {"defaults": {"thresholds": {"steps": []}}}`, "no steps"},
		{`"options": {"textMode": "big"}`, `textMode "big"`},
		{`"options": {"colorMode": "gradient"}`, `colorMode "gradient"`},
		{`"options": {"reduceOptions": {"calcs": ["mean"]}}`, `calcs "mean"`},
	} {
		_, err := Parse([]byte(`{"panels": [{"type": "stat", "title": "T", "gridPos": {"w": 1, "h": 1}, ` + tc.panel + `}]}`))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `panel "T"`) {
			t.Errorf("%s: error %v, want one naming the panel and containing %q", tc.panel, err, tc.want)
		}
	}
}

// TestRenderLogAndStat draws a log-scale panel whose series falls to zero
// (a gap, as in Grafana) and stat panels coloured by their thresholds.
func TestRenderLogAndStat(t *testing.T) {
	t0 := time.Unix(3_000_000, 0)
	line := func(vs ...float64) []Point {
		var out []Point
		for i, v := range vs {
			out = append(out, Point{T: t0.Add(time.Duration(i) * time.Second), V: v})
		}
		return out
	}
	steps := []Threshold{{math.Inf(-1), "green"}, {1, "red"}}
	data := []PanelData{
		{Panel: Panel{Title: "Log", Type: TimeSeries, Log: true, W: 24, H: 8},
			Series: []Line{{Legend: "flood", Points: line(10, 1e5, 0, 0, 1e5)}}},
		{Panel: Panel{Title: "Names", Type: Stat, Y: 8, W: 12, H: 6, TextMode: "name", ColorMode: "background", Thresholds: steps},
			Series: []Line{{Legend: "ok-name", Points: line(0, 0)}, {Legend: "bad-name", Points: line(0, 3, math.NaN())}}},
		{Panel: Panel{Title: "Values", Type: Stat, X: 12, Y: 8, W: 12, H: 6, ColorMode: "value", Thresholds: steps},
			Series: []Line{{Legend: "one", Points: line(7)}}},
	}
	svg := Render(data, Page{Title: "t", Interval: time.Second})
	if !strings.Contains(svg, "log scale") || !strings.Contains(svg, ">100k<") {
		t.Error("no log axis up to 100k")
	}
	// Two runs of the series: 10, 100k, then (gap at the zeros) 100k.
	if got := strings.Count(pathOf(t, svg, "flood"), "M"); got != 2 {
		t.Errorf("the flood's path has %d moves, want 2 (a gap at the zeros)", got)
	}
	for _, want := range []string{
		`fill="#73BF69"/>`, // ok-name's tile, 0: green
		`fill="#F2495C"/>`, // bad-name's tile, 3 (NaN after it skipped): red
		`fill="white">ok-name`, `fill="white">bad-name`,
		`fill="#F2495C">7<`, // a value coloured, the name left out (one series)
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG has no %q", want)
		}
	}
	if strings.Contains(svg, ">one<") || strings.Contains(svg, "white\">0<") {
		t.Error("a name or value shown against the panel's textMode")
	}
}

// pathOf returns the d attribute of the path whose title starts with legend.
func pathOf(t *testing.T, svg, legend string) string {
	t.Helper()
	i := strings.Index(svg, "<title>"+legend+":")
	j := strings.LastIndex(svg[:max(i, 0)], `<path d="`)
	if i < 0 || j < 0 {
		t.Fatalf("no path for %q", legend)
	}
	d := svg[j+len(`<path d="`):]
	return d[:strings.IndexByte(d, '"')]
}
