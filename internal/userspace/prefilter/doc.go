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
// The program sees the datagram at its UDP header; it reads the source
// address relative to the network header (SKF_NET_OFF), IPv4 or IPv6 by the
// version nibble, since a dual-stack socket receives both, and draws random
// numbers with SKF_AD_RANDOM.
package prefilter
