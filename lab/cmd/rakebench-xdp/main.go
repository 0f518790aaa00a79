//go:build linux

// Command rakebench-xdp measures the socket filter (mode bpf) against the
// XDP program (mode xdp) in the same run: Caddy behind a veth pair between
// two network namespaces it makes, a flood across the veth at the sender's
// maximum (or at -rates), a legit HTTP/3 client beside it; the receiving
// side's CPU (softirq and Caddy) per dropped datagram and the client's
// success, medians of -reps repetitions. It writes results.md and
// results.json to -out.
//
//	go build -o caddy ./cmd/caddy && (cd lab && go build -o ../rakebench-xdp ./cmd/rakebench-xdp)
//	sudo ./rakebench-xdp -out lab/docs/bench/xdp                       # 3 repetitions, both floods, at the maximum
//	sudo ./rakebench-xdp -floods initial -rates 100000,200000,max -reps 3
//
// It needs root: network namespaces, and Caddy's BPF programs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

func main() {
	opts, err := xdpbench.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-xdp:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "rakebench-xdp:", xdpbench.ErrNotRoot)
		os.Exit(2)
	}
	// SIGINT and SIGTERM cancel the run: Caddy is stopped and the
	// namespaces removed before the exit.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := xdpbench.Run(ctx, opts, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-xdp:", err)
		stop()
		os.Exit(1)
	}
	fmt.Print(rep.Markdown())
}
