package rakelimit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// TestModeDocs: the docs that list the modes, which cannot be generated,
// list those of the table of modes (internal/engine): the Mode option's
// doc comment, the Caddyfile synopsis in options.go and the README, the
// README's table of options, its list under "Privileges and modes" and its
// example of the error of an unknown mode.
func TestModeDocs(t *testing.T) {
	names := engine.ModeNames()
	sorted := slices.Sorted(slices.Values(names))
	set := func(s []string) []string {
		out := slices.Clone(s)
		sort.Strings(out)
		return slices.Compact(out)
	}

	// The Mode field's doc comment quotes each mode.
	doc := fieldDoc(t, "module.go", "RakeLimit", "Mode")
	quoted := regexp.MustCompile(`"([a-z0-9_]+)"`).FindAllStringSubmatch(doc, -1)
	var inDoc []string
	for _, q := range quoted {
		inDoc = append(inDoc, q[1])
	}
	if got := set(inDoc); !slices.Equal(got, sorted) {
		t.Errorf("the doc of RakeLimit.Mode names the modes %v, the table %v", got, sorted)
	}

	// The Caddyfile synopsis, in options.go and in the README.
	synopsis := regexp.MustCompile(`(?m)^[/\s]*mode\s+([a-z0-9_|]+)\s*$`)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	caddyfile, err := os.ReadFile("options.go")
	if err != nil {
		t.Fatal(err)
	}
	for file, b := range map[string][]byte{"options.go": caddyfile, "README.md": readme} {
		m := synopsis.FindSubmatch(b)
		if m == nil {
			t.Errorf("%s: no Caddyfile synopsis of mode", file)
			continue
		}
		if got, want := string(m[1]), strings.Join(names, "|"); got != want {
			t.Errorf("%s: the Caddyfile synopsis lists mode %s, want %s", file, got, want)
		}
	}

	// The README's table of options names each mode.
	row := regexp.MustCompile("(?m)^\\| `mode` \\|.*$").Find(readme)
	for _, name := range names {
		if !strings.Contains(string(row), "`"+name+"`") {
			t.Errorf("README.md: the row of mode in the table of options leaves out %s: %s", name, row)
		}
	}

	// The README's list under "Privileges and modes".
	section := string(readme)
	if i := strings.Index(section, "\n## Privileges and modes\n"); i >= 0 {
		section = section[i+1:]
		if j := strings.Index(section[3:], "\n## "); j >= 0 {
			section = section[:j+3]
		}
	} else {
		t.Fatal("README.md: no section Privileges and modes")
	}
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^- `([a-z0-9_]+)`").FindAllStringSubmatch(section, -1) {
		listed = append(listed, m[1])
	}
	if got := set(listed); !slices.Equal(got, sorted) {
		t.Errorf("README.md: Privileges and modes lists the modes %v, the table %v", got, sorted)
	}

	// The README's example of the error.
	if want := "want " + engine.ModeChoices(); !strings.Contains(string(readme), want) {
		t.Errorf("README.md: no example of the error %q", want)
	}
}

// fieldDoc returns the doc comment of a field of a struct type declared in
// file.
func fieldDoc(t *testing.T, file, typ, field string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != typ {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		for _, fl := range st.Fields.List {
			for _, name := range fl.Names {
				if name.Name == field && fl.Doc != nil {
					doc = fl.Doc.Text()
				}
			}
		}
		return false
	})
	if doc == "" {
		t.Fatalf("%s: no doc comment of %s.%s", file, typ, field)
	}
	return doc
}
