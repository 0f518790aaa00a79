package engine

import (
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
)

// A flood from spoofed sources makes a new stream of invalid datagrams, or a
// new limited stream, of nearly every packet the kernel samples: one log line
// each would be thousands a second, and logging them would cost more than the
// flood. The lines about streams are budgeted: at most logBurst of each kind
// (starting, ending) per logWindow, and one summary line per kind for the
// rest, with their count by class and reason.
const (
	logWindow = 10 * time.Second
	logBurst  = 20
)

// logBudget counts the lines of one kind in the current window.
type logBudget struct {
	mu    sync.Mutex
	start time.Time
	lines int
	// skipped counts the lines left out, by class (and reason).
	skipped map[string]int
}

// allow reports whether a line about a stream of class what may be logged
// now; if not, it is counted for the summary.
func (b *logBudget) allow(now time.Time, what string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.start) >= logWindow && len(b.skipped) == 0 {
		b.start, b.lines = now, 0
	}
	if b.lines < logBurst {
		b.lines++
		return true
	}
	if b.skipped == nil {
		b.skipped = map[string]int{}
	}
	b.skipped[what]++
	return false
}

// summary returns, once the window is over, how many lines were left out
// by class and in all, and starts a new window.
func (b *logBudget) summary(now time.Time) (map[string]int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.start) < logWindow || len(b.skipped) == 0 {
		return nil, 0
	}
	skipped, n := b.skipped, 0
	for _, c := range skipped {
		n += c
	}
	b.start, b.lines, b.skipped = now, 0, nil
	return skipped, n
}

// logSummary logs the summary line of a budget whose window is over.
func (l *Limiter) logSummary(logger *zap.Logger, b *logBudget, msg string, listeners []string) {
	skipped, n := b.summary(time.Now())
	if n == 0 {
		return
	}
	kinds := make([]string, 0, len(skipped))
	for k := range skipped {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fields := []zap.Field{zap.String("limiter", l.name), zap.Strings("listeners", listeners), zap.Int("streams", n),
		zap.Duration("within", logWindow)}
	for _, k := range kinds {
		fields = append(fields, zap.Int(k, skipped[k]))
	}
	logger.Warn(msg, fields...)
}
