package decide

import (
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// TestWithTotals: the totals an unset level limit leaves are adaptive when
// classifying, the opening one from DefaultOpeningTotal (within the
// counters' burst, at least the limit), the established one lifted; a total
// that is set stays as set; and each adaptive total starts where
// TotalStart says.
func TestWithTotals(t *testing.T) {
	const top = 3 // the default prefixes' last level
	tests := []struct {
		name                  string
		classify              bool
		limit                 uint32
		window                time.Duration
		opening, established  map[int]uint32
		wantOpening, wantEst  uint32
		adaptive, adaptiveEst bool
		start                 uint32
	}{
		{"defaults", true, 1000, time.Second, nil, nil, DefaultOpeningTotal, sketch.Unlimited, true, true, DefaultOpeningTotal},
		{"a limit above the default", true, 50_000, time.Second, nil, nil, 50_000, sketch.Unlimited, true, true, 50_000},
		{"a window too long for the default", true, 100, time.Hour, nil, nil, sketch.MaxBurst / 3600, sketch.Unlimited, true, true, sketch.MaxBurst / 3600},
		{"totals set", true, 1000, time.Second, map[int]uint32{top: 5000}, map[int]uint32{top: 9000}, 5000, 9000, false, false, 5000},
		{"opening total lifted", true, 1000, time.Second, map[int]uint32{top: sketch.Unlimited}, nil, sketch.Unlimited, sketch.Unlimited, false, true, 0},
		{"without classes", false, 1000, time.Second, nil, nil, 0, sketch.Unlimited, false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := WithTotals(Config{Classify: tt.classify, Limiter: sketch.Config{Limit: tt.limit, Window: tt.window,
				LevelLimits: tt.opening, Established: sketch.Limits{Limit: tt.limit, LevelLimits: tt.established}}})
			if got := c.Limiter.LevelLimits[top]; got != tt.wantOpening {
				t.Errorf("opening total %d, want %d", got, tt.wantOpening)
			}
			if got := c.Limiter.Established.LevelLimits[top]; got != tt.wantEst {
				t.Errorf("established total %d, want %d", got, tt.wantEst)
			}
			if c.Adaptive(quicclass.Opening) != tt.adaptive || c.Adaptive(quicclass.Established) != tt.adaptiveEst {
				t.Errorf("adaptive %v and %v, want %v and %v", c.AdaptiveTotal, c.AdaptiveEstablished, tt.adaptive, tt.adaptiveEst)
			}
			if got := c.TotalStart(quicclass.Opening); tt.adaptive && got != tt.start {
				t.Errorf("the opening total starts at %d, want %d", got, tt.start)
			}
			if got := c.TotalStart(quicclass.Established); got != 0 {
				t.Errorf("the established total starts at %d, want lifted", got)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("the configuration made does not validate: %v", err)
			}
		})
	}
}
