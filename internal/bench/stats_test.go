//go:build linux

package bench

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		var out []time.Duration
		for _, v := range vs {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(100-i) * time.Millisecond // unsorted on purpose
	}
	tests := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"p50 of four", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p99 of four is the max", ms(4, 1, 3, 2), 99, 4 * time.Millisecond},
		{"p50 of 100", hundred, 50, 50 * time.Millisecond},
		{"p99 of 100", hundred, 99, 99 * time.Millisecond},
		{"p100", hundred, 100, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := percentile(tt.in, tt.p); got != tt.want {
			t.Errorf("%s: percentile(%v) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
	if hundred[0] != 100*time.Millisecond {
		t.Error("percentile sorted its input")
	}
}

func TestMedianRatio(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{nan, 5, 1}, 3}, {[]float64{nan}, nan}, {nil, nan},
	}
	for _, tt := range tests {
		got := median(tt.in)
		if got != tt.want && !(math.IsNaN(got) && math.IsNaN(tt.want)) {
			t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if r := ratio(3, 2); r != 1.5 {
		t.Errorf("ratio(3, 2) = %v", r)
	}
	for _, c := range [][2]float64{{1, 0}, {nan, 1}, {1, nan}} {
		if r := ratio(c[0], c[1]); !math.IsNaN(r) {
			t.Errorf("ratio(%v, %v) = %v, want NaN", c[0], c[1], r)
		}
	}
	if finite(nan) != nil || finite(math.Inf(1)) != nil || *finite(2) != 2 {
		t.Error("finite")
	}
}
