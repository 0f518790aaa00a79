package console

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// Screen is what one screen shows: the latest snapshot and, for rates, the
// one before it.
type Screen struct {
	// Address is the admin endpoint, for the title.
	Address string
	Prev    *Snapshot
	Cur     Snapshot
	// Width and Height bound the screen in columns and lines; 0 is
	// unbounded.
	Width, Height int
}

// Render writes the screen: per limiter a header (mode, listeners,
// settings), the rates by class and verdict, the limited streams fastest
// first, and the verdict line. Lines are cut at Width, and streams are
// left out to fit Height.
func Render(w io.Writer, s Screen) error {
	lines := Lines(s)
	for _, l := range lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return fmt.Errorf("writing the screen: %w", err)
		}
	}
	return nil
}

// Lines returns the screen's lines.
func Lines(s Screen) []string {
	title := fmt.Sprintf("rakelimit at %s, %s", s.Address, s.Cur.At.Format("15:04:05"))
	if s.Prev != nil {
		title += fmt.Sprintf(", rates over the last %.1f s", s.Cur.At.Sub(s.Prev.At).Seconds())
	} else {
		title += ", rates from the next refresh"
	}
	type section struct{ head, streams, tail []string }
	var sections []section
	fixed := 1
	for _, l := range s.Cur.View.Limiters {
		var r *Rates
		if s.Prev != nil {
			r = RatesOf(*s.Prev, s.Cur, l.Name)
		}
		sec := section{head: header(l), streams: streamLines(l, s.Cur.At), tail: []string{"  verdict: " + Verdict(l, r)}}
		sec.head = append(sec.head, rateLines(l, r)...)
		fixed += 1 + len(sec.head) + len(sec.tail)
		sections = append(sections, sec)
	}
	room := -1 // streams lines per limiter, -1: all
	if s.Height > 0 && len(sections) > 0 {
		room = max(0, (s.Height-fixed)/len(sections))
	}
	out := []string{title}
	for _, sec := range sections {
		out = append(out, "")
		out = append(out, sec.head...)
		st := sec.streams
		if room >= 0 && len(st) > room {
			if room == 0 {
				st = nil
			} else {
				st = append(st[:room-1:room-1], fmt.Sprintf("    ... %d more lines", len(st)-room+1))
			}
		}
		out = append(out, st...)
		out = append(out, sec.tail...)
	}
	if s.Height > 0 && len(out) > s.Height {
		out = out[:s.Height]
	}
	if s.Width > 0 {
		for i, l := range out {
			if r := []rune(l); len(r) > s.Width {
				out[i] = string(r[:s.Width])
			}
		}
	}
	return out
}

// header describes a limiter: name, mode, listeners and the settings in
// force.
func header(l report.Limiter) []string {
	c := l.Config
	mode := l.Mode
	if mode == "userspace" {
		mode += " (every datagram reaches Caddy)"
	}
	out := []string{fmt.Sprintf("limiter %s  mode %s  listeners %s", l.Name, mode, strings.Join(l.Listeners, " "))}
	if l.Mode == "xdp" {
		out = append(out, "  "+xdpLine(l.XDP))
	}
	flags := []string{}
	if c.DryRun {
		flags = append(flags, "DRY RUN: drops nothing")
	}
	if !c.Classify {
		flags = append(flags, "classify off")
	}
	if l.Verification.On {
		flags = append(flags, "verifying connection IDs")
	}
	out = append(out, fmt.Sprintf("  limit %d/s  window %s  opening levels %s  established levels %s  prefixes v4 %s v6 %s%s",
		c.Limit, c.Window, limits(c.LevelLimits), limits(c.EstablishedLevelLimits), ints(c.IPv4Prefixes), ints(c.IPv6Prefixes),
		joinFlags(flags)))
	t := l.OpeningTotal
	total := "lifted"
	if t.CapPPS > 0 {
		total = fmt.Sprintf("%d/s", t.CapPPS)
	}
	kind := "fixed"
	if t.Adaptive {
		kind = fmt.Sprintf("adaptive: receive queue %.0f%% full, %d overflows, %.0f opening/s in the last period",
			100*t.QueueFill, t.QueueDrops, t.PassedPPS)
	}
	out = append(out, fmt.Sprintf("  opening total %s (%s)  allowlisted prefixes %d  version negotiation %d/s",
		total, kind, len(c.Allow), c.VersionNegotiation))
	return out
}

