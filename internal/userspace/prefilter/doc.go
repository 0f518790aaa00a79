// Package prefilter builds and attaches a classic BPF socket filter that
// drops, in the kernel, before the socket's receive queue and without any
// capability, part of what the userspace limiter (package userspace) would
// drop after receiving it: the datagrams quicclass calls invalid that a
// stateless program can recognise (Stateless), packets of the streams the
// userspace limiter is dropping and of the networks its fair total drops,
// each with a drop probability from its rate and limit, unknown versions
// over the Version Negotiation cap (Enforcer), and long headers shed while
// the receive queue overflows (Enforcer.SetShed, steered by package
// backlog's Shedder).
//
// Classic BPF has no maps and no counters: what the program drops is
// estimated. One invalid datagram in 2^SampleShift passes, for the userspace
// limiter to count by reason; a stream's kernel drops follow from the rate
// the userspace limiter still sees and the probability in force. The
// userspace limiter still decides every datagram that passes, so the pair
// never protects less than the userspace limiter alone.
//
// A stream's rule matches the stream's source, its ports when the stream's
// node counts them, and the header forms of its class (Form, FormOf).
// Classic BPF cannot verify a connection ID, so only the established
// class's rules may match a packet that verification makes established, or
// a spoofer sending junk "from" a network would take the network's verified
// clients' packets away in the kernel. The unverified class has no rules
// (its short headers and Handshakes look like the established class's).
// The opening class's, with verification, match only Initial and 0-RTT
// packets whose destination ID cannot be a server ID (not
// quicclass.ServerIDLen bytes long): never a Handshake packet nor one
// addressed to an ID of the server's length, which a server ID bound to its
// source makes established. The established class's match every header
// that class holds, and drop its verified packets in the share the
// userspace limiter would drop of them. A returning user's Initial, which
// classic BPF cannot tell from a stranger's, is left alone by its network's
// rules by its source: the userspace limiter lists the sources it verified
// through their address lately (userspace.Decider.Returning), and each
// opening rule over a network skips those in it (Spec.Returning, up to
// MaxReturningPerRule), as the limiter passes their openings through their
// network's limits; a rule of one address judges its returning user, as the
// limiter's nodes of the address do.
//
// The program sees the datagram at its UDP header; it reads the source
// address relative to the network header (SKF_NET_OFF), IPv4 or IPv6 by the
// version nibble, since a dual-stack socket receives both, and draws random
// numbers with SKF_AD_RANDOM.
package prefilter
