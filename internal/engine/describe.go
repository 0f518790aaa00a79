package engine

import (
	"strconv"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// LimiterClasses are the classes with limiters, as the counters index them.
var LimiterClasses = []quicclass.Class{quicclass.Opening, quicclass.Established, quicclass.Unverified}

// ClassName names the limiter class of a stream or counter: opening and
// established when the filter classifies, all when it does not.
func ClassName(c decide.Config, class quicclass.Class) string {
	if !c.Classify && class == quicclass.Opening {
		return "all"
	}
	return class.String()
}

// LevelLimit is the limit in packets per second of a level of a class under
// c, or 0 when the level is unlimited.
func LevelLimit(c decide.Config, class, level int) uint32 {
	lims := c.Limiter.Class(class)
	lim := lims.Limit
	if l, ok := lims.LevelLimits[level]; ok {
		lim = l
	}
	if lim == sketch.Unlimited {
		return 0
	}
	return lim
}

// SettingsFields are the log fields that describe c.
func SettingsFields(c decide.Config) []zap.Field {
	lc := c.Limiter.WithDefaults()
	levels := func(class int) []string {
		out := make([]string, lc.Levels())
		for lvl := range out {
			if lim := LevelLimit(c, class, lvl); lim == 0 {
				out[lvl] = "off"
			} else {
				out[lvl] = strconv.FormatUint(uint64(lim), 10)
			}
		}
		return out
	}
	fields := []zap.Field{zap.Uint32("limit", lc.Limit), zap.Duration("window", lc.Window),
		zap.Strings("level_limits", levels(0)), zap.Bool("classify", c.Classify)}
	if c.Classify {
		fields = append(fields, zap.Strings("established_level_limits", levels(1)),
			zap.Uint32("version_negotiation", c.Negotiation))
	}
	return append(fields, zap.Bool("dry_run", c.DryRun), zap.Int("allowlisted_prefixes", len(c.Allow)))
}

// Describe names a tracked stream as an operator reads it, with its rate in
// packets per second (0 for invalid datagrams, which are not measured).
func (l *Limiter) Describe(st decide.Stream) (string, float64) {
	p := l.Engine().Params()
	if st.Class == quicclass.Invalid {
		return st.Key.Addr().String() + " -> :" + strconv.Itoa(int(st.Key.DstPort)), 0
	}
	return st.Node.Stream(p, &st.Key), p.PPS(st.Estimate)
}

// streamFields are the log fields of a newly limited stream.
func (l *Limiter) streamFields(c decide.Config, st decide.Stream, listeners []string) []zap.Field {
	stream, rate := l.Describe(st)
	fields := []zap.Field{zap.String("limiter", l.name), zap.Strings("listeners", listeners),
		zap.String("stream", stream), zap.String("class", ClassName(c, st.Class))}
	if st.Class == quicclass.Invalid {
		return append(fields, zap.String("reason", st.Reason.String()))
	}
	// "lattice_level", not "level": Caddy's JSON log keeps its severity
	// under "level".
	return append(fields, zap.Int("lattice_level", st.Level), zap.Float64("rate_pps", rate),
		zap.Uint32("limit_pps", LevelLimit(c, int(st.Class), st.Level)))
}

// streamKind names a stream's class, and for invalid datagrams the reason,
// for the summary of the lines left out: "opening", "invalid_length".
func streamKind(st decide.Stream) string {
	if st.Class == quicclass.Invalid {
		return "invalid_" + st.Reason.String()
	}
	return st.Class.String()
}

// expiredMessage is the log message of a stream no longer limited.
func expiredMessage(st decide.Stream) string {
	if st.Class == quicclass.Invalid {
		return "no more invalid datagrams"
	}
	return "stream no longer limited"
}

// expiredFields are the log fields of a stream no longer limited: how long
// its limiting lasted and how many packets it dropped.
func (l *Limiter) expiredFields(c decide.Config, st decide.Stream, listeners []string) []zap.Field {
	stream, _ := l.Describe(st)
	fields := []zap.Field{zap.String("limiter", l.name), zap.Strings("listeners", listeners),
		zap.String("stream", stream), zap.String("class", ClassName(c, st.Class))}
	if st.Class == quicclass.Invalid {
		fields = append(fields, zap.String("reason", st.Reason.String()))
	} else {
		fields = append(fields, zap.Int("lattice_level", st.Level))
	}
	dropped := "dropped"
	if st.DryRun {
		dropped = "would_drop"
	}
	return append(fields, zap.Duration("duration", st.Last.Sub(st.First)), zap.Uint64(dropped, st.Drops))
}
