package dashboard

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/rakelimit/caddy-rakelimit/lab/svgchart"
)

// Page is what surrounds the panels of a rendering.
type Page struct {
	Title, Subtitle string
	// Start and End bound the time axis; zero: the data's first and last
	// points.
	Start, End time.Time
	// Interval is the scrape interval: a series missing for more than two
	// intervals is drawn with a gap.
	Interval time.Duration
	// Spans are shaded on every time-series panel (Grafana's region
	// annotations), e.g. the flood.
	Spans []Span
}

// Span is a labelled stretch of time.
type Span struct {
	From, To time.Time
	Label    string
}

// Page geometry in SVG user units: Grafana's grid is 24 columns wide, its
// rows gridRow high.
const (
	gridCol    = 60
	gridRow    = 40
	pageMargin = 20
	headerH    = 70
	panelGap   = 8
	legendLine = 16
	minPlotH   = 80
)

// palette is the series colors, in order: ten, then lighter and darker
// shades of them, so that a panel's twenty series differ.
var palette = []string{
	"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
	"#9ecae1", "#fdae6b", "#a1d99b", "#fc9272", "#bcbddc", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
	"#08306b", "#7f2704", "#00441b", "#67000d",
}

// unitNote is the note after a panel's title for Grafana's units.
var unitNote = map[string]string{"pps": "per second", "percentunit": "percent"}

