package rakelimit

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// TestDocumentedDefaults: the defaults the docs state are the compiled
// ones. Each field's doc comment in module.go (Caddy's JSON docs are built
// from them) ends with its default, and the README's table of options has
// a default column: both are read and compared with the constants, and the
// numbers stated for the unverified class's limits, wherever they are
// stated, with the limiter's.
func TestDocumentedDefaults(t *testing.T) {
	numbers := func(s string) string { return strings.ReplaceAll(s, ",", "") }
	defaults := []struct {
		field, option string
		want          string
	}{
		{"Name", "name", DefaultName},
		{"Limit", "limit", strconv.Itoa(DefaultLimit)},
		{"Window", "window", strings.TrimSuffix(strings.TrimSuffix(DefaultWindow.String(), "0s"), "m")},
		{"EstablishedLimit", "established_limit", strconv.Itoa(DefaultEstablishedLimit)},
		{"VersionNegotiation", "version_negotiation", strconv.Itoa(DefaultVersionNegotiation)},
		{"Mode", "mode", engine.DefaultMode},
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range defaults {
		doc := fieldDoc(t, "module.go", "RakeLimit", d.field)
		m := regexp.MustCompile(`Default: "?([0-9a-z,.]+?)"?[,.]?(\s|$)`).FindStringSubmatch(doc)
		if m == nil || numbers(m[1]) != d.want {
			t.Errorf("%s's doc states the default %q, the code's is %q", d.field, m, d.want)
		}
		row := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(d.option) + "` \\| [^|]+ \\| ([^|]+) \\|").FindSubmatch(readme)
		if row == nil || !strings.Contains(numbers(string(row[1])), d.want) {
			t.Errorf("the README's default of %s is %q, the code's %q", d.option, row, d.want)
		}
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
