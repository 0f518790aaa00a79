// Package learn learns from what the server sends what only the server
// knows: the connection IDs it chose, each with the address it sent it to,
// and the addresses it keeps connections with, which its datagrams there
// grant credit. A kernel filter (or the userspace limiter) taught them can
// verify what clients send: a spoofer who never receives the server's
// packets does not know a 4-byte random ID sent to another address (it
// can guess, and the filter bounds the guesses it looks up: see package
// decide), and the credit an address has is what the server sent it,
// which a spoofer can have the server send only by sending itself.
//
// # What it reads
//
// quic-go v0.63 sends every datagram through its packet conn's WriteMsgUDP,
// GSO batches included (several datagrams of one size in one buffer, the
// size in a UDP_SEGMENT control message). The conn quic-go reads and
// writes through in every mode (packetconn.Conn) embeds the listener's
// *net.UDPConn, so quic-go keeps every fast path, and shows each write to a
// Learner before it writes. Each GSO segment is a datagram of its own. What
// a datagram teaches is only what a connection makes (inspect):
//
//   - Server IDs: the source connection ID of the server's Handshake
//     packets, and of its Initials in a datagram that belongs to a
//     connection (with a Handshake packet, or padded to 1200 bytes as only
//     an ack-eliciting Initial is, such as the ServerHello quic-go may send
//     before its Handshake packets), each bound to the datagram's
//     destination (QUIC v1 and v2, RFC 9000 section 17.2, RFC 9369).
//     quic-go's default generator, which Caddy keeps, makes them
//     ServerIDLen (4) random bytes. A Handshake or Retry packet with an ID
//     of another length is counted (Counts.OddIDs) and reported once
//     (Options.OnOddID): verification by ID cannot work then. quic-go's
//     refusals of a connection (CONNECTION_REFUSED, and INVALID_TOKEN for a
//     Retry token from another address) are small lone Initials from the
//     client's own destination ID, which a Retry token's holder may choose
//     4 bytes long and send from any address: they teach nothing, whatever
//     the ID's length (TestRefusalsTeachNothing makes them with a real
//     quic-go). Nor does a Retry: a stateless reply, which a spoofer has
//     the server send to any address at the rate it likes (the client that
//     answers it opens a connection, whose ID is taught then).
//   - Peers: the destination of a datagram of a connection the server
//     keeps: one holding a short-header packet, a Handshake packet or an
//     Initial of a connection (see above). Never that of a stateless reply
//     (Retry, Version Negotiation, a refusal), which a spoofer can direct at
//     any address: when the server asks for a Retry (Caddy does above 1000
//     handshakes a second) no spoofed source becomes a peer. Without a
//     Retry the server answers any Initial with a connection, so a
//     spoofer's forged source does become a peer, an answered one, for a
//     while (TestStatelessRepliesTeachNoPeer shows both cases): a lower
//     tier, which verifies nothing by itself.
//   - Credit: each datagram of a connection that holds a short-header
//     packet grants its destination credit (Sink.Grant), which the filter
//     spends on the datagrams from that address it cannot verify by an ID
//     or a proof (decide.Credit): decide.CreditPerDatagram for an
//     established connection's datagram, less for a handshake's 0.5-RTT
//     data (CreditInHandshake: a spoofed Initial's answer holds some), one
//     for a datagram shaped as quic-go's stateless replies to a datagram of
//     the address's own (a path probe of 1200 bytes written alone, a
//     stateless reset of 42), which pays back the datagram that asked for
//     it. A new peer starts with decide.CreditFirst.
//
// What it cannot see: the IDs the server issues in NEW_CONNECTION_ID
// frames, which are encrypted. A quic-go client moves to one of them as
// soon as it reads them, in the server's first flight: when that flight
// fits one datagram, even its Initial acknowledgement and its Finished
// carry an ID no learner saw, and it never sends back the ID the server
// revealed. When the flight spans several datagrams (Caddy's, with its
// certificate chain), the acknowledgements it pads and sends before it
// has read the 1-RTT part carry the server's first ID, and prove its
// address (a third of connections in the lab's idle runs). Its packets are
// verified by its address's credit, which the server's packets to it
// earn; TestQUICGoTeaches counts them, an upload included, whose
// acknowledgements the server writes one for tens of the client's packets
// when it reads them in batches (hence the size of CreditPerDatagram).
//
// # What it does not take as proof
//
// Nothing the server sends proves that an address receives it: quic-go
// sends a short header to a new ID at any address one of a connection's
// 1-RTT packets comes from (a PATH_CHALLENGE, to a fresh ID of the
// connection's client), replays a closed connection's CONNECTION_CLOSE to
// whoever sends to it, answers 0-RTT data before the handshake completes,
// and with a reset key sends stateless resets to any address; an attacker
// with a connection of its own can have each sent to an address it does
// not receive at. Proofs are the filter's alone: a long header from the
// address that carries a server ID bound to it (decide.Filter).
// TestBorrowedProof tries the path probe and the resets with a real quic-go
// server: the victim is never proven, and its credit grows by at most one
// for each datagram the attacker sent from its address.
//
// Credit is cheaper to borrow than a proof, and buys less. A closed
// connection's CONNECTION_CLOSE, replayed to a spoofed address (quic-go
// answers the 1st, 2nd, 4th, 8th... datagram it gets, for three PTOs), is a
// lone short header like any, and grants that address CreditFirst and
// CreditPerDatagram: about 96 datagrams for one spoofed, per connection the
// attacker had the server close, and a spoofed ClientHello's answer earns
// a few more. Credit verifies an answered address's short headers and
// Handshake packets as established, never its Initials as a returning
// user's (quicclass.Verification.Returning) nor a proof: what it buys the
// spoofer is that many datagrams at the established limits, from an
// address quic-go holds no connection for.
//
// # Cost and memory
//
// Learn allocates nothing. A short-header datagram (or GSO batch) costs a
// clock read and one map lookup under the lock of one of 16 shards, chosen
// by a keyed hash of the peer's address, and a grant (a hash and a set's
// lookup in the engine's answered peers, and an atomic add). A sink is
// called for a grant at every such write, and otherwise only for a new
// ID, an ID not reported for a quarter of the lifetime, and a peer not
// reported for PeerInterval (1 s). The sink is called before Learn returns,
// under the shard's lock, so that a datagram carrying an ID or going to a
// peer leaves only after the sink knows them, even when several goroutines
// write to one peer at once.
//
// The Learner remembers at most MaxIDs server IDs (each for the lifetime
// after it was last sent, to teach them to a new sink), each with the
// address it was sent to, and MaxPeers peers (each for PeerInterval), each
// with the destination IDs of the server's latest long headers to it. An
// entry is
// a map slot of 40 bytes for an ID and 49 for a peer; with Go's map
// overhead (a table doubles at 7/8 full) that is 45 to 120 bytes an entry:
// with both tables full the Learner holds under 16 MiB (14 MiB measured on
// amd64, TestMemoryBound). The tables hold no pointers, so the garbage
// collector does not scan them. When a shard is
// full, it forgets the entries past their time and, if that frees less
// than an eighth of it, all of them (Counts.Overflows): the cost is a report
// again, never a refused write.
package learn
