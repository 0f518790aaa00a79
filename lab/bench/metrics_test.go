//go:build linux

package bench

import (
	"strings"
	"testing"
)

// Today's exposition: verdicts by family and level, one listener.
const metricsBefore = `# HELP caddy_rakelimit_packets_total Packets the filter saw.
# TYPE caddy_rakelimit_packets_total counter
caddy_rakelimit_packets_total{family="ipv4",level="",limiter="default",listener="[::]:8443",verdict="passed"} 100
caddy_rakelimit_packets_total{family="ipv6",level="",limiter="default",listener="[::]:8443",verdict="passed"} 5
caddy_rakelimit_packets_total{family="ipv4",level="0",limiter="default",listener="[::]:8443",verdict="dropped"} 10
caddy_rakelimit_packets_total{family="ipv4",level="0",limiter="default",listener="[::]:8443",verdict="limited"} 0
# HELP caddy_rakelimit_limit_packets_per_second Limits.
# TYPE caddy_rakelimit_limit_packets_per_second gauge
caddy_rakelimit_limit_packets_per_second{level="0",limiter="default"} 1000
# HELP caddy_http_requests_total Not ours.
# TYPE caddy_http_requests_total counter
caddy_http_requests_total{server="srv0"} 7
`

// A later exposition with labels and a metric the module may grow: a class
// label, an invalid verdict and reasons.
const metricsAfter = `# HELP caddy_rakelimit_packets_total Packets the filter saw.
# TYPE caddy_rakelimit_packets_total counter
caddy_rakelimit_packets_total{class="established",family="ipv4",level="",limiter="default",listener="[::]:8443",verdict="passed"} 150
caddy_rakelimit_packets_total{class="opening",family="ipv6",level="",limiter="default",listener="[::]:8443",verdict="passed"} 5
caddy_rakelimit_packets_total{class="opening",family="ipv4",level="0",limiter="default",listener="[::]:8443",verdict="dropped"} 1010
caddy_rakelimit_packets_total{class="opening",family="ipv6",level="2",limiter="default",listener="[::]:8443",verdict="dropped"} 300
caddy_rakelimit_packets_total{class="opening",family="ipv4",level="0",limiter="default",listener="[::]:8443",verdict="limited"} 40
caddy_rakelimit_packets_total{class="invalid",family="ipv4",level="",limiter="default",listener="[::]:8443",verdict="invalid"} 70
# HELP caddy_rakelimit_invalid_packets_total Invalid packets by reason.
# TYPE caddy_rakelimit_invalid_packets_total counter
caddy_rakelimit_invalid_packets_total{family="ipv4",limiter="default",listener="[::]:8443",reason="fixed_bit"} 30
caddy_rakelimit_invalid_packets_total{family="ipv6",limiter="default",listener="[::]:8443",reason="fixed_bit"} 10
caddy_rakelimit_invalid_packets_total{family="ipv4",limiter="default",listener="[::]:8443",reason="cid_length"} 30
# HELP caddy_rakelimit_limit_packets_per_second Limits.
# TYPE caddy_rakelimit_limit_packets_per_second gauge
caddy_rakelimit_limit_packets_per_second{level="0",limiter="default"} 1000
`

func TestParseCounters(t *testing.T) {
	before, err := parseCounters(strings.NewReader(metricsBefore))
	if err != nil {
		t.Fatal(err)
	}
	// Families summed, gauges and other metrics left out.
	if len(before) != 3 {
		t.Fatalf("before: %d series, want 3: %v", len(before), before)
	}
	passed := Series{Metric: packetsMetric, Labels: map[string]string{"level": "", "limiter": "default", "verdict": "passed"}}
	if got := before[passed.key()].Value; got != 105 {
		t.Errorf("passed summed over families = %v, want 105", got)
	}
	after, err := parseCounters(strings.NewReader(metricsAfter))
	if err != nil {
		t.Fatal(err)
	}
	delta := after.delta(before)
	got := map[string]float64{}
	for _, s := range delta {
		if _, ok := s.Labels["family"]; ok {
			t.Errorf("family label kept: %v", s)
		}
		got[s.key()] = s.Value
	}
	// The class label makes new series: their deltas are from zero. Series
	// gone from the second scrape are left out, not made negative.
	want := map[string]float64{
		Series{Metric: packetsMetric, Labels: map[string]string{"class": "established", "level": "", "limiter": "default", "verdict": "passed"}}.key(): 150,
		Series{Metric: packetsMetric, Labels: map[string]string{"class": "opening", "level": "", "limiter": "default", "verdict": "passed"}}.key():     5,
		Series{Metric: packetsMetric, Labels: map[string]string{"class": "opening", "level": "0", "limiter": "default", "verdict": "dropped"}}.key():   1010,
		Series{Metric: packetsMetric, Labels: map[string]string{"class": "opening", "level": "2", "limiter": "default", "verdict": "dropped"}}.key():   300,
		Series{Metric: packetsMetric, Labels: map[string]string{"class": "opening", "level": "0", "limiter": "default", "verdict": "limited"}}.key():   40,
		Series{Metric: packetsMetric, Labels: map[string]string{"class": "invalid", "level": "", "limiter": "default", "verdict": "invalid"}}.key():    70,
		Series{Metric: modulePrefix + "invalid_packets_total", Labels: map[string]string{"limiter": "default", "reason": "fixed_bit"}}.key():           40,
		Series{Metric: modulePrefix + "invalid_packets_total", Labels: map[string]string{"limiter": "default", "reason": "cid_length"}}.key():          30,
	}
	if len(got) != len(want) {
		t.Errorf("%d series, want %d: %v", len(got), len(want), delta)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q: %v, want %v", strings.ReplaceAll(k, "\x00", " "), got[k], v)
		}
	}
}