// Render draws the panels, placed as on Grafana's grid, as one SVG page.
func Render(panels []PanelData, pg Page) string {
	rows := 0
	for _, p := range panels {
		rows = max(rows, p.Panel.Y+p.Panel.H)
	}
	width, height := 24*gridCol+2*pageMargin, headerH+rows*gridRow+pageMargin
	if pg.Start.IsZero() || pg.End.IsZero() {
		pg.Start, pg.End = dataBounds(panels)
	}
	if pg.Interval <= 0 {
		pg.Interval = time.Second
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="#f4f5f5"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="30" font-size="20" font-weight="bold">%s</text>`+"\n", pageMargin, svgchart.Esc(pg.Title))
	fmt.Fprintf(&b, `<text x="%d" y="52" fill="#555">%s</text>`+"\n", pageMargin, svgchart.Esc(pg.Subtitle))
	for _, p := range panels {
		x := float64(pageMargin + p.Panel.X*gridCol + panelGap/2)
		y := float64(headerH + p.Panel.Y*gridRow + panelGap/2)
		w, h := float64(p.Panel.W*gridCol-panelGap), float64(p.Panel.H*gridRow-panelGap)
		fmt.Fprintf(&b, `<g><rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" rx="3" fill="white" stroke="#d8d9da"/>`+"\n", x, y, w, h)
		title := svgchart.Esc(p.Panel.Title)
		if n := unitNote[p.Panel.Unit]; n != "" {
			title += ` <tspan fill="#777" font-weight="normal">(` + n + `)</tspan>`
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="14" font-weight="bold">%s</text>`+"\n", x+10, y+20, title)
		if len(p.Series) == 0 {
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="16" fill="#999" text-anchor="middle">No data</text>`+"\n", x+w/2, y+h/2)
		} else if p.Panel.Type == Stat {
			stat(&b, p, x, y, w, h)
		} else {
			timeSeries(&b, p, pg, x, y, w, h)
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// dataBounds returns the first and last time of any point.
func dataBounds(panels []PanelData) (time.Time, time.Time) {
	var lo, hi time.Time
	for _, p := range panels {
		for _, s := range p.Series {
			for _, pt := range s.Points {
				if lo.IsZero() || pt.T.Before(lo) {
					lo = pt.T
				}
				if pt.T.After(hi) {
					hi = pt.T
				}
			}
		}
	}
	if !hi.After(lo) {
		hi = lo.Add(time.Second)
	}
	return lo, hi
}

// formatValue formats v for a unit.
func formatValue(v float64, unit string) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	if unit == "percentunit" {
		return svgchart.Human(v*100) + "%"
	}
	return svgchart.Human(v)
}

// legendItem is one entry of a legend, placed.
type legendItem struct {
	x, y  float64
	label string
	color string
}

// layoutLegend places the series' legends in lines of at most width from
// (x, y) downwards, at most maxLines (at least 1) lines; when they do not
// all fit, the last entry says how many were left out. It returns the entries and the lines used.
func layoutLegend(series []Line, x, y, width float64, maxLines int) ([]legendItem, int) {
	var out []legendItem
	lx, line := x, 0
	for i, s := range series {
		label := s.Legend
		w := 24 + 6.6*float64(len(label))
		if lx > x && lx+w > x+width {
			lx, line = x, line+1
		}
		if line >= maxLines {
			// No room: the last entry placed gives way to a count of
			// the entries left out.
			last := &out[len(out)-1]
			last.label, last.color = fmt.Sprintf("+%d more", len(series)-i+1), ""
			return out, maxLines
		}
		out = append(out, legendItem{x: lx, y: y + float64(line)*legendLine, label: label, color: palette[i%len(palette)]})
		lx += w + 12
	}
	return out, line + 1
}

// timeSeries draws a time-series panel's plot and legend.
func timeSeries(b *strings.Builder, p PanelData, pg Page, x, y, w, h float64) {
	const padL, padR, padTop, tickH = 58, 14, 34, 20
	maxLines := max(1, int((h-padTop-tickH-minPlotH-8)/legendLine))
	// Lay the legend out once to know its height, then again below the plot.
	_, lines := layoutLegend(p.Series, x+padL, 0, w-padL-padR, maxLines)
	top, bot := y+padTop, y+h-tickH-float64(lines*legendLine)-8
	left, right := x+padL, x+w-padR

	// Infinite values (a cap that is off: +Inf) have no place on an axis:
	// Grafana leaves them out, and so does the rendering, saying so in the
	// legend.
	series := make([]Line, len(p.Series))
	for i, s := range p.Series {
		series[i] = s
		for _, pt := range s.Points {
			if math.IsInf(pt.V, 0) || math.IsNaN(pt.V) {
				series[i].Legend += " (" + formatValue(pt.V, "") + ", not drawn)"
				break
			}
		}
	}
	p.Series = series
	lo, hi := math.Inf(1), 0.0
	for _, s := range p.Series {
		for _, pt := range s.Points {
			if pt.V > 0 && !math.IsInf(pt.V, 1) {
				lo, hi = math.Min(lo, pt.V), math.Max(hi, pt.V)
			}
		}
	}
	ax := valueAxis(p.Panel.Log, lo, hi, top, bot)
	for _, t := range ax.Ticks() {
		py := ax.Pos(t)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, left, py, right, py)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="11" fill="#555">%s</text>`+"\n", left-5, py+4, formatValue(t, p.Panel.Unit))
	}
	if ax.Log {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="10" fill="#999">log scale</text>`+"\n", right, y+20)
	}

	span := pg.End.Sub(pg.Start).Seconds()
	px := func(t time.Time) float64 { return left + t.Sub(pg.Start).Seconds()/span*(right-left) }
	step := svgchart.NiceCeil(span / 6)
	for s := 0.0; s <= span+1e-9; s += step {
		tx := left + s/span*(right-left)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f2f2f2"/>`, tx, top, tx, bot)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" fill="#555">%ss</text>`+"\n", tx, bot+15, svgchart.Human(s))
	}
	for _, sp := range pg.Spans {
		x0, x1 := math.Max(px(sp.From), left), math.Min(px(sp.To), right)
		if x1 <= x0 {
			continue
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#d62728" fill-opacity="0.07"/>`, x0, top, x1-x0, bot-top)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="10" fill="#b22">%s</text>`+"\n", x0+3, top+10, svgchart.Esc(sp.Label))
	}
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`+"\n", left, bot, right, bot)

	gap := 2 * pg.Interval
	for i, s := range p.Series {
		color := palette[i%len(palette)]
		var d strings.Builder
		var prev time.Time
		var lastDrawn Point
		drawn := 0
		for _, pt := range s.Points {
			if math.IsInf(pt.V, 0) || math.IsNaN(pt.V) || ax.Log && pt.V <= 0 {
				// Not drawable (on a log axis: zero and below, as
				// in Grafana): a gap.
				prev = time.Time{}
				continue
			}
			cmd := "L"
			if prev.IsZero() || pt.T.Sub(prev) > gap {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, px(pt.T), ax.Pos(pt.V))
			prev, lastDrawn = pt.T, pt
			drawn++
		}
		if drawn == 0 {
			continue
		}
		last := s.Points[len(s.Points)-1].V
		fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.6"><title>%s: last %s</title></path>`+"\n",
			strings.TrimSpace(d.String()), color, svgchart.Esc(s.Legend), formatValue(last, p.Panel.Unit))
		if drawn == 1 {
			// A lone point has no line: a dot.
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="2" fill="%s"/>`+"\n", px(lastDrawn.T), ax.Pos(lastDrawn.V), color)
		}
	}
	items, _ := layoutLegend(p.Series, left, bot+tickH+12, right-left, maxLines)
	for _, it := range items {
		if it.color != "" {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="14" height="3" fill="%s"/>`, it.x, it.y-5, it.color)
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="11">%s</text>`+"\n", it.x+18, it.y, svgchart.Esc(it.label))
	}
}

// valueAxis returns the value axis of a time-series panel for positive
// values in [lo, hi] (lo +Inf: none): by decades around them when log is
// set, else linear from 0 to a round number above hi, as Grafana draws.
func valueAxis(log bool, lo, hi, top, bot float64) svgchart.Axis {
	if !log {
		return svgchart.Axis{Hi: svgchart.NiceCeil(hi), Top: top, Bot: bot}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	a := svgchart.Axis{Log: true, Top: top, Bot: bot,
		Lo: math.Pow(10, math.Floor(math.Log10(lo))), Hi: math.Pow(10, math.Ceil(math.Log10(hi)))}
	if a.Hi <= a.Lo {
		a.Hi = a.Lo * 10
	}
	return a
}

// grafanaColors are the hex values of Grafana's named colors the
// dashboard may use; other names and hex values pass through to SVG.
var grafanaColors = map[string]string{
	"green": "#73BF69", "red": "#F2495C", "yellow": "#FADE2A", "orange": "#FF9830",
	"blue": "#5794F2", "purple": "#B877D9", "dark-red": "#C4162A", "dark-green": "#37872D",
}

// thresholdColor returns the color of v: the last step at or below it.
func thresholdColor(steps []Threshold, v float64) string {
	c := steps[0].Color
	for _, st := range steps {
		if v >= st.Value {
			c = st.Color
		}
	}
	if hex, ok := grafanaColors[c]; ok {
		return hex
	}
	return c
}

// stat draws a stat panel as Grafana does: one tile per series with its
// last value that is not NaN, the name and value as textMode says, colored
// by the thresholds as colorMode says (value: the text; background: the
// tile).
func stat(b *strings.Builder, p PanelData, x, y, w, h float64) {
	const padTop = 30
	n := len(p.Series)
	cols := max(1, min(n, int(w/170)))
	rowsN := (n + cols - 1) / cols
	tw, th := (w-16)/float64(cols), (h-padTop-8)/float64(rowsN)
	showName, showValue := n > 1, true
	switch p.Panel.TextMode {
	case "value":
		showName = false
	case "name":
		showName, showValue = true, false
	case "value_and_name":
		showName = true
	case "none":
		showName, showValue = false, false
	}
	for i, s := range p.Series {
		tx, ty := x+8+float64(i%cols)*tw, y+padTop+float64(i/cols)*th
		last := math.NaN()
		for _, pt := range s.Points {
			if !math.IsNaN(pt.V) {
				last = pt.V
			}
		}
		color := thresholdColor(p.Panel.Thresholds, last)
		text := color
		switch p.Panel.ColorMode {
		case "background":
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="2" fill="%s"/>`, tx+2, ty+2, tw-4, th-4, color)
			text = "white"
		case "none":
			text = "#222"
		}
		fs := math.Min(28, th*0.4)
		var lines []string
		if showName {
			nfs := 13.0 // under the value
			if !showValue {
				nfs = math.Min(20, fs*0.8)
			}
			lines = append(lines, fmt.Sprintf(`font-size="%.0f" fill="%s">%s`, nfs, text, svgchart.Esc(s.Legend)))
		}
		if showValue {
			lines = append(lines, fmt.Sprintf(`font-size="%.0f" font-weight="bold" fill="%s">%s`, fs, text, formatValue(last, p.Panel.Unit)))
		}
		for j, l := range lines {
			cy := ty + th/2 + (float64(j)-float64(len(lines)-1)/2)*fs*1.1 + fs*0.35
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" %s</text>`, tx+tw/2, cy, l)
		}
		b.WriteString("\n")
	}
}
