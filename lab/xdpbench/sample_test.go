//go:build linux

package xdpbench

import "testing"

// TestParseCounts: the limiter's verdicts summed over every label, the
// dropped and invalid ones against the passed and limited ones; other
// metrics and verdicts left out.
func TestParseCounts(t *testing.T) {
	for _, c := range []struct {
		name, in        string
		dropped, passed uint64
		err             bool
	}{
		{name: "verdicts", in: `# HELP caddy_rakelimit_packets_total Datagrams by verdict.
# TYPE caddy_rakelimit_packets_total counter
caddy_rakelimit_packets_total{level="0",limiter="default",verdict="dropped"} 1.5e+06
caddy_rakelimit_packets_total{level="2",limiter="default",verdict="dropped"} 250
caddy_rakelimit_packets_total{class="short",limiter="default",verdict="invalid"} 7
caddy_rakelimit_packets_total{limiter="default",verdict="passed"} 1000
caddy_rakelimit_packets_total{limiter="default",verdict="limited"} 20
caddy_rakelimit_packets_total{limiter="default",verdict="allowlisted"} 99
caddy_rakelimit_mode{mode="xdp"} 1
`, dropped: 1_500_257, passed: 1020},
		{name: "none", in: "caddy_rakelimit_mode{mode=\"bpf\"} 1\n"},
		{name: "a bad value", in: `caddy_rakelimit_packets_total{verdict="dropped"} many` + "\n", err: true},
	} {
		dropped, passed, err := ParseCounts([]byte(c.in))
		if (err != nil) != c.err || dropped != c.dropped || passed != c.passed {
			t.Errorf("%s: dropped %d, passed %d, %v; want %d, %d, error %v", c.name, dropped, passed, err, c.dropped, c.passed, c.err)
		}
	}
}