// xdpLine says where the XDP program of a limiter in mode xdp runs: each
// interface, how, and the listeners it serves there; and the interfaces of
// their traffic where it does not (the socket filter alone decides there).
func xdpLine(xs []report.XDPInterface) string {
	var on, without []string
	for _, x := range xs {
		if x.Attach == report.XDPSocketFilterOnly {
			without = append(without, x.Name)
			continue
		}
		on = append(on, fmt.Sprintf("%s (%s: %s)", x.Name, x.Attach, strings.Join(x.Listeners, " ")))
	}
	line := "xdp on no interface: the socket filter decides everything"
	if len(on) > 0 {
		line = "xdp on " + strings.Join(on, ", ") + "; elsewhere the socket filter"
	}
	if len(without) > 0 {
		line += " (socket filter only on " + strings.Join(without, " ") + ")"
	}
	return line
}

func joinFlags(f []string) string {
	if len(f) == 0 {
		return ""
	}
	return "  " + strings.Join(f, ", ")
}

// limits lists level limits, "off" for an unlimited level.
func limits(v []uint32) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = "off"
		if x > 0 {
			s[i] = strconv.FormatUint(uint64(x), 10)
		}
	}
	return strings.Join(s, "/")
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, "/")
}

// rateLines are the packets per second by class and verdict.
func rateLines(l report.Limiter, r *Rates) []string {
	if r == nil {
		return []string{"  packets/s: measuring"}
	}
	out := []string{fmt.Sprintf("  %-12s %10s %10s %10s  %s", "packets/s", "passed", "limited", "dropped", "dropped by level")}
	for _, c := range r.Classes {
		by := []string{}
		for lvl := range c.Dropped {
			if d := c.Dropped[lvl] + c.DryRun[lvl]; d > 0 {
				by = append(by, fmt.Sprintf("L%d %s", lvl, rate(d)))
			}
		}
		if sum(c.DryRun) > 0 {
			by = append(by, "(dry run: delivered)")
		}
		out = append(out, fmt.Sprintf("  %-12s %10s %10s %10s  %s", c.Name, rate(c.Passed), rate(c.Limited),
			rate(c.DroppedTotal()), strings.Join(by, " ")))
	}
	out = append(out, fmt.Sprintf("  %-12s %10s %10s %10s", "negotiation", rate(r.Negotiation["passed"]), "",
		rate(r.Negotiation["dropped"]+r.Negotiation["dry_run"])))
	reasons := []string{}
	for reason, v := range r.Invalid {
		if v > 0 {
			reasons = append(reasons, reason)
		}
	}
	sort.Slice(reasons, func(i, j int) bool { return r.Invalid[reasons[i]] > r.Invalid[reasons[j]] })
	by := make([]string, len(reasons))
	for i, reason := range reasons {
		by[i] = reason + " " + rate(r.Invalid[reason])
	}
	out = append(out, fmt.Sprintf("  %-12s %10s %10s %10s  %s", "invalid", "", "", rate(r.InvalidTotal()), strings.Join(by, " ")))
	out = append(out, fmt.Sprintf("  allowlisted %s/s, verified %s/s", rate(r.Allowlisted), rate(r.Verified)))
	return out
}

// rate formats packets per second.
func rate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
}

// streamLines lists the limited streams, fastest first as the view has
// them.
func streamLines(l report.Limiter, now time.Time) []string {
	if len(l.LimitedStreams) == 0 {
		return []string{"  limited streams: none"}
	}
	out := []string{fmt.Sprintf("  limited streams: %d, fastest first", l.LimitedStreamsTotal),
		fmt.Sprintf("    %9s %9s %-5s %-11s %9s %6s  %s", "rate/s", "limit/s", "level", "class", "dropped", "for", "stream")}
	for _, s := range l.LimitedStreams {
		level, limit, class := strconv.Itoa(s.Level), strconv.FormatUint(uint64(s.LimitPPS), 10), s.Class
		if s.Level < 0 {
			level, limit, class = "-", "-", s.Class+":"+s.Reason
		}
		name := s.Stream
		if s.DryRun {
			name += " (dry run)"
		}
		out = append(out, fmt.Sprintf("    %9s %9s %-5s %-11s %9d %6s  %s", rate(s.RatePPS), limit, level, class, s.Dropped,
			age(now.Sub(s.Since)), name))
	}
	return out
}

// age formats how long a stream has been limited.
func age(d time.Duration) string {
	switch {
	case d < 0 || d > 100*24*time.Hour:
		return "-"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	default:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
}
