//go:build linux

// Command rakebench is the end-to-end benchmark: it runs the Caddy of
// ./cmd/caddy with and without rakelimit (and any variant given with
// -variant), on loopback only, and measures legitimate HTTP/3 clients during
// floods, heavy transfers, and the server's side. It writes results.md,
// results.json and SVG charts to -out.
//
//	go run ./cmd/rakebench                      # make bench: everything, 3 repetitions, lab/docs/bench
//	go run ./cmd/rakebench -scenarios idle,one-source -reps 1 -out /tmp/bench
//	go run ./cmd/rakebench -variant 'strict=rakelimit 200' -variants strict
//	go run ./cmd/rakebench -from lab/docs/bench/results.json -out lab/docs/bench -readme README.md   # render again, no measuring
//
// It needs root: the module loads a BPF program, and the benchmark resets
// Caddy's peak RSS through /proc.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rakelimit/caddy-rakelimit/lab/bench"
)

func main() {
	opts, err := bench.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench:", err)
		os.Exit(2)
	}
	// SIGINT and SIGTERM cancel the run: every Caddy is killed and
	// reaped, every flood stops, before the exit.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := bench.Run
	if opts.From != "" {
		run = func(_ context.Context, o *bench.Options, progress io.Writer) (*bench.Report, error) {
			return bench.Rerender(o, progress)
		}
	}
	rep, err := run(ctx, opts, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench:", err)
		stop()
		os.Exit(1)
	}
	bench.PrintSummary(os.Stdout, rep, opts)
}
