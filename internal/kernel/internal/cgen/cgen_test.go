package main

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLiteral checks the C constant written for each kind of Go constant:
// its type (the suffix) and its base.
func TestLiteral(t *testing.T) {
	for _, tt := range []struct {
		decl string // declares c
		hex  bool
		want string // "" for an error
	}{
		{decl: "const c uint64 = 1 << 32", want: "0x100000000ULL"},
		{decl: "const c uint64 = 5", want: "5ULL"},
		{decl: "const c uint32 = 7", want: "7U"},
		{decl: "const c = ^uint32(0)", want: "0xffffffffU"},
		{decl: "const c uint8 = 3", want: "3"},
		{decl: "type T uint8; const c T = 2", want: "2"},
		{decl: "const c int = 1 << 17", want: "131072"},
		{decl: "const c int64 = 1 << 40", want: "0x10000000000LL"},
		{decl: "const c = 1 << 17", want: "131072"},
		{decl: "const c = 1<<31 - 1", want: "2147483647"},
		{decl: "const c = 1 << 31", want: "0x80000000U"},
		{decl: "const c = 0x9E3779B1", hex: true, want: "0x9e3779b1U"},
		{decl: "const c = 0xff", hex: true, want: "0xff"},
		{decl: "const c = 1<<48 - 1", want: "0xffffffffffffULL"},
		{decl: "const c = 0x9E3779B97F4A7C15", hex: true, want: "0x9e3779b97f4a7c15ULL"},
		{decl: "const c = -3", want: "(-3)"},
		{decl: "const c = -(1 << 40)", want: "(-1099511627776LL)"},
		{decl: "const c = 1 << 64"},
		{decl: "const c = -(1 << 64)"},
		{decl: "const c = 1.5"},
		{decl: `const c = "x"`},
		{decl: "const c float64 = 2"},
		{decl: "const c = true"},
	} {
		t.Run(tt.decl, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "c.go", "package p\n"+tt.decl+"\n", 0)
			if err != nil {
				t.Fatal(err)
			}
			pkg, err := new(types.Config).Check("p", fset, []*ast.File{f}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := cLiteral(pkg.Scope().Lookup("c").(*types.Const), tt.hex)
			switch {
			case tt.want == "" && err == nil:
				t.Fatalf("got %s, want an error", got)
			case tt.want != "" && err != nil:
				t.Fatalf("got error %v, want %s", err, tt.want)
			case got != tt.want:
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// TestGenerate generates the header of testdata/a, whose constants are
// marked in every way cgen reads.
func TestGenerate(t *testing.T) {
	got, err := generate([]string{"testdata/a"})
	if err != nil {
		t.Fatal(err)
	}
	want := header + `
// internal/kernel/internal/cgen/testdata/a
#define KIND_FIRST 0 // a.First
#define KIND_SECOND 1 // a.Second
#define KIND_FOURTH 3 // a.Fourth
#define SHIFT 10 // a.Shift
#define SIZE 256 // a.Size = 1 << (Shift - 2)
#define MASK 0xffffffffU // a.mask = ^uint32(0)
#define BIG 0x100000000ULL // a.big = uint64(1) << 32
#define MUL 0x9e3779b1U // a.mul
#define WAIT 3000000 // a.Wait = 3 * time.Millisecond
#define NEG (-2) // a.neg = -2
#define ALONE 0x7f // a.Alone

#endif
`
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// TestGenerateErrors: what cgen refuses, each with the position of the
// constant at fault.
func TestGenerateErrors(t *testing.T) {
	for _, tt := range []struct {
		name, src, want string
	}{
		{"two names", "const a, b = 1, 2 // C: AB\n", "marks 2 constants"},
		{"lower case", "const a = 1 // C: a\n", "upper case"},
		{"two markers", "// C: A\nconst a = 1 // C: B\n", "marked both A and B"},
		{"twice", "const (\n\ta = 1 // C: A\n\tb = 2 // C: A\n)\n", "A is marked at"},
		{"float", "const a = 1.5 // C: A\n", "integer constants only"},
		{"string", "const a = \"x\" // C: A\n", "integer constants only"},
		{"unknown", "const a = b + 1 // C: A\n", "the value of a is unknown"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte("package p\n\n"+tt.src), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := generate([]string{dir})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "p.go:") {
				t.Fatalf("got error %v, want one with the position and %q", err, tt.want)
			}
		})
	}
}

// TestGenerateTypeErrors: a type error elsewhere in a package (a stale
// generated file, say) leaves its marked constants shared.
func TestGenerateTypeErrors(t *testing.T) {
	dir := t.TempDir()
	src := "package p\n\nvar x = undefined\n\nconst a = 1 << 3 // C: A\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := generate([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), "\n#define A 8 // p.a = 1 << 3\n") {
		t.Fatalf("got\n%s\nwant A defined", got)
	}
}

// TestContractCurrent: the committed c/contract.h is what go generate
// writes from the Go source as it is now (CI checks the same by running
// make generate; this fails first, in go test).
func TestContractCurrent(t *testing.T) {
	const kernel = "../.." // where go generate runs cgen
	args := generateArgs(t, filepath.Join(kernel, "gen.go"))
	if len(args) < 3 || args[0] != "-o" {
		t.Fatalf("the go:generate line runs cgen with %q, want -o HEADER DIR...", args)
	}
	var dirs []string
	for _, d := range args[2:] {
		dirs = append(dirs, filepath.Join(kernel, d))
	}
	got, err := generate(dirs)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(kernel, args[1]))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s is stale: run make generate", args[1])
	}
}

// generateArgs returns the arguments of cgen in the go:generate line of
// file.
func generateArgs(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "//go:generate go run ./internal/cgen "); ok {
			return strings.Fields(rest)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("%s has no go:generate line running cgen", file)
	return nil
}
