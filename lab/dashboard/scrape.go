package dashboard

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one reading of a /metrics page.
type Scrape struct {
	At      time.Time
	Samples []Sample
}

// Sample is one series' value in a scrape.
type Sample struct {
	Metric string
	Labels map[string]string
	Value  float64
}

// ParseScrape reads a Prometheus text exposition taken at at, keeping the
// counters, gauges and untyped metrics whose names keep accepts (nil: all).
// Histograms and summaries are left out: the subset never reads them.
func ParseScrape(at time.Time, r io.Reader, keep func(metric string) bool) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Scrape{}, fmt.Errorf("parsing metrics: %w", err)
	}
	sc := Scrape{At: at}
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		if keep != nil && !keep(name) {
			continue
		}
		fam := fams[name]
		for _, m := range fam.GetMetric() {
			var v float64
			switch fam.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			sc.Samples = append(sc.Samples, Sample{Metric: name, Labels: labels, Value: v})
		}
	}
	return sc, nil
}

// labelKey identifies a label set.
func labelKey(labels map[string]string) string {
	var b strings.Builder
	for _, k := range sortedKeys(labels) {
		fmt.Fprintf(&b, "%s=%q,", k, labels[k])
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func sortStrings(s []string) { slices.Sort(s) }
