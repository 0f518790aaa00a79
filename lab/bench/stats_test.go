//go:build linux

package bench

import (
	"math"
	"testing"
)

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
