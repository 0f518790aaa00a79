// Package userspace is rakelimit without BPF: the same limiter, with the same
// settings, run in the Caddy process on every datagram quic-go reads, for
// hosts where the kernel filter cannot load (a container without CAP_BPF and
// CAP_PERFMON, an operator who will not grant them, macOS, Windows).
//
// # What it keeps
//
// Every datagram is decided exactly as the kernel filter decides it
// (package decide, the Go twin of internal/kernel/rakelimit.c): the
// allowlist, the QUIC classes verified against the server IDs and peers
// learned (LearnServerID, LearnPeer, ExpireLearned; bounded and expired as
// the kernel's maps are), the version negotiation cap and the hierarchical
// fair-share limiter, with the same counters (decide.Stats), the same
// limited-stream records (decide.Stream: sampled one drop in
// 2^decide.DefaultTrackShift, keyed by the dropping node, one event per new
// stream, at most decide.MaxTrackedStreams) and the same all-or-nothing
// reconfiguration, which refuses exactly what the kernel filter refuses. A
// dropped datagram never reaches quic-go: it builds no connection for a
// flood of Initials, sends no Version Negotiation reply past the cap, and
// parses no junk.
//
// The Decider decides what quic-go reads through the conn of every mode
// (package packetconn), as its Decider: quic-go keeps its whole fast path
// through that conn (batched reads, ECN, GSO, path MTU discovery; see
// package packetconn). TestQUICGoKeepsFastPath runs quic-go with its debug
// log on through the conn with a Decider and checks;
// TestSocketOptionsThroughConn makes quic-go's socket option calls through
// it; TestWithoutPrivileges runs the socket and quic-go tests again
// without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN.
//
// # What it costs
//
// The kernel filter drops a flood before it is queued; here every datagram
// is received first, and decided on the goroutine that reads the socket
// (bench_test.go measures reading through the conn's ReadBatch with a
// Decider against a wrapper that only passes datagrams through; the
// figures are in the lab's notebook, "The userspace conn's cost per
// datagram"). So, against the kernel mode:
//
//   - Each flood datagram still costs its share of a recvmmsg call, a copy
//     into quic-go's buffer and the decision, on the goroutine that reads
//     the socket: CPU the kernel filter would have saved.
//   - The socket's receive queue is shared with the flood. While the reader
//     keeps up, nothing is lost; a flood faster than one core can receive
//     fills the queue, and the kernel then drops datagrams before anyone
//     decides, legitimate ones among them. quic-go raises the receive buffer
//     to 7 MiB when net.core.rmem_max (or CAP_NET_ADMIN) lets it.
//   - A kept datagram that follows a dropped one in a batch is copied into
//     the earlier slot (its bytes, address, control messages), because
//     quic-go pairs each message slot with a buffer of its own.
//   - Datagrams are timed when they are read, not when they arrive: after a
//     stall of the reader, a backlog counts as a burst.
//
// # Concurrency
//
// A Decider is safe for concurrent use: quic-go's reader, the metrics
// collector, the admin API, reloads and stream expiry may call it at once.
// The read path takes its mutex once per batch and reads the clock once per
// batch; it allocates nothing.
package userspace
