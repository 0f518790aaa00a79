// Package dashboard renders the project's Grafana dashboard
// (deploy/grafana/rakelimit.json) without Grafana: it reads the dashboard's
// panels, parses each panel's PromQL with an evaluator for exactly the subset
// the dashboard uses, evaluates it over scrapes of Caddy's /metrics kept in
// memory, and draws the panels as one SVG page.
//
// Anything outside the subset (another function, operator or variable) is an
// error, never an approximation: the dashboard and its rendering cannot drift
// apart silently.
package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"
)

// Dashboard is the part of a Grafana dashboard the rendering uses.
type Dashboard struct {
	Title     string
	Panels    []Panel
	Variables []Variable
}

// Panel is one panel: its title, type (timeseries or stat), unit, position
// on Grafana's 24-column grid, and queries.
type Panel struct {
	Title   string
	Type    string
	Unit    string
	X, Y    int
	W, H    int
	Targets []Target
	// Log is set when a time-series panel's axis is logarithmic (its
	// scaleDistribution); Grafana's default is linear.
	Log bool
	// TextMode and ColorMode are a stat panel's options (Grafana's names:
	// auto, value, name, value_and_name, none; background, value, none).
	TextMode, ColorMode string
	// Thresholds colour a stat panel's value: the last step whose Value
	// is at most the value gives its color; the first step's Value is
	// -Inf (Grafana's null, the base).
	Thresholds []Threshold
}

// Threshold is one step of a panel's absolute thresholds.
type Threshold struct {
	Value float64
	Color string
}

// defaultThresholds are Grafana's for a new panel: green, red from 80.
var defaultThresholds = []Threshold{{math.Inf(-1), "green"}, {80, "red"}}

// Target is one query of a panel: a PromQL expression and Grafana's legend
// format ({{label}} stands for a label's value).
type Target struct {
	Expr   string
	Legend string
}

// Variable is a templating variable of the dashboard.
type Variable struct {
	Name string
	Type string
	// IncludeAll and AllValue: the value "All" stands for.
	IncludeAll bool
	AllValue   string
}

// The panel types the rendering draws.
const (
	TimeSeries = "timeseries"
	Stat       = "stat"
)

// RateInterval is the name of Grafana's built-in variable for rate windows.
const RateInterval = "__rate_interval"

// jsonPanel mirrors a panel of Grafana's JSON model.
type jsonPanel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit   string `json:"unit"`
			Custom struct {
				ScaleDistribution struct {
					Type string  `json:"type"`
					Log  float64 `json:"log"`
				} `json:"scaleDistribution"`
			} `json:"custom"`
			Thresholds *struct {
				Mode  string `json:"mode"`
				Steps []struct {
					Color string   `json:"color"`
					Value *float64 `json:"value"`
				} `json:"steps"`
			} `json:"thresholds"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Options struct {
		TextMode      string `json:"textMode"`
		ColorMode     string `json:"colorMode"`
		ReduceOptions struct {
			Calcs []string `json:"calcs"`
		} `json:"reduceOptions"`
	} `json:"options"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []jsonPanel `json:"panels"` // a row's panels
}

// Load reads a dashboard from a Grafana JSON file.
func Load(path string) (*Dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the dashboard: %w", err)
	}
	d, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// Parse reads a dashboard from Grafana's JSON model. Rows are flattened;
// panels of types other than timeseries and stat are an error.
func Parse(b []byte) (*Dashboard, error) {
	var j struct {
		Title      string      `json:"title"`
		Panels     []jsonPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				IncludeAll bool   `json:"includeAll"`
				AllValue   string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("parsing the dashboard: %w", err)
	}
	d := &Dashboard{Title: j.Title}
	for _, v := range j.Templating.List {
		d.Variables = append(d.Variables, Variable{Name: v.Name, Type: v.Type, IncludeAll: v.IncludeAll, AllValue: v.AllValue})
	}
	var add func(ps []jsonPanel) error
	add = func(ps []jsonPanel) error {
		for _, p := range ps {
			if p.Type == "row" {
				if err := add(p.Panels); err != nil {
					return err
				}
				continue
			}
			if p.Type != TimeSeries && p.Type != Stat {
				return fmt.Errorf("panel %q: type %q: want %s or %s", p.Title, p.Type, TimeSeries, Stat)
			}
			if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.Y < 0 || p.GridPos.X+p.GridPos.W > 24 {
				return fmt.Errorf("panel %q: gridPos %+v: want x+w within 24 columns, w and h above 0", p.Title, p.GridPos)
			}
			pn, err := panelOptions(p)
			if err != nil {
				return fmt.Errorf("panel %q: %w", p.Title, err)
			}
			for _, t := range p.Targets {
				pn.Targets = append(pn.Targets, Target{Expr: t.Expr, Legend: t.LegendFormat})
			}
			d.Panels = append(d.Panels, pn)
		}
		return nil
	}
	if err := add(j.Panels); err != nil {
		return nil, err
	}
	if len(d.Panels) == 0 {
		return nil, fmt.Errorf("dashboard %q: no panels", d.Title)
	}
	return d, nil
}

