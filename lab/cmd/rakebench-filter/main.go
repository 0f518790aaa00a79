//go:build linux

// Command rakebench-filter is the side-by-side per-packet benchmark: this
// project's socket filter against Cloudflare's rakelimit (its compiled
// object, fetched from the Go module proxy into a cache directory, or given
// with -cloudflare) and a trivial floor program, through BPF_PROG_TEST_RUN
// in one process, in interleaved rounds (package lab/filterbench). It
// prints a table of nanoseconds per packet and ratios, with the CPU model,
// then a table "On all CPUs": packets per second of the cases of -parallel
// on one pinned CPU and on every CPU together, and their ratio; it writes
// both as Markdown with -out.
//
//	make bench-filter                                     # every case, 15 rounds, lab/docs/bench/filter.md
//	go run ./cmd/rakebench-filter -rounds 3 -repeat 20000 -once 500
//	go run ./cmd/rakebench-filter -cloudflare ../rakelimit -cases ipv4-under,ipv4-random
//	go run ./cmd/rakebench-filter -cases ipv4-over,ipv4-under -parallel ipv4-over,ipv4-under
//
// It needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs. Nothing
// is sent on any network.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rakelimit/caddy-rakelimit/lab/filterbench"
)

func main() {
	opts, err := filterbench.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-filter:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := filterbench.Run(ctx, opts, os.Stderr)
	if err == nil {
		err = rep.WriteText(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-filter:", err)
		stop()
		os.Exit(1)
	}
}
