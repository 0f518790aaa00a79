//go:build linux

package bench

import (
	"fmt"
	"math"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/lab/svgchart"
)

// barChart is a grouped bar chart: one group per scenario (or transfer), one
// bar per series in each group.
type barChart struct {
	file, title, subtitle, yLabel string
	groups                        []string
	series                        []barSeries
	// fixedHi, when set, is the top of a linear axis (100 for percentages).
	fixedHi float64
}

type barSeries struct {
	name, color string
	light       bool      // drawn lighter: the second series of a variant
	values      []float64 // one per group; NaN: none
	marks       []string  // one per group: a word above the bar
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 960, 500
	padL, padR     = 80, 20
	padT, padB     = 80, 110
)

// variantColor is the color of the i-th variant: plain grey, then a palette.
func variantColor(i int) string {
	palette := []string{"#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"}
	return palette[i%len(palette)]
}

func (c barChart) svg() string {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n",
		chartW, chartH, chartW, chartH)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="26" font-size="18" font-weight="bold">%s</text>`+"\n", padL, svgchart.Esc(c.title))
	fmt.Fprintf(&b, `<text x="%d" y="46" fill="#555">%s</text>`+"\n", padL, svgchart.Esc(c.subtitle))

	lo, hi := math.Inf(1), 0.0
	for _, s := range c.series {
		for _, v := range s.values {
			if v > 0 && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 1
	}
	// Half the smallest value: on a log axis the smallest bar stays visible.
	y := svgchart.NewAxis(lo/2, hi, padT, chartH-padB)
	if c.fixedHi > 0 {
		y = svgchart.Axis{Hi: c.fixedHi, Top: padT, Bot: chartH - padB}
	}
	// Axes, ticks and grid.
	for _, t := range y.Ticks() {
		py := y.Pos(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`, padL, py, chartW-padR, py)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, py+4, svgchart.Human(t))
	}
	fmt.Fprintf(&b, `<g stroke="#999"><line x1="%d" y1="%d" x2="%d" y2="%d"/><line x1="%d" y1="%d" x2="%d" y2="%d"/></g>`+"\n",
		padL, padT, padL, chartH-padB, padL, chartH-padB, chartW-padR, chartH-padB)
	label := c.yLabel
	if y.Log {
		label += " (log scale)"
	}
	fmt.Fprintf(&b, `<text transform="translate(20 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (padT+chartH-padB)/2, svgchart.Esc(label))

	// Bars.
	groupW := float64(chartW-padL-padR) / float64(max(len(c.groups), 1))
	barW := groupW * 0.8 / float64(max(len(c.series), 1))
	base := y.Pos(y.Lo)
	for gi, g := range c.groups {
		gx := float64(padL) + float64(gi)*groupW
		b.WriteString(groupLabel(gx+groupW/2, chartH-padB+18, g, groupW))
		for si, s := range c.series {
			x := gx + groupW*0.1 + float64(si)*barW
			v := math.NaN()
			if gi < len(s.values) {
				v = s.values[gi]
			}
			if math.IsNaN(v) {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="9" text-anchor="middle" fill="#999">n/a</text>`+"\n", x+barW/2, base-3)
				continue
			}
			top := y.Pos(math.Min(v, y.Hi))
			opacity := ""
			if s.light {
				opacity = ` fill-opacity="0.45"`
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"%s><title>%s, %s: %s</title></rect>`+"\n",
				x, top, barW*0.92, math.Max(base-top, 0.5), s.color, opacity, svgchart.Esc(g), svgchart.Esc(s.name), svgchart.Human(v))
			if gi < len(s.marks) && s.marks[gi] != "" {
				fmt.Fprintf(&b, `<text transform="translate(%.1f %.1f) rotate(-90)" font-size="10" fill="#d62728">%s</text>`+"\n",
					x+barW/2+3, top-4, svgchart.Esc(s.marks[gi]))
			}
		}
	}
	// Legend, below the group labels.
	lx, ly := padL, chartH-padB+48
	for _, s := range c.series {
		opacity := ""
		if s.light {
			opacity = ` fill-opacity="0.45"`
		}
		w := 26 + 7*len(s.name)
		if lx+w > chartW-padR {
			lx, ly = padL, ly+22
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="14" height="14" fill="%s"%s/><text x="%d" y="%d">%s</text>`+"\n",
			lx, ly-11, s.color, opacity, lx+19, ly, svgchart.Esc(s.name))
		lx += w + 16
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// labelCharW is the width of a character of a group label at the chart's
// font size, about.
const labelCharW = 7.0

// groupLabel is a group's name centred at x on the baseline y; a name wider
// than width is split after the "-" nearest its middle into two smaller
// lines (spoofed-long-min: "spoofed-" over "long-min").
func groupLabel(x float64, y int, name string, width float64) string {
	i := -1
	for j, c := range name {
		if c == '-' && (i < 0 || max(j+1, len(name)-j-1) < max(i+1, len(name)-i-1)) {
			i = j
		}
	}
	if float64(len(name))*labelCharW <= width || i < 0 {
		return fmt.Sprintf(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, y, svgchart.Esc(name))
	}
	return fmt.Sprintf(`<text x="%.1f" y="%d" text-anchor="middle" font-size="11"><tspan x="%.1f">%s</tspan><tspan x="%.1f" dy="13">%s</tspan></text>`+"\n",
		x, y, x, svgchart.Esc(name[:i+1]), x, svgchart.Esc(name[i+1:]))
}

// charts returns the report's charts: legitimate success and p99 per
// scenario, transfer throughput, and Caddy's CPU.
func charts(rep *Report) []barChart {
	var floods, all []string
	for _, sc := range rep.Scenarios {
		all = append(all, sc.Name)
		if !sc.Transfers {
			floods = append(floods, sc.Name)
		}
	}
	provenance := fmt.Sprintf("%s; %s, %d cores; median of %d", rep.Date[:10], rep.Machine.CPU, rep.Machine.Cores, rep.Settings.Reps)
	fig := func(scenario, variant, name string) float64 {
		s := summaryOf(rep, scenario, variant)
		if s == nil || s.Figures[name].Median == nil {
			return math.NaN()
		}
		return *s.Figures[name].Median
	}
	legit := func(figNew, figEst string) []barSeries {
		var out []barSeries
		for i, v := range rep.Variants {
			nw := barSeries{name: v.Name + ", new connection", color: variantColor(i)}
			est := barSeries{name: v.Name + ", established", color: variantColor(i), light: true}
			for _, sc := range floods {
				nw.values = append(nw.values, fig(sc, v.Name, figNew))
				est.values = append(est.values, fig(sc, v.Name, figEst))
			}
			out = append(out, nw, est)
		}
		return out
	}
	var out []barChart
	if len(floods) > 0 {
		out = append(out,
			barChart{file: "legit-success.svg", title: "Legitimate requests that succeeded during each flood",
				subtitle: fmt.Sprintf("%d requests/s per client, timeout %.1f s; %s", rep.Settings.RequestRate, rep.Settings.TimeoutSeconds, provenance),
				yLabel:   "success (%)", groups: floods, series: legit(figNewOK, figEstOK), fixedHi: 100},
			barChart{file: "legit-p99.svg", title: "p99 latency of the successful legitimate requests",
				subtitle: "new connection: handshake and request; established: the request; " + provenance,
				yLabel:   "p99 (ms)", groups: floods, series: legit(figNewP99, figEstP99)})
	}
	var hasTransfers bool
	for _, sc := range rep.Scenarios {
		hasTransfers = hasTransfers || sc.Transfers
	}
	if hasTransfers {
		var series []barSeries
		for i, v := range rep.Variants {
			s := barSeries{name: v.Name, color: variantColor(i)}
			sum := summaryOf(rep, "transfers", v.Name)
			for _, name := range TransferNames() {
				s.values = append(s.values, fig("transfers", v.Name, transferFigure(name, "mbps")))
				mark := ""
				if sum != nil && sum.TransferTimeouts[name] > 0 {
					mark = fmt.Sprintf("timeout %d/%d", sum.TransferTimeouts[name], sum.Reps)
				}
				s.marks = append(s.marks, mark)
			}
			series = append(series, s)
		}
		sz := rep.Settings.Sizes
		out = append(out, barChart{file: "transfers.svg", title: "Transfer throughput, no flood",
			subtitle: fmt.Sprintf("%s download, %s upload, 20 x %s; %s", sizeText(sz.Download), sizeText(sz.Upload), sizeText(sz.Each), provenance),
			yLabel:   "Mbit/s", groups: TransferNames(), series: series})
	}
	var cpu []barSeries
	for i, v := range rep.Variants {
		s := barSeries{name: v.Name, color: variantColor(i)}
		for _, sc := range all {
			s.values = append(s.values, fig(sc, v.Name, figCPU))
		}
		cpu = append(cpu, s)
	}
	out = append(out, barChart{file: "caddy-cpu.svg", title: "Caddy's CPU during each scenario",
		subtitle: "user and system time in % of one core; " + provenance,
		yLabel:   "CPU (% of a core)", groups: all, series: cpu})
	return out
}
