//go:build linux

package xdpbench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Report is a run's samples and their summary.
type Report struct {
	Machine string   `json:"machine"`
	Options Options  `json:"options"`
	Samples []Sample `json:"samples"`
	Rows    []Row    `json:"rows"`
	Ratios  []Ratio  `json:"ratios"`
}

// Row is the medians of one mode under one flood at one rate.
type Row struct {
	Mode       string  `json:"mode"`
	Flood      string  `json:"flood"`
	Rate       int     `json:"rate"`
	SentPPS    float64 `json:"sent_pps"`
	DroppedPPS float64 `json:"dropped_pps"`
	PassedPPS  float64 `json:"passed_pps"`
	// SoftirqPct and CaddyPct are CPU shares of one core.
	SoftirqPct float64 `json:"softirq_pct"`
	CaddyPct   float64 `json:"caddy_pct"`
	NsPerDrop  float64 `json:"ns_per_drop"`
	Legit      float64 `json:"legit"`
}

// Ratio compares the modes under one flood at one rate: medians of the
// per-repetition ratios of the XDP program's figure to the socket filter's.
type Ratio struct {
	Flood string `json:"flood"`
	Rate  int    `json:"rate"`
	// NsPerDrop is xdp / bpf of the receiving CPU per dropped datagram;
	// SentPPS of the rate the sender reached.
	NsPerDrop float64 `json:"ns_per_drop"`
	SentPPS   float64 `json:"sent_pps"`
	// FloorNsPerDrop is xdp-floor / bpf of the receiving CPU per dropped
	// datagram (0 without the floor): the least that ratio can be here.
	FloorNsPerDrop float64 `json:"floor_ns_per_drop,omitempty"`
}

// paired returns the medians over the repetitions of mode's receiving CPU
// per drop and rate sent, each divided by the socket filter's in the same
// repetition, under the flood and rate of k.
func paired(samples []Sample, k key, mode string) (nsPerDrop, sentPPS float64, ok bool) {
	var ns, sent []float64
	for _, a := range samples {
		if a.Flood != k.flood || a.Rate != k.rate || a.Mode != mode {
			continue
		}
		for _, b := range samples {
			if b.Flood == a.Flood && b.Rate == a.Rate && b.Rep == a.Rep && b.Mode == Modes[0] && b.NsPerDrop() > 0 && b.Sent > 0 {
				ns, sent = append(ns, a.NsPerDrop()/b.NsPerDrop()), append(sent, a.SentPPS()/b.SentPPS())
			}
		}
	}
	return median(ns), median(sent), len(ns) > 0
}

// median is the median of v (the mean of the middle two for an even
// count); 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// key names a flood at a rate.
type key struct {
	flood string
	rate  int
}

// summarize computes the rows and the ratios from the samples.
func (r *Report) summarize() { r.Rows, r.Ratios = Summarize(r.Samples) }

