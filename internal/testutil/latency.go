package testutil

import (
	"math"
	"slices"
	"time"
)

// Latency percentiles: the benchmark's reports and the integration tests
// compute them alike, so that "p99" means one thing in both.

// Percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It returns 0 for no values, and leaves ds as it was.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}