// panelOptions reads the options of a panel the rendering follows; options
// it cannot follow are an error.
func panelOptions(p jsonPanel) (Panel, error) {
	def := p.FieldConfig.Defaults
	pn := Panel{Title: p.Title, Type: p.Type, Unit: def.Unit,
		X: p.GridPos.X, Y: p.GridPos.Y, W: p.GridPos.W, H: p.GridPos.H,
		TextMode: p.Options.TextMode, ColorMode: p.Options.ColorMode}
	switch sd := def.Custom.ScaleDistribution; sd.Type {
	case "", "linear":
	case "log":
		if sd.Log != 0 && sd.Log != 10 {
			return pn, fmt.Errorf("scaleDistribution log %v: want base 10", sd.Log)
		}
		pn.Log = true
	default:
		return pn, fmt.Errorf("scaleDistribution %q: want linear or log", sd.Type)
	}
	pn.Thresholds = defaultThresholds
	if th := def.Thresholds; th != nil {
		if th.Mode != "" && th.Mode != "absolute" {
			return pn, fmt.Errorf("thresholds mode %q: want absolute", th.Mode)
		}
		pn.Thresholds = nil
		for i, st := range th.Steps {
			v := math.Inf(-1)
			if st.Value != nil {
				v = *st.Value
			}
			if i > 0 && (st.Value == nil || v <= pn.Thresholds[i-1].Value) {
				return pn, fmt.Errorf("threshold step %d: want a value above the step before", i)
			}
			pn.Thresholds = append(pn.Thresholds, Threshold{Value: v, Color: st.Color})
		}
		if len(pn.Thresholds) == 0 {
			return pn, errors.New("thresholds: no steps")
		}
	}
	if p.Type == Stat {
		switch pn.TextMode {
		case "", "auto", "value", "name", "value_and_name", "none":
		default:
			return pn, fmt.Errorf("textMode %q: want auto, value, name, value_and_name or none", pn.TextMode)
		}
		switch pn.ColorMode {
		case "", "background", "value", "none":
		default:
			return pn, fmt.Errorf("colorMode %q: want background, value or none", pn.ColorMode)
		}
		for _, c := range p.Options.ReduceOptions.Calcs {
			if c != "lastNotNull" && c != "last" {
				return pn, fmt.Errorf("reduceOptions calcs %q: want lastNotNull or last", c)
			}
		}
	}
	return pn, nil
}

// Values returns the value of every variable the panels may use, as a
// rendering of all the data sees them: each query or custom variable at
// "All" (its allValue), and $__rate_interval for scrapes every interval
// (Grafana's value with a short dashboard interval: four scrape intervals).
// A variable whose "All" the rendering cannot know is an error.
func (d *Dashboard) Values(interval time.Duration) (map[string]string, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("scrape interval %v: want above 0", interval)
	}
	vals := map[string]string{RateInterval: (4 * interval).String()}
	for _, v := range d.Variables {
		switch v.Type {
		case "datasource":
			// Names the data source, never appears in a query.
		case "query", "custom":
			if !v.IncludeAll || v.AllValue == "" {
				return nil, fmt.Errorf("variable %s: no allValue: the rendering draws all the data and needs one", v.Name)
			}
			vals[v.Name] = v.AllValue
		default:
			return nil, fmt.Errorf("variable %s: type %q: want query, custom or datasource", v.Name, v.Type)
		}
	}
	return vals, nil
}

// Compiled is a dashboard whose queries are parsed.
type Compiled struct {
	Dashboard *Dashboard
	// Queries holds, per panel, one expression per target.
	Queries [][]*Expr
}

// Compile parses every query of d with the variables in vals. The error
// names the panel and the expression.
func Compile(d *Dashboard, vals map[string]string) (*Compiled, error) {
	c := &Compiled{Dashboard: d}
	for _, p := range d.Panels {
		var qs []*Expr
		for _, t := range p.Targets {
			e, err := ParseExpr(t.Expr, vals)
			if err != nil {
				return nil, fmt.Errorf("panel %q: %w", p.Title, err)
			}
			qs = append(qs, e)
		}
		c.Queries = append(c.Queries, qs)
	}
	return c, nil
}

// Metrics returns the metric names the queries read, sorted.
func (c *Compiled) Metrics() []string {
	var out []string
	for _, qs := range c.Queries {
		for _, q := range qs {
			if !slices.Contains(out, q.Selector.Metric) {
				out = append(out, q.Selector.Metric)
			}
		}
	}
	slices.Sort(out)
	return out
}

// PanelData is a panel with its queries evaluated.
type PanelData struct {
	Panel  Panel
	Series []Line
}

// Line is one series of a panel: its legend and its points.
type Line struct {
	Legend string
	Points []Point
}

// Point is a value at a time.
type Point struct {
	T time.Time
	V float64
}

// Evaluate runs every panel's queries at the time of each scrape.
func (c *Compiled) Evaluate(scrapes []Scrape) []PanelData {
	var out []PanelData
	for i, p := range c.Dashboard.Panels {
		pd := PanelData{Panel: p}
		for j, q := range c.Queries[i] {
			for _, s := range q.Range(scrapes) {
				pd.Series = append(pd.Series, Line{Legend: FormatLegend(p.Targets[j].Legend, s.Labels), Points: s.Points})
			}
		}
		out = append(out, pd)
	}
	return out
}
