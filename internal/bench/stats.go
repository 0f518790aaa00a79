//go:build linux

package bench

import (
	"math"
	"slices"
	"time"
)

// percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It returns 0 for no values.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

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
