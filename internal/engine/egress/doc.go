// Package egress learns from what the server sends what only the server
// knows: the connection IDs it chose, each with the address it sent it to,
// the addresses it keeps connections with, and which of them proved that
// they receive what the server sends there. A kernel filter (or the
// userspace limiter) taught them can verify what clients send: a spoofer
// who never receives the server's packets cannot guess a 4-byte random ID
// sent to another address, nor make the server show that it proved an
// address it does not hold.
//
// # What it reads
//
// quic-go v0.63 sends every datagram through its packet conn's WriteMsgUDP,
// GSO batches included (several datagrams of one size in one buffer, the
// size in a UDP_SEGMENT control message). Conn embeds the listener's
// *net.UDPConn, so quic-go keeps every fast path, and shows each write to a
// Learner before it writes; userspace.Conn does the same in userspace mode.
// Each GSO segment is a datagram of its own. What a datagram teaches is
// only what a connection makes (inspect):
//
//   - Server IDs: the source connection ID of the server's Handshake and
//     Retry packets, and of its Initials in a datagram that belongs to a
//     connection (with a Handshake packet, or padded to 1200 bytes as only
//     an ack-eliciting Initial is, such as the ServerHello quic-go may send
//     before its Handshake packets), each bound to the datagram's
//     destination (QUIC v1 and v2, RFC 9000 section 17.2, RFC 9369).
//     quic-go's default generator, which Caddy keeps, makes them
//     ServerIDLen (4) random bytes. A Handshake or Retry packet with an ID
//     of another length is counted (Stats.OddIDs) and reported once
//     (Options.OnOddID): verification by ID cannot work then. quic-go's
//     refusals of a connection (CONNECTION_REFUSED, and INVALID_TOKEN for a
//     Retry token from another address) are small lone Initials from the
//     client's own destination ID, which a Retry token's holder may choose
//     4 bytes long and send from any address: they teach nothing, whatever
//     the ID's length (TestRefusalsTeachNothing makes them with a real
//     quic-go).
//   - Peers: the destination of a datagram of a connection the server
//     keeps: one holding a short-header packet, a Handshake packet or an
//     Initial of a connection (see above). Never that of a stateless reply
//     (Retry, Version Negotiation, a refusal), which a spoofer can direct at
//     any address: when the server asks for a Retry (Caddy does above 1000
//     handshakes a second) no spoofed source becomes a peer. Without a
//     Retry the server answers any Initial with a connection, so a
//     spoofer's forged source does become a peer, an answered one, for a
//     while (TestStatelessRepliesTeachNoPeer shows both cases): a lower
//     tier, which verifies nothing.
//   - Proofs: a peer is proven when the server sends it a short header to a
//     destination ID that none of the server's handshakes with it used:
//     an ID the client issued in a NEW_CONNECTION_ID frame, which quic-go
//     reads only from a packet it could decrypt, so from a client that
//     received the server's handshake at that address. The server of a
//     spoofed source never learns one. The filter proves an address too,
//     on its own, when a datagram from it carries a server ID bound to it.
//
// What it cannot see: the IDs the server issues in NEW_CONNECTION_ID
// frames, which are encrypted. A quic-go client moves to one of them as
// soon as its handshake completes, which the server's first flight may
// complete (its 1-RTT packets carry those frames): from then on, even its
// Initial acknowledgement and its Finished carry an ID no learner saw, and
// it may never send back the ID the server revealed. Its Handshake and
// short-header packets are of an answered peer until the server's packets
// show it proven, one round trip later (TestQUICGoTeaches counts them).
//
// # Cost and memory
//
// Learn allocates nothing. A short-header datagram (or GSO batch) costs a
// clock read and one map lookup under the lock of one of 16 shards, chosen
// by a keyed hash of the peer's address. A sink is called only for a new
// ID, an ID not reported for a quarter of the lifetime, and a peer not
// reported for PeerInterval (1 s). The sink is called before Learn returns,
// under the shard's lock, so that a datagram carrying an ID or going to a
// peer leaves only after the sink knows them, even when several goroutines
// write to one peer at once.
//
// The Learner remembers at most MaxIDs server IDs (each for the lifetime
// after it was last sent, to teach them to a new sink), each with the
// address it was sent to, and MaxPeers peers (each for PeerInterval), each
// with the destination IDs of the server's handshakes with it. An entry is
// a map slot of 40 bytes for an ID and 52 for a peer; with Go's map
// overhead (a table doubles at 7/8 full) that is 45 to 120 bytes an entry:
// with both tables full the Learner holds under 16 MiB (14 MiB measured on
// amd64, TestMemoryBound). The tables hold no pointers, so the garbage
// collector does not scan them. When a shard is
// full, it forgets the entries past their time and, if that frees less
// than an eighth of it, all of them (Stats.Overflows): the cost is a report
// again, never a refused write.
package egress
