// Package filterbench is the side-by-side per-packet benchmark behind
// cmd/rakebench-filter (make bench-filter): this project's socket filter
// (package bpf) against Cloudflare's rakelimit, whose compiled object is
// fetched at run time from the Go module proxy into a cache directory and
// never committed here.
//
// Both programs, and a trivial floor program that only returns the packet's
// length, run in one process through BPF_PROG_TEST_RUN on the same frames:
// rounds interleave every case and program (15 by default), and each figure
// is the median over the rounds. A case with one source repeats its frame
// (kernel-measured time per run); a case with a new source on every packet
// runs each of a batch of distinct frames once, for both programs, and
// subtracts the floor program's time on the same batch. This filter runs as
// Caddy configures it by default (QUIC classes, connection ID
// verification), and in three cases without classes, as Cloudflare's
// counts every datagram alike. Each run checks that every case times the
// path it names (pass, drop, a flood decided). Nothing is sent on any
// network: BPF_PROG_TEST_RUN runs a program on a buffer.
//
// The files split by concern:
//
//   - frames.go: the Ethernet frames both programs see
//   - cloudflare.go: fetching and extracting Cloudflare's object
//   - stats.go: medians, the results table (text and Markdown), the CPU model
//   - cases_linux.go: the cases and how each program is set up for them
//   - run_linux.go: loading, the interleaved rounds and the checks
package filterbench
