package rakelimit

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// TestDocumentedDefaults: the defaults the docs state in prose, which no
// option's "Default:" or the README's column holds (TestOptionDocs checks
// those against the table of options): the opening total's start and the
// unverified class's limits, wherever they are stated, are the code's.
func TestDocumentedDefaults(t *testing.T) {
	numbers := func(s string) string { return strings.ReplaceAll(s, ",", "") }
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The opening total's start and the unverified class's limits, stated
	// in prose.
	for _, s := range []struct {
		where, text string
		want        []uint32
	}{
		{"README.md", string(readme), []uint32{DefaultOpeningTotal, sketch.DefaultUnverifiedLimit, sketch.DefaultUnverifiedTotal}},
		{"module.go VerifyConnectionIDs", fieldDoc(t, "module.go", "RakeLimit", "VerifyConnectionIDs"),
			[]uint32{sketch.DefaultUnverifiedLimit, sketch.DefaultUnverifiedTotal}},
	} {
		for _, n := range s.want {
			if !strings.Contains(numbers(s.text), strconv.Itoa(int(n))) {
				t.Errorf("%s does not state %d", s.where, n)
			}
		}
	}
}
