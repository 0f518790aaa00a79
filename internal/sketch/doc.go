// Package sketch is the hierarchical fair-share rate limiter of rakelimit in
// plain, deterministic Go. The BPF socket filter in bpf/rakelimit.c performs
// the same integer operations in the same order; tests feed both one packet
// trace and compare verdicts and state bit for bit.
//
// # The lattice
//
// A packet's key is its address family, source address, source port and
// destination port (the destination address is the socket's own). The
// limiter generalises the key along each dimension: the source address to
// each configured prefix (by default IPv4 /32, /24, /0 and IPv6 /64, /48,
// /0), the source port to itself or a wildcard, and the destination port to
// itself or a wildcard. Each combination is a lattice node; its level is the
// number of generalisations applied (prefix slot + wildcard ports). With the
// default prefixes and one socket:
//
//	level 0: /32 sport=N
//	level 1: /32 sport=*    /24 sport=N
//	level 2: /24 sport=*    /0 sport=N     (all sources from one port: reflection)
//	level 3: /0 sport=*                    (the socket's total)
//
// A socket only receives packets for its own port, so the nodes that differ
// only in the destination port would count exactly the same packets. Unless
// Config.PerDstPort asks for the dimension (a limiter shared by sockets on
// several ports, 12 nodes and 5 levels), it is dropped: 6 nodes, half the
// work per packet. IPv4 and IPv6 share the nodes by prefix slot; the /0
// nodes leave the family out of the key, so the socket's total and the
// reflection nodes count both families together. Packets whose network
// header cannot be parsed count at the /0 sport=* node, those without a
// readable transport header at the sport=* nodes: nothing is a free pass.
//
// # Rate estimation
//
// Each node keeps, per stream, an exponentially decayed packet count
//
//	count(t) = sum over the stream's packets i of exp(-(t - t_i) / window)
//
// which is Tony Finch's exponential rate estimate with varying intervals in
// the limit of a cost of one packet: alpha = exp(-dt/window) decays the old
// value and each packet adds its full weight, so a fresh or long-idle stream
// counts its first packet as 1, a burst of n back-to-back packets counts n,
// and a steady stream of r packets per second converges to r*window + 1/2.
// The count is compared with threshold = limit * window: the limit is in
// packets per second as the operator sees it, and limit*window is also the
// burst a fresh stream may send. Reported rates are count/window.
//
// BPF has no floating point, so the arithmetic is fixed point (Q24 counts,
// Q32 fractions) and the exponential comes from tables computed once per
// configuration (Compile). To avoid an exponential per cell and packet, the
// counters use forward decay: time is cut into epochs of 2^20 ns (1.05 ms)
// and slots of 2^12 ns (4.1 µs); a cell stores its counts scaled to the start
// of its epoch, a packet in slot s adds G[s] = exp(s*2^12 ns/window), and a
// count is compared with threshold*G[s] instead of being decayed to now. Only
// a cell last touched in an older epoch is rescaled, by a decay factor looked
// up in three 512-entry tables (idle times up to 2^27 epochs, 39 h; older
// cells are zeroed). Because epochs are absolute time, a new window (a
// reload) keeps every count valid. Errors: table entries are rounded to half
// a unit (2^-25 relative for G, 2^-33 for decay factors; a composed decay
// factor is within 4 units of 2^-32, see TestTables), each product is
// floored (one unit of 2^-24 packets), and a packet weighs as if it arrived
// at the start of its 4.1 µs slot (relative error at most 4.1 µs/window).
// TestEstimateTracksExactRate checks the estimate against the exact decayed
// count in floating point within 10^-6 relative.
//
// # The decision
//
// The packet walks the nodes by level, most specific first. At each node it
// is counted in one of two classes of that node's cell:
//
//   - clean: traffic that no more specific node has found over its limit;
//   - limited: survivors of a node below that found their stream over its
//     limit.
//
// The classes have separate counts and separate budgets of `limit` each. A
// node compares the count of the packet's class with the limit:
//
//  1. count <= threshold: the packet passes this node.
//  2. count > threshold: the stream is over its limit (Verdict.Limited).
//     The packet still passes this node, but from the next level on it
//     counts as limited.
//  3. count > threshold + margin, margin = sqrt(2*threshold) packets (two
//     standard deviations of the count of a Poisson stream at exactly the
//     limit): the node enforces the limit. It keeps a second count per
//     class, of the packets it forwarded, and lets a packet through only
//     while that count is below the threshold, with the threshold dithered
//     down by a uniform random fraction of one packet. A dropped packet is
//     not counted at more general levels.
//
// Why each piece:
//
// Holding the forwarded count at the threshold forwards exactly `limit`
// packets per second from a stream that offers `rate`: in the steady state a
// packet is dropped with probability 1 - limit/rate, the paper's rule. The
// paper draws an independent coin per packet instead, which has two
// problems. Its noise is binomial: at 100 pps against a limit of 25, one
// second forwards 25 +- 4.3 (one standard deviation), so no second can be
// promised within 10%. And it compares against an estimate that is still
// ramping up, forwarding about limit*(1 + ln(rate/limit)) in the first window
// (the paper's 361 at limit 25 against 1 Mpps). The forwarded count bounds
// the first window to the burst, the margin and one window at the limit
// (paper-4: 52 at limit 25), and the dither decides at random which of
// several competing packets takes a freed slot, so that periodic streams
// sharing a node cannot lock each other out by phase.
//
// The margin keeps the limiter from punishing noise: a Poisson stream at 80%
// of its limit (the legit traffic of paper-2 at the all-sources node) would
// otherwise lose 1.5-2.8% of its packets to its own bursts; with it, at most
// 0.5% (eight seeds). A steady stream between the limit and limit + margin is counted as
// limited above but not cut; beyond, it is held at the limit.
//
// Counting survivors at the general levels closes the reference
// implementation's hole: it stops at the first node over its limit, so an
// address spreading a flood over 1024 source ports gets 25 pps per port
// (25.6 kpps at limit 25). Here those survivors are limited traffic at
// "address sport=*", which holds them to 25 pps in all (scenario many-ports).
//
// Separate budgets keep a limited flood from crowding out clean traffic,
// which the paper achieves by not counting limited packets above at all. One
// could instead let limited traffic use only what clean traffic leaves of a
// node's limit. That fails the paper's first scenario: a flood held at 25 pps
// at its own 4-tuple and a clean 5 pps neighbour in the same /24 would leave
// the flood 20 of the /24's 25, where the paper keeps the flood at 25. With
// separate budgets a node forwards at most `limit` of clean and `limit` of
// limited traffic: twice the limit in the worst case, reached only by an
// attacker who also keeps some streams just under their limits.
//
// Marking a stream limited at the threshold, before enforcing at the margin,
// stops a new flood from crowding out clean traffic above it while it ramps:
// its packets count as clean up there only until its own node reaches the
// limit, not the limit plus the margin.
//
// # The sketches
//
// Every node has a count-min sketch of Depth rows by Width cells; a cell
// holds an epoch and the offered and forwarded counts of both classes (40
// bytes). A stream's count is the minimum over its cells in the rows, and
// all its cells are updated. Columns come from strongly universal
// multiply-add-shift hashing of the key's 32-bit words under a HashKey drawn
// from crypto/rand per limiter (see HashKey), so collisions cannot be
// computed offline.
//
// Width 4096 and depth 2 give the classic count-min bound: an estimate
// exceeds the true count by more than epsilon*N, epsilon = e/4096 = 0.066% of
// the node's total count N, with probability at most delta = e^-2 = 13.5%
// (TestSketchAccuracyZipf). The bound that matters for losses is sharper: a
// legit stream is over-counted only if each of its cells collides with a heavy
// stream, probability (1 - (1 - 1/4096)^K)^2 for K heavy streams. In scenario
// distributed, K = 256 flooding /24s at 3,900 pps each against a limit of
// 1000: 0.37% of legit /24s collide twice, where the reference
// implementation's 2 x 512 sketch collides for 15%. The sketches take
// 6 nodes x 2 x 4096 x 40 bytes = 1.9 MiB with the default lattice (up to
// 5 MiB for 16 nodes; see Limiter.MemoryBytes).
//
// # Determinism
//
// Decide takes the time and a random number as arguments and allocates
// nothing. The charts and numbers of every scenario are in docs/limiter.md;
// go run ./cmd/rakesim -scenario all -out DIR regenerates them.
package sketch