func TestParseCountersBadInput(t *testing.T) {
	if _, err := parseCounters(strings.NewReader("caddy_rakelimit_packets_total{verdict=\"passed\" 1\n")); err == nil ||
		!strings.Contains(err.Error(), "parsing metrics") {
		t.Fatalf("err = %v", err)
	}
}

func TestInUserspace(t *testing.T) {
	const header = "# HELP caddy_rakelimit_mode Mode.\n# TYPE caddy_rakelimit_mode gauge\n"
	for _, tc := range []struct {
		name, exposition string
		want             bool
	}{
		{"no module", "# TYPE caddy_http_requests_total counter\ncaddy_http_requests_total 3\n", false},
		{"bpf", header + `caddy_rakelimit_mode{limiter="default",listener="[::]:8443",mode="bpf"} 1` + "\n", false},
		{"userspace", header + `caddy_rakelimit_mode{limiter="default",listener="[::]:8443",mode="userspace"} 1` + "\n", true},
		{"userspace at 0", header + `caddy_rakelimit_mode{limiter="default",listener="[::]:8443",mode="userspace"} 0` + "\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := inUserspace(strings.NewReader(tc.exposition))
			if err != nil || got != tc.want {
				t.Fatalf("inUserspace = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := inUserspace(strings.NewReader("caddy_rakelimit_mode{mode=\"bpf\" 1\n")); err == nil {
		t.Fatal("a broken exposition parsed")
	}
}

func TestSummarize(t *testing.T) {
	after, err := parseCounters(strings.NewReader(metricsAfter))
	if err != nil {
		t.Fatal(err)
	}
	groups := summarize(after.delta(counters{}))
	var names []string
	for _, g := range groups {
		names = append(names, g.Name)
	}
	// Verdicts by total, then the other counters.
	if strings.Join(names, ",") != "dropped,passed,invalid,limited,invalid_packets" {
		t.Fatalf("groups %v", names)
	}
	dropped := groups[0]
	if !dropped.Verdict || dropped.Total != 1310 || dropped.By["level"]["0"] != 1010 || dropped.By["level"]["2"] != 300 ||
		dropped.By["class"]["opening"] != 1310 {
		t.Errorf("dropped %+v", dropped)
	}
	if g := groups[4]; g.Verdict || g.Total != 70 || g.By["reason"]["fixed_bit"] != 40 {
		t.Errorf("invalid_packets %+v", g)
	}
	if _, ok := groups[1].By["level"]; ok {
		t.Errorf("empty level values kept: %+v", groups[1])
	}
	refused, delivered := refusedDelivered(groups)
	if refused != 1380 || delivered != 195 {
		t.Errorf("refused %v, delivered %v; want 1380 (dropped + invalid), 195", refused, delivered)
	}
	desc := describeGroups(groups)
	for _, want := range []string{
		"dropped 1310 (class opening 1310, level 0 1010, level 2 300)",
		"invalid_packets 70 (reason fixed_bit 40, reason cid_length 30)",
		"passed 155 (class established 150, class opening 5)",
	} {
		if !strings.Contains(desc, want) {
			t.Errorf("description lacks %q:\n%s", want, desc)
		}
	}
	if strings.Contains(desc, "limiter") {
		t.Errorf("a single limiter is named: %s", desc)
	}
	if describeGroups(nil) != "–" {
		t.Errorf("empty description %q", describeGroups(nil))
	}
}

func TestCount(t *testing.T) {
	for _, tt := range []struct {
		in   float64
		want string
	}{{0, "0"}, {987, "987"}, {9999, "9999"}, {12345, "12.3k"}, {4.56e6, "4.56M"}, {2e9, "2G"}} {
		if got := count(tt.in); got != tt.want {
			t.Errorf("count(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
