//go:build linux

package bench

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The module's counters are read generically: every counter whose name
// starts with modulePrefix, whatever its labels, summed over the labels in
// summedLabels. Labels the module may add later (a packet class, a reason)
// show up in the report without a change here.
const modulePrefix = "caddy_rakelimit_"

var summedLabels = []string{"family", "listener"}

// Series is one counter (a metric and its labels, without the summed ones)
// and a value: a total, or its change over a scenario.
type Series struct {
	Metric string            `json:"metric"`
	Labels map[string]string `json:"labels,omitempty"`
	Value  float64           `json:"value"`
}

func (s Series) key() string {
	var b strings.Builder
	b.WriteString(s.Metric)
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		fmt.Fprintf(&b, "\x00%s=%s", k, s.Labels[k])
	}
	return b.String()
}

// counters is a scrape of the module's counters, by series key.
type counters map[string]Series

// parseCounters reads a Prometheus text exposition and keeps the module's
// counters, summed over summedLabels.
func parseCounters(r io.Reader) (counters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	out := counters{}
	for name, fam := range fams {
		if !strings.HasPrefix(name, modulePrefix) {
			continue
		}
		counter := fam.GetType() == dto.MetricType_COUNTER ||
			fam.GetType() == dto.MetricType_UNTYPED && strings.HasSuffix(name, "_total")
		if !counter {
			continue
		}
		for _, m := range fam.GetMetric() {
			v := m.GetCounter().GetValue()
			if fam.GetType() == dto.MetricType_UNTYPED {
				v = m.GetUntyped().GetValue()
			}
			s := Series{Metric: name, Labels: map[string]string{}}
			for _, lp := range m.GetLabel() {
				if !slices.Contains(summedLabels, lp.GetName()) {
					s.Labels[lp.GetName()] = lp.GetValue()
				}
			}
			k := s.key()
			s.Value = out[k].Value + v
			out[k] = s
		}
	}
	return out, nil
}

// modeMetric is the gauge that says which mode each listener runs in.
const modeMetric = modulePrefix + "mode"

// inUserspace reports whether a Prometheus text exposition says that a
// listener's limiter runs in userspace.
func inUserspace(r io.Reader) (bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return false, fmt.Errorf("parsing metrics: %w", err)
	}
	fam, ok := fams[modeMetric]
	if !ok {
		return false, nil
	}
	for _, m := range fam.GetMetric() {
		v := m.GetGauge().GetValue()
		if fam.GetType() == dto.MetricType_UNTYPED {
			v = m.GetUntyped().GetValue()
		}
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "mode" && lp.GetValue() == "userspace" && v == 1 {
				return true, nil
			}
		}
	}
	return false, nil
}

// delta returns the series that changed from start to c, with the change,
// sorted by metric and labels.
func (c counters) delta(start counters) []Series {
	var out []Series
	for _, k := range slices.Sorted(maps.Keys(c)) {
		s := c[k]
		s.Value -= start[k].Value
		if s.Value != 0 {
			out = append(out, s)
		}
	}
	return out
}

// ModuleGroup totals the series of one verdict of the packets counter (its
// name is the verdict), or of another counter (its name is the metric's,
// without the prefix and _total), with a breakdown by each other label.
type ModuleGroup struct {
	Name string `json:"name"`
	// Verdict is set for verdicts of caddy_rakelimit_packets_total.
	Verdict bool    `json:"verdict"`
	Total   float64 `json:"total"`
	// By maps a label to its values' totals, e.g. "level" → "0" → 1234.
	// Empty values are left out.
	By map[string]map[string]float64 `json:"by,omitempty"`
}

// packetsMetric is the counter whose verdict label says what the filter did.
const packetsMetric = modulePrefix + "packets_total"

// refusedVerdicts are the verdicts of datagrams the filter refused: the
// socket's drop counter counts them too.
var refusedVerdicts = []string{"dropped", "invalid"}

// summarize groups series into ModuleGroups, verdicts first in the order of
// their totals, then the other counters by name.
func summarize(series []Series) []ModuleGroup {
	groups := map[string]*ModuleGroup{}
	for _, s := range series {
		name := strings.TrimSuffix(strings.TrimPrefix(s.Metric, modulePrefix), "_total")
		verdict, hasVerdict := s.Labels["verdict"]
		isVerdict := s.Metric == packetsMetric && hasVerdict
		switch {
		case isVerdict:
			name = verdict
		case hasVerdict:
			name += ":" + verdict
		}
		g := groups[name]
		if g == nil {
			g = &ModuleGroup{Name: name, Verdict: isVerdict, By: map[string]map[string]float64{}}
			groups[name] = g
		}
		g.Total += s.Value
		for k, v := range s.Labels {
			if k == "verdict" || v == "" {
				continue
			}
			if g.By[k] == nil {
				g.By[k] = map[string]float64{}
			}
			g.By[k][v] += s.Value
		}
	}
	var out []ModuleGroup
	for _, g := range groups {
		if len(g.By) == 0 {
			g.By = nil
		}
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b ModuleGroup) int {
		if a.Verdict != b.Verdict {
			if a.Verdict {
				return -1
			}
			return 1
		}
		if a.Verdict && a.Total != b.Total {
			if a.Total > b.Total {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// refusedDelivered totals the verdict groups: refused by the filter, and
// delivered to the socket.
func refusedDelivered(groups []ModuleGroup) (refused, delivered float64) {
	for _, g := range groups {
		switch {
		case !g.Verdict:
		case slices.Contains(refusedVerdicts, g.Name):
			refused += g.Total
		default:
			delivered += g.Total
		}
	}
	return refused, delivered
}

// describeGroups is a compact one-line account of groups for a table cell:
// "dropped 1.2M (level 0 1.2M), passed 3.4k".
func describeGroups(groups []ModuleGroup) string {
	var parts []string
	for _, g := range groups {
		if g.Total == 0 {
			continue
		}
		part := g.Name + " " + count(g.Total)
		var by []string
		for _, label := range slices.Sorted(maps.Keys(g.By)) {
			vals := g.By[label]
			if label == "limiter" && len(vals) == 1 {
				continue
			}
			keys := slices.SortedFunc(maps.Keys(vals), func(a, b string) int {
				return compareFloat(vals[b], vals[a])
			})
			for _, v := range keys {
				if vals[v] != 0 {
					by = append(by, fmt.Sprintf("%s %s %s", label, v, count(vals[v])))
				}
			}
		}
		if len(by) > 0 {
			part += " (" + strings.Join(by, ", ") + ")"
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return "–"
	}
	return strings.Join(parts, "; ")
}

func compareFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// count formats a count for a table: 987, 12.3k, 4.56M.
func count(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return fmt.Sprintf("%.3gG", v/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.3gk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
