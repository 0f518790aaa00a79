// Package svgchart holds the small pieces the project's SVG charts share: a
// value axis that turns logarithmic when the values span decades, its ticks,
// short numbers for labels, and escaping of text.
package svgchart

import (
	"math"
	"strconv"
	"strings"
)

// Axis maps values to positions between Top and Bot (SVG user units; Bot is
// where the smallest value sits), linearly from zero or by decades.
type Axis struct {
	// Log is set when the axis is logarithmic.
	Log bool
	// Lo and Hi are the values at Bot and Top (Lo is 0 on a linear axis).
	Lo, Hi   float64
	Top, Bot float64
}

// NewAxis returns an axis for values in [lo, hi]: logarithmic when hi is
// more than a hundred times lo (lo taken as at least 1), else linear from 0
// to a round number above hi.
func NewAxis(lo, hi, top, bot float64) Axis {
	a := Axis{Top: top, Bot: bot}
	if hi/math.Max(lo, 1) > 100 {
		a.Log = true
		a.Lo = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 1))))
		a.Hi = math.Pow(10, math.Ceil(math.Log10(hi)))
		return a
	}
	a.Hi = NiceCeil(hi * 1.1)
	return a
}

// Pos returns the position of v. On a log axis values below Lo sit on Lo.
func (a Axis) Pos(v float64) float64 {
	f := v / a.Hi
	if a.Log {
		v = math.Max(v, a.Lo)
		f = math.Log10(v/a.Lo) / math.Log10(a.Hi/a.Lo)
	}
	return a.Bot - f*(a.Bot-a.Top)
}

// Ticks returns the values to label: each decade on a log axis, six evenly
// spaced values from 0 on a linear one.
func (a Axis) Ticks() []float64 {
	var t []float64
	if a.Log {
		for v := a.Lo; v <= a.Hi*1.0001; v *= 10 {
			t = append(t, v)
		}
		return t
	}
	for i := range 6 {
		t = append(t, a.Hi*float64(i)/5)
	}
	return t
}

// NiceCeil rounds v up to 1, 2 or 5 times a power of ten; 1 for v <= 0.
func NiceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// Human formats v with at most four significant digits and a k or M suffix.
func Human(v float64) string {
	switch {
	case math.Abs(v) >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + "M"
	case math.Abs(v) >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// Esc escapes text for an SVG text node or attribute value.
func Esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
