package engine

import (
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
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

// SettingsFields are the log fields that describe c: the fields of its
// report (report.ConfigOf), named as there, a level's limit 0 written off,
// and a list its log tag says to count (the allowlist) as its length.
func SettingsFields(c decide.Config) []zap.Field {
	v := reflect.ValueOf(report.ConfigOf(c))
	var fields []zap.Field
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		if as, count := strings.CutSuffix(v.Type().Field(i).Tag.Get("log"), ",count"); count {
			fields = append(fields, zap.Int(as, v.Field(i).Len()))
			continue
		}
		switch f := v.Field(i).Interface().(type) {
		case []uint32: // level limits
			levels := make([]string, len(f))
			for lvl, lim := range f {
				levels[lvl] = "off"
				if lim != 0 {
					levels[lvl] = strconv.FormatUint(uint64(lim), 10)
				}
			}
			fields = append(fields, zap.Strings(name, levels))
		case report.Duration:
			fields = append(fields, zap.Duration(name, time.Duration(f)))
		default:
			fields = append(fields, zap.Any(name, f))
		}
	}
	return fields
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
		zap.Uint32("limit_pps", c.LevelLimit(int(st.Class), st.Level)))
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
