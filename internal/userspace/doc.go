// Package userspace is rakelimit without BPF: the same limiter, with the same
// settings, run in the Caddy process on every datagram quic-go reads, for
// hosts where the kernel filter cannot load (a container without CAP_BPF and
// CAP_PERFMON, an operator who will not grant them, macOS, Windows).
//
// # What it keeps
//
// Every datagram is decided exactly as the kernel filter decides it
// (package decide, the Go twin of internal/kernel/rakelimit.c): the allowlist, the QUIC
// classes verified against the server IDs and peers learned
// (LearnServerID, LearnPeer, ExpireLearned; bounded and expired as the
// kernel's maps are), the version negotiation cap and the hierarchical
// fair-share limiter, with the same counters (datagram.Stats), the same limited-stream
// records (datagram.Stream: sampled one drop in 2^datagram.DefaultTrackShift, keyed
// by the dropping node, one event per new stream, at most
// datagram.MaxTrackedStreams) and the same all-or-nothing reconfiguration, which
// refuses exactly what the kernel filter refuses. A dropped datagram never
// reaches quic-go: it builds no connection for a flood of Initials, sends no
// Version Negotiation reply past the cap, and parses no junk.
//
// Conn wraps the listener's *net.UDPConn, and quic-go keeps its whole fast
// path through it (TestQUICGoKeepsFastPath runs quic-go with its debug log
// on and checks; TestSocketOptionsThroughConn makes quic-go's socket option
// calls through it):
//
//   - Conn is a quic.OOBCapablePacketConn (SyscallConn, SetReadBuffer,
//     ReadMsgUDP, WriteMsgUDP, net.PacketConn) and has ReadBatch, so quic-go
//     builds its batched reader on it and never logs "Disabling
//     optimizations". It reads 8 datagrams per call, which Conn reads with
//     one recvmmsg on Linux, as quic-go itself would.
//   - ECN and packet info: quic-go's IP_RECVTOS, IPV6_RECVTCLASS and
//     IP(V6)_PKTINFO reach the socket through SyscallConn().Control, and
//     Conn hands each datagram's control messages over with it, so quic-go
//     reads ECN marks and answers from the address each datagram was sent to.
//   - Writes are the socket's own (WriteMsgUDP): GSO (UDP_SEGMENT, probed
//     through Control), ECN marks on sent packets, and the don't-fragment
//     bit (IP_MTU_DISCOVER), so path MTU discovery. Buffer sizing too.
//
// What it gives up is reading the raw socket: the raw connection's Read
// returns an error (quic-go never calls it), since it would bypass the
// limiter. Every read method of Conn filters.
//
// # What it costs
//
// The kernel filter drops a flood before it is queued; here every datagram
// is received first, and decided on the goroutine that reads the socket
// (bench_test.go measures reading through Conn.ReadBatch against a wrapper
// that only passes datagrams through; the figures are in the lab's
// notebook, "The userspace conn's cost per datagram"). So, against the
// kernel mode:
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
// On Windows quic-go reads one datagram per ReadFrom whatever the conn (it
// has no batched reads or ECN there), so Conn adds only the decision.
//
// # Concurrency
//
// A Limiter is safe for concurrent use: quic-go's reader, the metrics
// collector, the admin API, reloads and stream expiry may call it at once.
// The read path takes its mutex once per batch and reads the clock once per
// batch; it allocates nothing.
package userspace
