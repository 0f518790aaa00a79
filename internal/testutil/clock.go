package testutil

import (
	"sync/atomic"
	"time"
)

// Clock is a monotonic clock a test moves by hand, safe for concurrent use;
// Now reads it in nanoseconds.
type Clock struct{ ns atomic.Int64 }

// Now returns the time in nanoseconds.
func (c *Clock) Now() int64 { return c.ns.Load() }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
