package dashboard

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/common/model"
)

// The PromQL subset, exactly what the dashboard uses:
//
//	expr     = [ agg "by" "(" labels ")" "(" inner ")" | inner ] [ cmp number ]
//	agg      = "sum" | "max" | "min"
//	inner    = "rate" "(" selector "[" duration "]" ")" | selector
//	selector = metric [ "{" [ matcher { "," matcher } ] "}" ]
//	matcher  = label ( "=" | "!=" | "=~" | "!~" ) string
//	cmp      = "==" | "!=" | ">" | "<" | ">=" | "<="
//
// Variables ($name, ${name}) are replaced by their values before parsing.
// A comparison filters, as PromQL's without bool does.

// Expr is a parsed expression of the subset.
type Expr struct {
	// Text is the expression as written, variables replaced.
	Text string
	// Agg is sum, max or min, empty for none; By the labels it keeps.
	Agg string
	By  []string
	// Window is the rate's range; zero: no rate.
	Window   time.Duration
	Selector Selector
	// Cmp is the comparison, empty for none, against CmpValue.
	Cmp      string
	CmpValue float64
}

// Selector picks series by metric name and label matchers.
type Selector struct {
	Metric   string
	Matchers []Matcher
}

// Matcher is one label matcher.
type Matcher struct {
	Label, Op, Value string
	re               *regexp.Regexp
}

// matches reports whether a label's value (empty when absent) matches.
func (m Matcher) matches(v string) bool {
	switch m.Op {
	case "=":
		return v == m.Value
	case "!=":
		return v != m.Value
	case "=~":
		return m.re.MatchString(v)
	default: // "!~"
		return !m.re.MatchString(v)
	}
}

var varRe = regexp.MustCompile(`\$(?:\{(\w+)\}|(\w+))`)

// ParseExpr parses an expression of the subset after replacing the
// variables in vals. Anything outside the subset is an error naming it.
func ParseExpr(text string, vals map[string]string) (*Expr, error) {
	var missing []string
	expanded := varRe.ReplaceAllStringFunc(text, func(s string) string {
		m := varRe.FindStringSubmatch(s)
		name := m[1] + m[2]
		v, ok := vals[name]
		if !ok {
			missing = append(missing, "$"+name)
		}
		return v
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("expression %q: unknown variable %s", text, strings.Join(missing, ", "))
	}
	toks, err := lex(expanded)
	if err != nil {
		return nil, fmt.Errorf("expression %q: %w", text, err)
	}
	p := &parser{toks: toks}
	e, err := p.expr()
	if err != nil {
		return nil, fmt.Errorf("expression %q: %w", text, err)
	}
	e.Text = expanded
	return e, nil
}

// token kinds.
const (
	tIdent = iota
	tString
	tNumber
	tDuration // the text between [ and ]
	tPunct
	tEOF
)

type token struct {
	kind int
	text string
}

func (t token) String() string {
	if t.kind == tEOF {
		return "the end"
	}
	return strconv.Quote(t.text)
}

// lex splits an expression into tokens.
func lex(s string) ([]token, error) {
	var out []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || c == ':' || unicode.IsLetter(rune(c)):
			j := i
			for j < len(s) && (s[j] == '_' || s[j] == ':' || unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j]))) {
				j++
			}
			out = append(out, token{tIdent, s[i:j]})
			i = j
		case unicode.IsDigit(rune(c)) || c == '.':
			j := i
			for j < len(s) && (unicode.IsDigit(rune(s[j])) || s[j] == '.' || s[j] == 'e' || s[j] == 'E') {
				j++
			}
			out = append(out, token{tNumber, s[i:j]})
			i = j
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string at offset %d", i)
			}
			raw := s[i : j+1]
			if c == '\'' {
				raw = `"` + strings.ReplaceAll(raw[1:len(raw)-1], `"`, `\"`) + `"`
			}
			v, err := strconv.Unquote(raw)
			if err != nil {
				return nil, fmt.Errorf("string %s: %w", s[i:j+1], err)
			}
			out = append(out, token{tString, v})
			i = j + 1
		case c == '[':
			j := strings.IndexByte(s[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated [ at offset %d", i)
			}
			out = append(out, token{tDuration, strings.TrimSpace(s[i+1 : i+j])})
			i += j + 1
		default:
			two := ""
			if i+1 < len(s) {
				two = s[i : i+2]
			}
			switch two {
			case "==", "!=", "=~", "!~", ">=", "<=":
				out = append(out, token{tPunct, two})
				i += 2
				continue
			}
			if !strings.ContainsRune("(){},=<>", rune(c)) {
				return nil, fmt.Errorf("unsupported character %q at offset %d", c, i)
			}
			out = append(out, token{tPunct, string(c)})
			i++
		}
	}
	return append(out, token{kind: tEOF}), nil
}

type parser struct {
	toks []token
	pos  int
}

func (p *parser) peek() token { return p.toks[p.pos] }
func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tEOF {
		p.pos++
	}
	return t
}

