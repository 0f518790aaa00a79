// Package xdpbench is the benchmark behind lab/cmd/rakebench-xdp: the
// socket filter (mode bpf) against the XDP program (mode xdp) under the
// same flood, in the same run. A real Caddy (the binary of ./cmd/caddy)
// runs in a network namespace joined by a veth pair to a sender's
// namespace; the sender floods Caddy's HTTP/3 port across the veth at its
// maximum rate (or at the rates given), as XDP frames redirected into the
// veth (the way a NIC's driver hands frames to the kernel: no socket buffer
// until something passes them) or from UDP sockets, while a legitimate HTTP/3 client
// from another /48 fetches a page ten times a second on new connections.
// Each sample measures, over the flood's window, the receiving side's CPU
// (the machine's softirq time, which the veth's receive path runs in, and
// Caddy's own), the limiter's drops, and the client's success; the report
// gives the medians over repetitions and, per repetition, the ratio of the
// XDP program's receiving CPU per dropped datagram to the socket filter's.
// A third mode, the floor (ModeFloor, on unless -floor=false), puts in
// front of Caddy in mode bpf an XDP program that drops the flood's frames
// and does nothing else: its ratio to the socket filter is the least any
// XDP program can reach on this path, the veth's share of the cost.
//
// The files:
//
//   - netns.go: the namespaces and the veth, made and removed by the run
//   - flood.go, xdpsend.go: the senders, from sockets (sendmmsg batches)
//     or as XDP frames (live-frame BPF_PROG_TEST_RUN of a program that
//     redirects into the veth); bounded by count and time
//   - sample.go: one sample: a fresh Caddy, the window, its measurements
//   - floor.go: the floor's XDP program, attached for a ModeFloor sample
//   - run.go: the options and the run of every repetition, flood, rate and
//     mode, interleaved
//   - report.go: medians, ratios, results.md and results.json
//
// lab/virtiobench runs the same comparison on a virtio-net NIC in a guest,
// with what this package exports: the floods (Flood), the floor
// (AttachFloor), the site and its counters (Site, Caddy, ParseCounts), the
// readings of a process and a program (ProcTicks, ProgramRuns, UDPDrops),
// and the summary and tables of samples (Summarize, WriteTables).
//
// Network rule: every datagram goes to fd00::/8 addresses in namespaces
// the run makes and removes, and every flood is bounded by a count and a
// duration.
//
// CPU accounting: without CONFIG_IRQ_TIME_ACCOUNTING the kernel samples
// softirq time at each tick, whichever task it interrupts; the veth's
// receive path (its NAPI poll: the XDP program, or the socket buffer's
// build, ip_rcv, udp_rcv and the socket filter) runs in softirq, partly
// inside the sender's own system calls. /proc/stat's softirq column counts it wherever
// it runs; a tick that lands in Caddy's softirq is in Caddy's time too, so
// the sum may count a little twice.
package xdpbench
