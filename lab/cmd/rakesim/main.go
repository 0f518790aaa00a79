// Command rakesim runs the limiter against a scenario in virtual time and
// writes, for each scenario, NAME.csv (second,stream,offered,forwarded) and
// NAME.svg (a chart of the same numbers) into the output directory.
//
//	go run ./cmd/rakesim -scenario paper-4 -out /tmp/sim
//	go run ./cmd/rakesim -scenario all -out /tmp/sim
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/lab/sim"
)

func main() {
	name := flag.String("scenario", "all", "scenario to run, or all")
	out := flag.String("out", ".", "directory for NAME.csv and NAME.svg")
	seed := flag.Uint64("seed", 1, "seed for the hash key, arrivals and random draws")
	flag.Parse()
	if err := run(*name, *out, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "rakesim:", err)
		os.Exit(1)
	}
}

func run(name, out string, seed uint64) error {
	var scenarios []*sim.Scenario
	if name == "all" {
		scenarios = sim.Scenarios()
	} else if s := sim.Find(name); s != nil {
		scenarios = []*sim.Scenario{s}
	} else {
		var names []string
		for _, s := range sim.Scenarios() {
			names = append(names, s.Name)
		}
		return fmt.Errorf("unknown scenario %q: want all or one of %s", name, strings.Join(names, ", "))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	for _, s := range scenarios {
		res, err := sim.Run(s, seed)
		if err != nil {
			return err
		}
		if err := write(filepath.Join(out, s.Name+".csv"), res.WriteCSV); err != nil {
			return err
		}
		if err := write(filepath.Join(out, s.Name+".svg"), res.WriteSVG); err != nil {
			return err
		}
		fmt.Printf("%-17s %s\n", s.Name, summary(res))
	}
	return nil
}

func write(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// summary totals each stream over the run.
func summary(r *sim.Result) string {
	var parts []string
	for _, stream := range []string{sim.Flood, sim.Legit} {
		off, fwd := 0, 0
		for _, row := range r.Series(stream) {
			off += row.Offered
			fwd += row.Forwarded
		}
		if off > 0 {
			parts = append(parts, fmt.Sprintf("%s %d/%d forwarded", stream, fwd, off))
		}
	}
	if len(r.Totals) > 0 {
		var caps []string
		lost := 0
		for _, t := range r.Totals {
			lost += t.Lost
			if t.Cap == 0 {
				caps = append(caps, "-")
			} else {
				caps = append(caps, strconv.FormatUint(uint64(t.Cap), 10))
			}
		}
		parts = append(parts, fmt.Sprintf("lost to the full queue %d; total at each second's end (- lifted): %s",
			lost, strings.Join(caps, " ")))
	}
	return strings.Join(parts, ", ")
}