func (p *parser) punct(s string) error {
	if t := p.next(); t.kind != tPunct || t.text != s {
		return fmt.Errorf("want %q, got %s", s, t)
	}
	return nil
}

func (p *parser) expr() (*Expr, error) {
	e := &Expr{}
	t := p.peek()
	if t.kind == tIdent && (t.text == "sum" || t.text == "max" || t.text == "min") {
		p.next()
		e.Agg = t.text
		if by := p.next(); by.kind != tIdent || by.text != "by" {
			return nil, fmt.Errorf("%s: want by (labels) right after it, got %s (the subset has no other form)", e.Agg, by)
		}
		labels, err := p.labels()
		if err != nil {
			return nil, err
		}
		e.By = labels
		if err := p.punct("("); err != nil {
			return nil, err
		}
		if err := p.inner(e); err != nil {
			return nil, err
		}
		if err := p.punct(")"); err != nil {
			return nil, err
		}
	} else if err := p.inner(e); err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind == tPunct {
		switch t.text {
		case "==", "!=", ">", "<", ">=", "<=":
			p.next()
			n := p.next()
			if n.kind != tNumber {
				return nil, fmt.Errorf("comparison %s: want a number, got %s", t.text, n)
			}
			v, err := strconv.ParseFloat(n.text, 64)
			if err != nil {
				return nil, fmt.Errorf("comparison %s: number %s: %w", t.text, n.text, err)
			}
			e.Cmp, e.CmpValue = t.text, v
		}
	}
	if t := p.next(); t.kind != tEOF {
		return nil, fmt.Errorf("unsupported %s after the expression", t)
	}
	return e, nil
}

// labels parses "(" label { "," label } ")".
func (p *parser) labels() ([]string, error) {
	if err := p.punct("("); err != nil {
		return nil, err
	}
	var out []string
	for {
		t := p.next()
		if t.kind != tIdent {
			return nil, fmt.Errorf("by: want a label, got %s", t)
		}
		out = append(out, t.text)
		if t := p.next(); t.kind == tPunct && t.text == ")" {
			return out, nil
		} else if t.kind != tPunct || t.text != "," {
			return nil, fmt.Errorf("by: want , or ), got %s", t)
		}
	}
}

// inner parses a rate or a selector into e.
func (p *parser) inner(e *Expr) error {
	t := p.peek()
	if t.kind != tIdent {
		return fmt.Errorf("want a metric or rate(, got %s", t)
	}
	if n := p.toks[p.pos+1]; n.kind == tIdent && (n.text == "by" || n.text == "without") {
		return fmt.Errorf("unsupported function or aggregation %s (the subset has rate, and sum, max, min by)", t.text)
	}
	if p.toks[p.pos+1].kind == tPunct && p.toks[p.pos+1].text == "(" {
		if t.text != "rate" {
			return fmt.Errorf("unsupported function or aggregation %s (the subset has rate, and sum, max, min by)", t.text)
		}
		p.next()
		p.next()
		if err := p.selector(&e.Selector); err != nil {
			return err
		}
		w := p.next()
		if w.kind != tDuration {
			return fmt.Errorf("rate: want a range [duration], got %s", w)
		}
		d, err := model.ParseDuration(w.text)
		if err != nil || d <= 0 {
			return fmt.Errorf("rate: range [%s]: want a duration above 0", w.text)
		}
		e.Window = time.Duration(d)
		return p.punct(")")
	}
	return p.selector(&e.Selector)
}

// selector parses metric [ "{" matchers "}" ].
func (p *parser) selector(s *Selector) error {
	t := p.next()
	if t.kind != tIdent {
		return fmt.Errorf("want a metric name, got %s", t)
	}
	s.Metric = t.text
	if n := p.peek(); n.kind != tPunct || n.text != "{" {
		return nil
	}
	p.next()
	for {
		t := p.next()
		if t.kind == tPunct && t.text == "}" {
			return nil
		}
		if t.kind != tIdent {
			return fmt.Errorf("%s{: want a label, got %s", s.Metric, t)
		}
		op := p.next()
		if op.kind != tPunct || (op.text != "=" && op.text != "!=" && op.text != "=~" && op.text != "!~") {
			return fmt.Errorf("%s{%s: want =, !=, =~ or !~, got %s", s.Metric, t.text, op)
		}
		v := p.next()
		if v.kind != tString {
			return fmt.Errorf("%s{%s%s: want a string, got %s", s.Metric, t.text, op.text, v)
		}
		m := Matcher{Label: t.text, Op: op.text, Value: v.text}
		if op.text == "=~" || op.text == "!~" {
			re, err := regexp.Compile("^(?:" + v.text + ")$")
			if err != nil {
				return fmt.Errorf("%s{%s%s%q}: %w", s.Metric, t.text, op.text, v.text, err)
			}
			m.re = re
		}
		s.Matchers = append(s.Matchers, m)
		if n := p.peek(); n.kind == tPunct && n.text == "," {
			p.next()
		}
	}
}

// Series is one labelled series of an expression's result over time.
type Series struct {
	Labels map[string]string
	Points []Point
}

