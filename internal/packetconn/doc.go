// Package packetconn is the packet conn quic-go reads and writes through, in
// every mode: Conn wraps the listener's *net.UDPConn. Its reads pass every
// datagram in the modes that decide in the kernel (bpf, xdp), and go
// through a Decider, the userspace limiter (package userspace), in mode
// userspace; its writes show every datagram to a learner (package learn),
// which teaches the engine in force the server's connection IDs and peers,
// before they leave. The engine (package engine) makes one Conn per socket
// and hands it to Caddy, through the root package's WrapPacketConn; an
// engine that decides in userspace sets itself as the Conn's Decider, and
// one that decides in the kernel leaves it passing.
//
// # What quic-go keeps
//
// Conn embeds the *net.UDPConn, and quic-go keeps its whole fast path
// through it (package userspace's TestQUICGoKeepsFastPath runs quic-go with
// its debug log on and checks; TestSocketOptionsThroughConn there makes
// quic-go's socket option calls through it; TestFastPathThroughConn here
// writes GSO batches and ECN marks through it):
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
//   - Writes are the socket's own (WriteMsgUDP), once the learner has seen
//     them: GSO (UDP_SEGMENT, probed through Control), ECN marks on sent
//     packets, and the don't-fragment bit (IP_MTU_DISCOVER), so path MTU
//     discovery. Buffer sizing too.
//   - Unwrap returns the socket, which Caddy and the root package find
//     under a wrapper.
//
// What it gives up is reading the raw socket: the raw connection's Read
// returns an error (quic-go never calls it), since it would bypass the
// Decider. Every read method of Conn decides; every write method teaches.
//
// # What a Decider costs
//
// With a Decider every datagram is received first, and decided on the
// goroutine that reads the socket (package userspace says what that costs
// against the kernel filter). A kept datagram that follows a dropped one in
// a batch is copied into the earlier slot (its bytes, address, control
// messages), because quic-go pairs each message slot with a buffer of its
// own. The read path loads the Decider once per read and calls it once per
// batch, with datagrams in the Conn's own scratch space (a lock of the
// Conn's, once per read); it allocates nothing.
//
// On Windows quic-go reads one datagram per ReadFrom whatever the conn (it
// has no batched reads or ECN there), so Conn adds only the decision.
package packetconn