// Summarize computes the rows (medians per flood, rate and mode, the
// socket filter first) and the ratios (medians of the per-repetition
// ratios to the socket filter, under each flood and rate) of samples.
func Summarize(samples []Sample) (rows []Row, ratios []Ratio) {
	var keys []key
	for _, s := range samples {
		if k := (key{s.Flood, s.Rate}); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	modes := slices.Clone(Modes)
	for _, s := range samples {
		if !slices.Contains(modes, s.Mode) {
			modes = append(modes, s.Mode)
		}
	}
	for _, k := range keys {
		for _, mode := range modes {
			var sent, dropped, passed, soft, cad, ns, legit []float64
			for _, s := range samples {
				if s.Flood != k.flood || s.Rate != k.rate || s.Mode != mode || s.Seconds <= 0 {
					continue
				}
				sent, dropped = append(sent, s.SentPPS()), append(dropped, s.DroppedPPS())
				passed = append(passed, float64(s.Passed)/s.Seconds)
				soft, cad = append(soft, 100*s.SoftirqSeconds/s.Seconds), append(cad, 100*s.CaddySeconds/s.Seconds)
				ns, legit = append(ns, s.NsPerDrop()), append(legit, s.LegitShare())
			}
			if len(sent) == 0 {
				continue
			}
			rows = append(rows, Row{Mode: mode, Flood: k.flood, Rate: k.rate, SentPPS: median(sent), DroppedPPS: median(dropped),
				PassedPPS: median(passed), SoftirqPct: median(soft), CaddyPct: median(cad), NsPerDrop: median(ns), Legit: median(legit)})
		}
		if ns, sent, ok := paired(samples, k, Modes[1]); ok {
			floor, _, _ := paired(samples, k, ModeFloor)
			ratios = append(ratios, Ratio{Flood: k.flood, Rate: k.rate, NsPerDrop: ns, SentPPS: sent, FloorNsPerDrop: floor})
		}
	}
	return rows, ratios
}

// line is a sample's progress line.
func (s Sample) line() string {
	return fmt.Sprintf("%s flood at %s, mode %s, repetition %d: sent %.0f/s, dropped %.0f/s, softirq %.2f s, caddy %.2f s, "+
		"%.0f ns per drop, legit %d/%d", s.Flood, rateName(s.Rate), s.Mode, s.Rep, s.SentPPS(), s.DroppedPPS(),
		s.SoftirqSeconds, s.CaddySeconds, s.NsPerDrop(), s.LegitOK, s.LegitTotal)
}

// Markdown is the report as results.md.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The socket filter against the XDP program\n\n")
	fmt.Fprintf(&b, "%s; %d repetitions of %v floods across a veth, modes interleaved; medians.\n\n", r.Machine,
		r.Options.Reps, r.Options.For)
	WriteTables(&b, r.Rows, r.Ratios)
	fmt.Fprintf(&b, "\nSender: %s. Receiving CPU: the machine's softirq time (the veth's receive path, wherever it ran) and "+
		"Caddy's, per datagram the limiter dropped. CPU shares are of one core. Sent: what the sender handed the veth, "+
		"whose receive ring drops what its receiver does not take in time: sent less dropped and passed is what never reached the program. %s: Caddy in mode bpf behind an XDP program that "+
		"drops the flood's frames and does nothing else; its drops are the frames that program saw.\n", senderName(r.Options.Sender), ModeFloor)
	return b.String()
}

// WriteTables writes rows and ratios as results.md's two tables: the
// medians per flood, rate and mode, then xdp / bpf and the floor / bpf.
func WriteTables(w io.Writer, rows []Row, ratios []Ratio) {
	fmt.Fprintf(w, "| flood | rate | mode | sent/s | dropped/s | passed/s | softirq CPU | Caddy CPU | receiving CPU per drop | legit requests |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %.0f | %.0f | %.1f%% | %.1f%% | %.0f ns | %.1f%% |\n", row.Flood, rateName(row.Rate),
			row.Mode, row.SentPPS, row.DroppedPPS, row.PassedPPS, row.SoftirqPct, row.CaddyPct, row.NsPerDrop, 100*row.Legit)
	}
	if len(ratios) > 0 {
		fmt.Fprintf(w, "\nxdp / bpf (and %s / bpf), medians of the per-repetition ratios:\n\n"+
			"| flood | rate | receiving CPU per drop | rate sent | the floor's receiving CPU per drop |\n|---|---|---|---|---|\n", ModeFloor)
		for _, q := range ratios {
			floor := "not measured"
			if q.FloorNsPerDrop > 0 {
				floor = fmt.Sprintf("%.2f", q.FloorNsPerDrop)
			}
			fmt.Fprintf(w, "| %s | %s | %.2f | %.2f | %s |\n", q.Flood, rateName(q.Rate), q.NsPerDrop, q.SentPPS, floor)
		}
	}
}

// senderName says how the flood was sent.
func senderName(sender string) string {
	if sender == SenderSocket {
		return "UDP sockets (sendmmsg): the veth receives socket buffers the sender allocated"
	}
	return "XDP frames redirected into the veth (BPF_PROG_TEST_RUN, live frames), as a NIC's driver hands them over"
}

// write writes results.md and results.json into dir.
func (r *Report) write(dir string) error {
	return WriteResults(dir, r, r.Markdown())
}

// WriteResults writes a lab command's results into dir: results.json, v
// as indented JSON, and results.md, markdown.
func WriteResults(dir string, v any, markdown string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing the results: %w", err)
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("writing results.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(markdown), 0o644); err != nil {
		return fmt.Errorf("writing results.md: %w", err)
	}
	return nil
}