// Instant evaluates e at the time of scrapes[i], with the earlier scrapes
// for a rate's range: one value per label set, keyed by labelKey.
func (e *Expr) Instant(scrapes []Scrape, i int) map[string]Sample {
	var vec map[string]Sample
	if e.Window > 0 {
		vec = e.rate(scrapes, i)
	} else {
		vec = map[string]Sample{}
		for _, s := range scrapes[i].Samples {
			if e.Selector.matches(s) {
				vec[labelKey(s.Labels)] = s
			}
		}
	}
	if e.Agg != "" {
		vec = e.aggregate(vec)
	}
	if e.Cmp != "" {
		for k, s := range vec {
			if !compare(e.Cmp, s.Value, e.CmpValue) {
				delete(vec, k)
			}
		}
	}
	return vec
}

// Range evaluates e at the time of every scrape; series are in the order of
// their labels.
func (e *Expr) Range(scrapes []Scrape) []Series {
	byKey := map[string]*Series{}
	var keys []string
	for i := range scrapes {
		for k, s := range e.Instant(scrapes, i) {
			ser := byKey[k]
			if ser == nil {
				ser = &Series{Labels: s.Labels}
				byKey[k] = ser
				keys = append(keys, k)
			}
			ser.Points = append(ser.Points, Point{T: scrapes[i].At, V: s.Value})
		}
	}
	sortStrings(keys)
	out := make([]Series, 0, len(keys))
	for _, k := range keys {
		out = append(out, *byKey[k])
	}
	return out
}

func (s Selector) matches(x Sample) bool {
	if x.Metric != s.Metric {
		return false
	}
	for _, m := range s.Matchers {
		if !m.matches(x.Labels[m.Label]) {
			return false
		}
	}
	return true
}

// rate is PromQL's rate over the samples in (t-Window, t]: the increase
// (counter resets taken as restarts from zero) over the time between the
// first and the last sample. With regular scrapes this is what Prometheus
// returns after its extrapolation to the range's ends; a series needs two
// samples in the range. The metric name is dropped, as in PromQL.
func (e *Expr) rate(scrapes []Scrape, i int) map[string]Sample {
	end := scrapes[i].At
	start := end.Add(-e.Window)
	type acc struct {
		labels        map[string]string
		last          Sample
		firstT, lastT time.Time
		increase      float64
		n             int
	}
	accs := map[string]*acc{}
	for j := 0; j <= i; j++ {
		sc := scrapes[j]
		if !sc.At.After(start) {
			continue
		}
		for _, s := range sc.Samples {
			if !e.Selector.matches(s) {
				continue
			}
			k := labelKey(s.Labels)
			a := accs[k]
			if a == nil {
				accs[k] = &acc{labels: s.Labels, last: s, firstT: sc.At, lastT: sc.At, n: 1}
				continue
			}
			d := s.Value - a.last.Value
			if d < 0 {
				d = s.Value // a reset: the counter restarted from zero
			}
			a.increase += d
			a.last, a.lastT = s, sc.At
			a.n++
		}
	}
	out := map[string]Sample{}
	for k, a := range accs {
		secs := a.lastT.Sub(a.firstT).Seconds()
		if a.n < 2 || secs <= 0 {
			continue
		}
		labels := map[string]string{}
		for n, v := range a.labels {
			labels[n] = v
		}
		out[k] = Sample{Labels: labels, Value: a.increase / secs}
	}
	return out
}

// aggregate groups vec by the By labels (absent: empty) and applies Agg.
func (e *Expr) aggregate(vec map[string]Sample) map[string]Sample {
	out := map[string]Sample{}
	for _, k := range sortedKeys(vec) {
		s := vec[k]
		labels := map[string]string{}
		for _, l := range e.By {
			if v := s.Labels[l]; v != "" {
				labels[l] = v
			}
		}
		gk := labelKey(labels)
		g, ok := out[gk]
		switch {
		case !ok:
			g = Sample{Labels: labels, Value: s.Value}
		case e.Agg == "sum":
			g.Value += s.Value
		case e.Agg == "max":
			g.Value = max(g.Value, s.Value)
		default: // min
			g.Value = min(g.Value, s.Value)
		}
		out[gk] = g
	}
	return out
}

func compare(op string, a, b float64) bool {
	switch op {
	case "==":
		return a == b
	case "!=":
		return a != b
	case ">":
		return a > b
	case "<":
		return a < b
	case ">=":
		return a >= b
	default: // "<="
		return a <= b
	}
}

var legendRe = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// FormatLegend applies a Grafana legend format to a series' labels: each
// {{label}} becomes the label's value. An empty format (or __auto) gives
// the labels as PromQL prints them.
func FormatLegend(format string, labels map[string]string) string {
	if format == "" || format == "__auto" {
		var parts []string
		for _, k := range sortedKeys(labels) {
			parts = append(parts, fmt.Sprintf("%s=%q", k, labels[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return legendRe.ReplaceAllStringFunc(format, func(s string) string {
		return labels[legendRe.FindStringSubmatch(s)[1]]
	})
}
