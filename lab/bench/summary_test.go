//go:build linux

package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPrintSummary checks what rakebench prints at the end: the first table
// of results.md, line for line, and where the files went.
func TestPrintSummary(t *testing.T) {
	rep := fixedReport()
	out := t.TempDir()
	o := &Options{Out: out, Readme: "README.md"}
	if err := writeOutputs(rep, out, ""); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	PrintSummary(&b, rep, o)
	printed := b.String()
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The first table of results.md.
	var first []string
	for _, line := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(line, "|") {
			first = append(first, line)
		} else if len(first) > 0 {
			break
		}
	}
	if len(first) != 2+2*2 { // header, rule, two flood scenarios by two variants
		t.Fatalf("the first table of results.md has %d lines:\n%s", len(first), strings.Join(first, "\n"))
	}
	if !strings.Contains(printed, strings.Join(first, "\n")+"\n") {
		t.Errorf("the printed summary lacks the first table of results.md:\n%s\nprinted:\n%s", strings.Join(first, "\n"), printed)
	}
	for _, want := range []string{
		"| scenario | variant | new conn. success | established success | Caddy CPU |",
		"| one-source | plain | 60.0% | 100.0% | 80.0% |",
		"| one-source | rakelimit | 100.0% (1.67×) | 100.0% (1.00×) | 20.0% (0.25×) |",
		"Files: " + filepath.Join(out, "results.md"),
		"README bench section rewritten: README.md",
	} {
		if !strings.Contains(printed, want) {
			t.Errorf("the printed summary lacks %q:\n%s", want, printed)
		}
	}
	if strings.Contains(printed, "| transfers |") {
		t.Errorf("the summary lists the transfers, which have no flood:\n%s", printed)
	}
}

func TestTimeLeft(t *testing.T) {
	tests := []struct {
		elapsed     time.Duration
		done, total int
		want        string
	}{
		{0, 0, 10, "time left: estimated after the first run"},
		{time.Minute, 1, 10, "about 9m0s left"},
		{90 * time.Second, 3, 4, "about 30s left"},
		{time.Minute, 4, 4, "about 0s left"},
	}
	for _, tt := range tests {
		if got := timeLeft(tt.elapsed, tt.done, tt.total); got != tt.want {
			t.Errorf("timeLeft(%v, %d, %d) = %q, want %q", tt.elapsed, tt.done, tt.total, got, tt.want)
		}
	}
}
