//go:build linux

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Markers of the bench section of the README.
const (
	readmeBegin = "<!-- bench:begin -->"
	readmeEnd   = "<!-- bench:end -->"
)

// updateReadme replaces the bench section of readme with the charts of dir
// and where they came from.
func updateReadme(readme, dir string, rep *Report) error {
	b, err := os.ReadFile(readme)
	if err != nil {
		return fmt.Errorf("-readme: %w", err)
	}
	text := string(b)
	i, j := strings.Index(text, readmeBegin), strings.Index(text, readmeEnd)
	if i < 0 || j < i {
		return fmt.Errorf("-readme %s: no %s ... %s section", readme, readmeBegin, readmeEnd)
	}
	rel, err := filepath.Rel(filepath.Dir(readme), dir)
	if err != nil {
		return fmt.Errorf("-readme: %w", err)
	}
	rel = filepath.ToSlash(rel)
	var s strings.Builder
	s.WriteString(readmeBegin + "\n")
	m := rep.Machine
	fmt.Fprintf(&s, "From `%s` on %s: %s, %d cores, %s; %s",
		shellJoin(rep.Command), rep.Date[:10], m.CPU, m.Cores, m.Kernel, m.Caddy)
	if m.Revision != "" {
		fmt.Fprintf(&s, ", commit %s", shortRev(m.Revision))
	}
	fmt.Fprintf(&s, "; medians of %d repetitions. Tables: [%s/results.md](%s/results.md).\n\n", rep.Settings.Reps, rel, rel)
	for _, ch := range charts(rep) {
		fmt.Fprintf(&s, "![%s](%s/%s)\n", ch.title, rel, ch.file)
	}
	s.WriteString(readmeEnd)
	out := text[:i] + s.String() + text[j+len(readmeEnd):]
	if err := os.WriteFile(readme, []byte(out), 0o644); err != nil {
		return fmt.Errorf("-readme: writing %s: %w", readme, err)
	}
	return nil
}

// shellJoin joins a command's arguments as a shell reads them back: an
// argument with spaces or shell characters in single quotes.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"$`\\|&;<>(){}*?[]#~") {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
