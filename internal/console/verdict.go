package console

import (
	"fmt"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// Verdict says in one line what a limiter is doing: whom it drops and at
// which level, whether the socket's opening total is full (and so whether
// networks over their fair share lose whole sources), and whether
// established datagrams are dropped. r may be nil (no rates yet): the
// verdict then rests on the limited streams alone.
func Verdict(l report.Limiter, r *Rates) string {
	drop := "dropping"
	if l.Config.DryRun {
		drop = "would drop (dry run)"
	}
	var parts []string
	var top, invalid *report.Stream
	for i := range l.LimitedStreams {
		s := &l.LimitedStreams[i]
		switch {
		case s.Level < 0 && invalid == nil:
			invalid = s
		case s.Level >= 0 && top == nil:
			top = s
		}
	}
	full := false
	if r != nil && len(r.Classes) > 0 {
		open := r.Classes[0] // opening, or all without classify
		last := len(open.Dropped) - 1
		full = last >= 0 && open.Dropped[last]+open.DryRun[last] > 0
	}
	if full {
		total := "lifted"
		if l.OpeningTotal.CapPPS > 0 {
			total = fmt.Sprintf("%d/s", l.OpeningTotal.CapPPS)
		}
		parts = append(parts, fmt.Sprintf("the opening total is full (%s): networks over their fair share lose whole sources", total))
	}
	if top != nil {
		s := fmt.Sprintf("%s a flood from %s at level %d", drop, source(top.Stream), top.Level)
		if top.Class != "opening" && top.Class != "all" {
			s = fmt.Sprintf("%s %s packets from %s at level %d", drop, top.Class, source(top.Stream), top.Level)
		}
		if !full && r != nil {
			s += "; the opening total has room"
		}
		parts = append(parts, s)
	}
	if r != nil && r.Untracked > 0 {
		parts = append(parts, fmt.Sprintf("%s %s/s from sources too many to list (a new source on every packet: spoofed)",
			drop, rate(r.Untracked)))
	}
	if invalid != nil {
		parts = append(parts, fmt.Sprintf("%s invalid datagrams (%s) from %s", drop, invalid.Reason, source(invalid.Stream)))
	} else if r != nil && r.InvalidTotal() > 0 && top == nil {
		parts = append(parts, fmt.Sprintf("%s invalid datagrams, %s/s", drop, rate(r.InvalidTotal())))
	}
	if r != nil {
		if est := r.Class("established"); est != nil && est.DroppedTotal() > 0 {
			parts = append(parts, "established datagrams dropped: a limit may be too low for real clients (raise established_limit, or allow them)")
		}
	}
	if len(parts) == 0 {
		if r == nil {
			return "no limited stream"
		}
		return fmt.Sprintf("quiet: nothing dropped in the last %.0f s", r.Seconds)
	}
	return strings.Join(parts, "; ")
}

// source names the sources of a stream: the view's stream name begins with
// them, "198.51.100.0/24 sport=* -> :443"; "* sport=4433" is every source
// from one port.
func source(stream string) string {
	f := strings.Fields(stream)
	if len(f) == 0 {
		return stream
	}
	if f[0] == "*" && len(f) > 1 && strings.HasPrefix(f[1], "sport=") {
		return "every source from port " + strings.TrimPrefix(f[1], "sport=")
	}
	return f[0]
}
