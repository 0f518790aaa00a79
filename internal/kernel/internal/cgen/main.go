// Command cgen writes the C header of the constants the BPF program shares
// with its Go twin (internal/kernel/c/contract.h), from the Go source: a
// constant is shared when its comment (a line of its doc comment, or the
// comment after it) is exactly
//
//	C: NAME
//
// where NAME is the name the C program uses. cgen type-checks each package
// it is given (go/types, importing from source), so that a constant's value
// is Go's own, whatever expression gives it, and writes one #define per
// marked constant, in the order of the packages given and of their source.
//
// Usage, from internal/kernel (go generate runs it there, before bpf2go):
//
//	go run ./internal/cgen -o c/contract.h DIR...
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
)

func main() {
	out := flag.String("o", "", "the header to write (standard output when empty)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: cgen [-o header] DIR...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "cgen:", err)
		os.Exit(1)
	}
}

// run generates the header from the packages in dirs and writes it to out,
// leaving a file that already holds it untouched.
func run(out string, dirs []string) error {
	h, err := generate(dirs)
	if err != nil {
		return err
	}
	if out == "" {
		_, err := os.Stdout.Write(h)
		return err
	}
	if old, err := os.ReadFile(out); err == nil && bytes.Equal(old, h) {
		return nil
	}
	if err := os.WriteFile(out, h, 0o644); err != nil {
		return fmt.Errorf("writing the header: %w", err)
	}
	return nil
}
