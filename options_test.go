package rakelimit

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// syntaxBlock is the Caddyfile syntax the table of options gives, each line
// with prefix before it.
func syntaxBlock(prefix string) string {
	var b strings.Builder
	b.WriteString(prefix + "rakelimit [<limit>] {\n")
	for _, o := range options() {
		b.WriteString(strings.TrimRight(prefix+"    "+padRight(o.name, 23)+" "+o.syntax, " ") + "\n")
	}
	b.WriteString(prefix + "}\n")
	return b.String()
}

func padRight(s string, n int) string { return s + strings.Repeat(" ", max(0, n-len(s))) }

// jsonFieldNames maps RakeLimit's JSON names to its Go field names.
func jsonFieldNames() map[string]string {
	out := map[string]string{}
	t := reflect.TypeFor[RakeLimit]()
	for i := range t.NumField() {
		if tag := t.Field(i).Tag.Get("json"); tag != "" {
			name, _, _ := strings.Cut(tag, ",")
			out[name] = t.Field(i).Name
		}
	}
	return out
}

// TestOptionDocs: the table of options is the one list the docs follow.
// The syntax in UnmarshalCaddyfile's doc and in the README is the table's,
// line for line; each JSON field belongs to one option and has a doc
// comment (Caddy's JSON docs); the README's table of options has a row for
// each; and the default an option states (the field's "Default:" and the
// README's column) is the code's.
func TestOptionDocs(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("options.go")
	if err != nil {
		t.Fatal(err)
	}
	if want := syntaxBlock("//\t"); !strings.Contains(string(src), want) {
		t.Errorf("UnmarshalCaddyfile's doc does not give the table's syntax:\n%s", want)
	}
	if want := syntaxBlock("\t"); !strings.Contains(string(readme), want) {
		t.Errorf("the README does not give the table's syntax:\n%s", want)
	}

	fields := jsonFieldNames()
	owned := map[string]string{}
	numbers := func(s string) string { return strings.ReplaceAll(s, ",", "") }
	for _, o := range options() {
		row := regexp.MustCompile("(?m)^\\| [^|]*`" + regexp.QuoteMeta(o.name) + "[` ].*$").Find(readme)
		if row == nil {
			t.Errorf("the README's table of options has no row of %s", o.name)
		}
		for i, f := range o.jsonFields() {
			if prev, ok := owned[f]; ok {
				t.Errorf("JSON field %s belongs to %s and %s", f, prev, o.name)
			}
			owned[f] = o.name
			goName, ok := fields[f]
			if !ok {
				t.Errorf("option %s: RakeLimit has no JSON field %s", o.name, f)
				continue
			}
			doc := fieldDoc(t, "module.go", "RakeLimit", goName)
			if i > 0 || o.def == "" {
				continue
			}
			m := regexp.MustCompile(`Default:\s+"?([0-9a-z ,.]+?)"?(,\s|\.?\s*\(|\.?\s*$)`).FindStringSubmatch(doc)
			if m == nil || numbers(m[1]) != o.def {
				t.Errorf("%s's doc states the default %q, the code's is %q", goName, m, o.def)
			}
			cols := strings.Split(string(row), " | ")
			if len(cols) < 3 || !strings.Contains(numbers(cols[2]), o.def) {
				t.Errorf("the README's default of %s is %q, the code's %q", o.name, row, o.def)
			}
		}
	}
	for f := range fields {
		if _, ok := owned[f]; !ok {
			t.Errorf("JSON field %s belongs to no option", f)
		}
	}
}

// TestOptionExamples: each option's example parses, sets the option's JSON
// fields and those of the options it needs and nothing else, converts to a decision configuration, and
// survives the JSON that the Caddyfile adapter writes.
func TestOptionExamples(t *testing.T) {
	fields := jsonFieldNames()
	for _, o := range options() {
		t.Run(o.name, func(t *testing.T) {
			r := new(RakeLimit)
			d := caddyfile.NewTestDispenser("rakelimit {\n\t" + o.example + "\n}")
			if err := noPanic(t, func() error { return r.UnmarshalCaddyfile(d) }); err != nil {
				t.Fatalf("%q: %v", o.example, err)
			}
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			var set map[string]json.RawMessage
			if err := json.Unmarshal(b, &set); err != nil {
				t.Fatal(err)
			}
			var named []string
			for _, line := range strings.Split(o.example, "\n") {
				n, _, _ := strings.Cut(strings.TrimSpace(line), " ")
				if other, ok := optionNamed(n); ok {
					named = append(named, other.jsonFields()...)
				}
			}
			if !slices.Contains(named, o.jsonFields()[0]) {
				t.Errorf("the example %q does not name %s", o.example, o.name)
			}
			for f := range set {
				if !slices.Contains(named, f) {
					t.Errorf("%q sets %s (%s)", o.example, f, fields[f])
				}
			}
			if len(set) == 0 {
				t.Errorf("%q sets no JSON field", o.example)
			}
			again := new(RakeLimit)
			if err := again.UnmarshalJSON(b); err != nil {
				t.Fatalf("decoding %s: %v", b, err)
			}
			want, err := r.config()
			if err != nil {
				t.Fatal(err)
			}
			got, err := again.config()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(report.ConfigOf(got), report.ConfigOf(want)) || got.VerifyIDs != want.VerifyIDs {
				t.Errorf("%s decodes to another configuration", b)
			}
		})
	}
}

// TestReportNamesOptions: the configuration every view shows
// (report.Config) names its settings as the options' JSON does, but for
// the unverified class's limits, which no option sets.
func TestReportNamesOptions(t *testing.T) {
	owned := map[string]bool{"unverified_level_limits": true}
	for _, o := range options() {
		for _, f := range o.jsonFields() {
			owned[f] = true
		}
	}
	typ := reflect.TypeFor[report.Config]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if !owned[name] {
			t.Errorf("report.Config's %s is no option's JSON field", name)
		}
	}
}

// TestOptionOrder: an option comes after those whose applied values its
// apply reads, so that each value is checked against the others' and an
// error names the option at fault.
func TestOptionOrder(t *testing.T) {
	place := map[string]int{}
	for i, o := range options() {
		place[o.name] = i
	}
	for i, o := range options() {
		for _, before := range o.after {
			j, ok := place[before]
			switch {
			case !ok:
				t.Errorf("%s comes after %q, which is no option", o.name, before)
			case j >= i:
				t.Errorf("%s reads %s's value and must come after it in the table", o.name, before)
			}
		}
	}
}
