package decide

import (
	"maps"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// The defaults of what an operator leaves out, and the policy of the
// sockets' totals, decided here once: the Caddy module (the root package)
// fills its options from them and applies WithTotals, the engine starts
// an adaptive total where TotalStart says, and the tests' typical
// configurations (internal/testutil) are built from them. The limiter
// fills two defaults of its own, where they are used: the prefixes
// (sketch.DefaultIPv4Prefixes and DefaultIPv6Prefixes, through
// sketch.Config.WithDefaults) and the unverified class's limits
// (sketch.DefaultUnverifiedLimit and DefaultUnverifiedTotal, through
// sketch.Config.Class).
const (
	// DefaultLimit is the limit, in packets per second, of every stream
	// of the opening class at every level.
	DefaultLimit = 1000
	// DefaultWindow is the smoothing window.
	DefaultWindow = time.Second
	// DefaultOpeningTotal is where the cap on the connection-opening
	// packets of the whole socket (the last level of the opening class)
	// starts when classifying, shared fairly among networks; from there it
	// follows quic-go's receive queue (package backlog): lifted while
	// quic-go keeps up, lowered when it falls behind. Of the fixed caps
	// measured on a 2-core machine (README, "Choosing numbers"), it served
	// a quiet network's new connections as well as any higher one. A limit
	// above it raises it to the limit; a window too long for it lowers it
	// to the largest burst the counters hold.
	DefaultOpeningTotal = 20_000
	// DefaultEstablishedLimit is the limit of established-connection
	// packets at every level but the last, which is unlimited: 200,000
	// packets per second is about 2.4 Gbit/s of 1,500-byte datagrams, so
	// that one client's gigabit transfer in either direction passes
	// untouched.
	DefaultEstablishedLimit = 200_000
	// DefaultVersionNegotiation is how many datagrams with a QUIC version
	// quic-go lacks pass per second, for the whole socket.
	DefaultVersionNegotiation = 10
)

// WithTotals returns c with the totals' policy applied to the totals (the
// last level of the opening and of the established class) its level
// limits leave unset; c.Limiter.Established must have a limit of its own.
// When classifying, an unset opening total is adaptive: it starts at
// DefaultOpeningTotal, lowered to the largest burst the counters hold
// with c's window and raised to c's limit, and follows the receive queue
// (AdaptiveTotal). An unset established total is lifted, and when
// classifying adaptive too (AdaptiveEstablished): nothing the filter lets
// through is unbounded, and nothing is refused while quic-go keeps up. A
// total that is set, to a limit or lifted, stays where it is set.
func WithTotals(c Config) Config {
	top := c.Limiter.WithDefaults().Levels() - 1
	opening, established := &c.Limiter.LevelLimits, &c.Limiter.Established.LevelLimits
	for _, m := range []*map[int]uint32{opening, established} {
		if *m = maps.Clone(*m); *m == nil {
			*m = map[int]uint32{}
		}
	}
	if _, set := (*opening)[top]; !set && c.Classify {
		burst := uint32(min(float64(sketch.MaxBurst)/c.Limiter.Window.Seconds(), sketch.MaxLimit))
		(*opening)[top] = max(min(DefaultOpeningTotal, burst), c.Limiter.Limit)
		c.AdaptiveTotal = true
	}
	if _, set := (*established)[top]; !set {
		(*established)[top] = sketch.Unlimited
		c.AdaptiveEstablished = c.Classify
	}
	return c
}

// Adaptive reports whether c makes class's total follow the receive queue:
// the opening or the established class's, as AdaptiveTotal and
// AdaptiveEstablished say.
func (c *Config) Adaptive(class quicclass.Class) bool {
	switch class {
	case quicclass.Opening:
		return c.AdaptiveTotal
	case quicclass.Established:
		return c.AdaptiveEstablished
	}
	return false
}

// TotalStart returns where class's adaptive total starts, in packets per
// second, 0 when lifted: the opening total at its level limit, the
// established total lifted, so that nothing is refused before the
// receive queue says quic-go falls behind.
func (c *Config) TotalStart(class quicclass.Class) uint32 {
	if class != quicclass.Opening {
		return 0
	}
	lims := c.Limiter.Class(int(class))
	start := lims.Limit
	if l, ok := lims.LevelLimits[c.Limiter.WithDefaults().Levels()-1]; ok {
		start = l
	}
	if start == sketch.Unlimited {
		return 0
	}
	return start
}
