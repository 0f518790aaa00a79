//go:build linux

package bench

import (
	"math"
	"slices"
)

// median returns the median of the values that are not NaN (the mean of the
// middle two for an even count), or NaN when there are none.
func median(vs []float64) float64 {
	s := slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ratio is v / ref, NaN when either is missing or ref is 0.
func ratio(v, ref float64) float64 {
	if math.IsNaN(v) || math.IsNaN(ref) || ref == 0 {
		return math.NaN()
	}
	return v / ref
}

// orNaN dereferences p, NaN for nil.
func orNaN(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// finite returns a pointer to v, nil for NaN or an infinity (which JSON
// cannot hold).
func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}
