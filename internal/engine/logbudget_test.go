package engine

import (
	"testing"
	"time"
)

// TestLogBudget: logBurst lines of a window pass, the rest are counted by
// kind and summed up once the window is over, and a new window starts then.
func TestLogBudget(t *testing.T) {
	var b logBudget
	t0 := time.Unix(1000, 0)
	passed := 0
	for i := range 100 {
		kind := "opening"
		if i%2 == 0 {
			kind = "invalid_length"
		}
		if b.allow(t0.Add(time.Duration(i)*time.Millisecond), kind) {
			passed++
		}
	}
	if passed != logBurst {
		t.Fatalf("%d lines passed of 100 in one window, want %d", passed, logBurst)
	}
	if skipped, n := b.summary(t0.Add(logWindow / 2)); n != 0 || skipped != nil {
		t.Fatalf("a summary before the window is over: %v", skipped)
	}
	skipped, n := b.summary(t0.Add(logWindow))
	if n != 100-logBurst || skipped["opening"]+skipped["invalid_length"] != n || skipped["opening"] == 0 {
		t.Fatalf("summary %v (%d), want %d lines left out by kind", skipped, n, 100-logBurst)
	}
	if !b.allow(t0.Add(logWindow+time.Millisecond), "opening") {
		t.Fatal("the first line of the next window was left out")
	}
	if _, n := b.summary(t0.Add(3 * logWindow)); n != 0 {
		t.Fatalf("a summary of %d lines of a window that left none out", n)
	}
}
