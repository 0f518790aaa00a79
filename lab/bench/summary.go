//go:build linux

package bench

import (
	"fmt"
	"io"
	"path/filepath"
	"time"
)

// writeGlance writes the table of legitimate clients' success and Caddy's
// CPU per flood scenario and variant: the first table of results.md, and
// what rakebench prints when it is done.
func writeGlance(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "| scenario | variant | new conn. success | established success | Caddy CPU |\n")
	fmt.Fprintf(w, "|---|---|--:|--:|--:|\n")
	for _, sc := range rep.Scenarios {
		if sc.Transfers {
			continue
		}
		for _, v := range rep.Variants {
			s := summaryOf(rep, sc.Name, v.Name)
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", sc.Name, v.Name,
				cell(s, figNewOK, pct), cell(s, figEstOK, pct), cell(s, figCPU, pct))
		}
	}
}

// hasFloods reports whether the report has a flood scenario.
func hasFloods(rep *Report) bool {
	for _, sc := range rep.Scenarios {
		if !sc.Transfers {
			return true
		}
	}
	return false
}

// PrintSummary writes, for the terminal at the end of a run, the table of
// legitimate clients' success and Caddy's CPU (the first table of
// results.md) and where the files went.
func PrintSummary(w io.Writer, rep *Report, o *Options) {
	fmt.Fprintf(w, "\nLegitimate clients during the floods, and Caddy's CPU (medians of %d repetition(s)):\n\n", rep.Settings.Reps)
	if hasFloods(rep) {
		writeGlance(w, rep)
	} else {
		fmt.Fprintf(w, "(no flood scenario in this run)\n")
	}
	fmt.Fprintf(w, "\nFiles: %s (every table), %s (every figure), charts %s\n", filepath.Join(o.Out, "results.md"),
		filepath.Join(o.Out, "results.json"), filepath.Join(o.Out, "*.svg"))
	if o.Readme != "" {
		fmt.Fprintf(w, "README bench section rewritten: %s\n", o.Readme)
	}
}

// timeLeft estimates the time left after done of total runs took elapsed.
func timeLeft(elapsed time.Duration, done, total int) string {
	if done <= 0 {
		return "time left: estimated after the first run"
	}
	left := elapsed / time.Duration(done) * time.Duration(total-done)
	return fmt.Sprintf("about %s left", left.Round(time.Second))
}
