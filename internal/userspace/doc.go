// Package userspace is rakelimit without BPF: the same limiter, with the same
// settings, run in the Caddy process on every datagram quic-go reads, for
// hosts where the kernel filter cannot load (a container without CAP_BPF and
// CAP_PERFMON, an operator who will not grant them, macOS, Windows).
//
// # What it keeps
//
// Every datagram is decided exactly as the kernel filter decides it
// (package datagram, the Go twin of bpf/rakelimit.c): the allowlist, the QUIC
// classes, the version negotiation cap and the hierarchical fair-share
// limiter, with the same counters (datagram.Stats), the same limited-stream
// records (datagram.Stream, sampled one drop in 2^DefaultTrackShift, one
// event per new stream) and the same all-or-nothing reconfiguration. A
// dropped datagram never reaches quic-go: it builds no connection for a
// flood of Initials, sends no Version Negotiation reply past the cap, and
// looks up no connection ID for junk.
//
// Conn wraps the listener's *net.UDPConn so that quic-go keeps its fast
// path: Conn is a quic.OOBCapablePacketConn and has ReadBatch, so quic-go
// still reads up to 8 datagrams per system call (recvmmsg on Linux), still
// writes with GSO (UDP_SEGMENT), still reads and sends ECN marks, still sets
// the don't-fragment bit and so still runs path MTU discovery, and still
// learns the destination address of each datagram on a wildcard socket
// (packet info). quic-go logs no "Disabling optimizations" for it.
//
// # What it costs
//
// The kernel filter drops a flood before it is queued; here every datagram
// is received first. So, against the kernel mode:
//
//   - Each flood datagram still costs its share of a recvmmsg call, a copy
//     into quic-go's buffer and the decision (about 100 ns, see the
//     benchmarks), on the goroutine that reads the socket: the flood uses
//     CPU that the kernel filter would have saved.
//   - The socket's receive queue is shared with the flood. While the reader
//     keeps up, nothing is lost; a flood faster than one core can receive
//     fills the queue, and the kernel then drops datagrams before anyone
//     decides, legitimate ones among them. Caddy's quic-go raises the
//     receive buffer to 7 MiB when it can; raising net.core.rmem_max lets it.
//   - A kept datagram that follows a dropped one in the same batch is copied
//     one slot down (its bytes, addresses, control messages), because
//     quic-go pairs each message slot with its own buffer.
//   - Datagrams are timed when they are read, not when they arrive: after a
//     stall of the reader, a backlog is counted as a burst.
//
// On Windows quic-go reads one datagram per call on any socket (it has no
// batched reads there), so the wrapper costs nothing more than the decision.
//
// # Concurrency
//
// A Limiter is safe for concurrent use: quic-go's reader, the metrics
// collector, the admin API, reloads and stream expiry may call it at once.
// The read path takes the Limiter's mutex once per batch of datagrams.
package userspace
