//go:build linux

// Command rakebench-virtio measures the socket filter (mode bpf) against
// the XDP program (mode xdp) on a virtio-net NIC, in the same run: it
// boots a guest under QEMU (KVM where the host has it) with a virtio-net
// NIC on a tap in a network namespace it makes, runs Caddy there, floods
// it from the host through the tap, and reads the guest's CPU per dropped
// datagram, the drops per second, and a legit HTTP/3 client's success,
// medians of -reps repetitions, for each setup of vCPUs and queues. It
// writes results.md and results.json to -out.
//
//	CGO_ENABLED=0 go build -o caddy ./cmd/caddy
//	(cd lab && CGO_ENABLED=0 go build -o ../rakebench-virtio ./cmd/rakebench-virtio)
//	sudo ./rakebench-virtio -caddy ./caddy -kernel "$(sudo bash lab/cmd/rakebench-virtio/kernel.sh 6.1)" -out lab/docs/bench/virtio
//
// Both binaries must be static: the guest has no C library. In the guest,
// the same binary runs as its agent (`rakebench-virtio guest`, from the
// guest's init), which starts Caddy and reads the guest for the host.
//
// It needs root: a network namespace, a tap, QEMU.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rakelimit/caddy-rakelimit/lab/virtiobench"
)

func main() {
	// SIGINT and SIGTERM cancel the run: the guest is stopped, and the
	// tap and the namespace removed, before the exit.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "guest" {
		os.Exit(guest(ctx))
	}
	opts, err := virtiobench.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-virtio:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "rakebench-virtio:", virtiobench.ErrNotRoot)
		os.Exit(2)
	}
	rep, err := virtiobench.Run(ctx, opts, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-virtio:", err)
		stop()
		os.Exit(1)
	}
	fmt.Print(rep.Markdown())
}

// guest runs the agent in the guest, and returns the exit status.
func guest(ctx context.Context) int {
	opts, err := virtiobench.ParseGuestFlags(os.Args[2:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-virtio guest:", err)
		return 2
	}
	if err := virtiobench.Serve(ctx, opts, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "rakebench-virtio guest:", err)
		return 1
	}
	return 0
}
