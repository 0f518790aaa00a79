package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/lab/svgchart"
)

// WriteCSV writes the report with the header second,stream,offered,forwarded.
func (r *Result) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"second", "stream", "offered", "forwarded"}); err != nil {
		return err
	}
	for _, row := range r.Rows {
		rec := []string{strconv.Itoa(row.Second), row.Stream, strconv.Itoa(row.Offered), strconv.Itoa(row.Forwarded)}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 960, 540
	padL, padR     = 90, 30
	padT, padB     = 90, 100
)

type line struct {
	stream, label, color string
	dashed               bool
	value                func(Row) int
}

// WriteSVG draws offered and forwarded packets per second for each stream,
// with the configured limit as a reference line. The y axis is logarithmic
// when the values span more than two decades.
func (r *Result) WriteSVG(w io.Writer) error {
	lines := []line{
		{Flood, "flood offered", "#d62728", true, func(x Row) int { return x.Offered }},
		{Flood, "flood forwarded", "#d62728", false, func(x Row) int { return x.Forwarded }},
		{Legit, "legit offered", "#1f77b4", true, func(x Row) int { return x.Offered }},
		{Legit, "legit forwarded", "#1f77b4", false, func(x Row) int { return x.Forwarded }},
	}
	limit := float64(r.Scenario.Config.Limit)
	lo, hi := limit, limit
	for _, l := range lines {
		for _, row := range r.Series(l.stream) {
			if v := float64(l.value(row)); v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	y := svgchart.NewAxis(lo, hi, padT, chartH-padB)
	secs := float64(r.Scenario.Seconds)
	xOf := func(s float64) float64 { return padL + s/secs*(chartW-padL-padR) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="28" font-size="18" font-weight="bold">%s</text>`+"\n", padL, svgchart.Esc(r.Scenario.Name))
	fmt.Fprintf(&b, `<text x="%d" y="50">%s</text>`+"\n", padL, svgchart.Esc(r.Scenario.Description))
	fmt.Fprintf(&b, `<text x="%d" y="70" fill="#555">limit %d pps, window %v; one point per second</text>`+"\n",
		padL, r.Scenario.Config.Limit, r.Scenario.Config.Window)

	// Axes, ticks and grid.
	fmt.Fprintf(&b, `<g stroke="#999" stroke-width="1">`)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d"/>`, padL, padT, padL, chartH-padB)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d"/>`, padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(&b, "</g>\n")
	for _, t := range y.Ticks() {
		py := y.Pos(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`, padL, py, chartW-padR, py)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, py+4, svgchart.Human(t))
	}
	step := max(1, int(math.Ceil(secs/12)))
	for s := 0; s <= r.Scenario.Seconds; s += step {
		px := xOf(float64(s))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`, px, chartH-padB, px, chartH-padB+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", px, chartH-padB+20, s)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time (s)</text>`+"\n", (padL+chartW-padR)/2, chartH-padB+48)
	ylabel := "packets per second"
	if y.Log {
		ylabel += " (log scale)"
	}
	fmt.Fprintf(&b, `<text transform="translate(24 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (padT+chartH-padB)/2, ylabel)

	// The limit.
	ly := y.Pos(limit)
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#2ca02c" stroke-dasharray="2 4" stroke-width="2"/>`,
		padL, ly, chartW-padR, ly)
	fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="#2ca02c" text-anchor="end">limit</text>`+"\n", chartW-padR-4, ly-6)

	// Series: each second's count is drawn at the middle of that second.
	legend := 0
	for _, l := range lines {
		rows := r.Series(l.stream)
		if len(rows) == 0 {
			continue
		}
		var pts []string
		for _, row := range rows {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(float64(row.Second)+0.5), y.Pos(float64(l.value(row)))))
		}
		dash := ""
		if l.dashed {
			dash = ` stroke-dasharray="7 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", l.color, dash, strings.Join(pts, " "))
		lx, lyy := padL+legend*200, chartH-18
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, lx, lyy, lx+30, lyy, l.color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+38, lyy+4, l.label)
		legend++
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
