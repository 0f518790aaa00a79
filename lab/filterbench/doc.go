// Package filterbench is the side-by-side per-packet benchmark behind
// lab/cmd/rakebench-filter (make bench-filter): this project's socket filter
// (package kernel) against Cloudflare's rakelimit, whose compiled object is
// fetched at run time from the Go module proxy into a cache directory and
// never committed here.
//
// Both programs, and a trivial floor program that only returns the packet's
// length, run in one process through BPF_PROG_TEST_RUN on the same frames:
// rounds interleave every case and program (15 by default), and each figure
// is the median over the rounds. A case with one source repeats its frame
// (kernel-measured time per run); a case with a new source on every packet
// runs each of a batch of distinct frames once, for both programs, and
// subtracts the floor program's time on the same batch. Each limiter first
// runs a lead-in of distinct frames from other new sources, untimed
// (-lead-in): over the gap between rounds the counts of the nodes every
// packet shares decay, and a batch timed after it would begin by passing
// into the room under their limits, as the first packets of a flood do, not
// the packets of a sustained one. The report gives the share of the timed
// packets each program dropped. This filter runs as
// Caddy configures it by default (QUIC classes, connection ID
// verification), and in three cases without classes, as Cloudflare's
// counts every datagram alike. Each run checks that every case times the
// path it names (pass, drop, a flood decided). Nothing is sent on any
// network: BPF_PROG_TEST_RUN runs a program on a buffer.
//
// Cases that repeat one frame (by default ipv4-random-switch and
// ipv4-over, whose every packet touches the same cells: the socket's total,
// or the first node's) are also timed on all CPUs (-parallel): packets per
// second of one thread pinned to one CPU, and of one thread pinned to each
// CPU, released together behind a barrier, over the wall time from the
// common start to the last thread's end; the ratio of the medians says how
// the program scales with CPUs. The maps are those of the case's other
// rows, warmed up on one CPU and on all first. With one CPU the table is
// skipped with a line that says so.
//
// The files split by concern:
//
//   - frames.go: the frames' addresses and their random sources (the
//     frames themselves are testutil.Frame's, as the kernel tests')
//   - cloudflare.go: fetching and extracting Cloudflare's object
//   - stats.go: medians, the results table (text and Markdown), the CPU model
//   - cases.go: the cases and the configurations of this filter for them
//   - options.go: the options and the command line
//   - run_linux.go: loading, the interleaved rounds and the checks
//   - parallel.go, parallel_linux.go: the runs on all CPUs (the barrier,
//     pinning, their table)
package filterbench
