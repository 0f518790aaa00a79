// Package sketch is the hierarchical fair-share rate limiter of rakelimit in
// plain, deterministic Go. The BPF socket filter in internal/kernel performs
// the same integer operations in the same order; tests feed both one packet
// trace and compare verdicts and state bit for bit. Its C is split as this
// package is, a header in internal/kernel/c for each file, of the same
// name: the cells and their decay (cells.go, cells.h), one node's part in
// a decision (node.go), the socket's total counted per CPU (total.go), the
// fair total (fair.go), the screen (screen.go), the walk through the
// lattice (walk.go), and fixed.go, hash.go and lattice.go; limiter.go holds
// the limiter's state, which the C keeps in maps (maps.h). The constants
// marked "C: NAME" are the C program's: internal/kernel/c/contract.h is
// generated from them.
//
// # Classes
//
// The limiter keeps three lattices of sketches with limits of their own, one
// per traffic class (package quicclass sorts datagrams, and names the
// classes): the opening class (quicclass.Opening) counts packets that open
// QUIC connections (Initial, 0-RTT, Handshake), or every datagram when the
// filter does not classify; the established class (quicclass.Established)
// counts packets of established connections (short headers); the
// unverified class (quicclass.Unverified), only when the filter verifies
// connection IDs, counts the short headers it could not verify (neither a
// connection ID the server issued nor an address the server sends to), and
// the established class then counts the verified ones, and the openings
// that answer the server's own connection ID. What costs a server is a new
// connection, and what its users need is that established ones keep
// flowing: the opening class has limits near a client's connection rate,
// the established class limits hundreds of times a client's packet rate, so
// that an upload or download at a gigabit a second passes untouched while
// one source flooding short-header junk is still held. The unverified class
// has a small total of its own (DefaultUnverifiedTotal), shared fairly as
// the opening class's, which holds junk from any number of spoofed
// sources. A flood of one class never takes another's
// budget. An opening packet from a returning user (Key.Returning: an
// address that proved itself, or that the server talks to and that has
// credit left) passes the nodes of its network as if under their limits,
// its own address's still judging it, and goes first at the opening
// class's fair total while the returning part of the total
// (ReturningShareShift: half of it) has room; the others are ranked against
// what that part leaves, so that returning users never take more than
// their part, nor strangers less than the rest.
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
// BPF has no floating point, so the arithmetic is fixed point and the
// exponential comes from tables computed once per configuration (Compile).
// Counts are 32-bit with FracBits = 8 fractional bits (a 256th of a packet,
// up to 2^24 packets), which bounds limit*window to MaxBurst = 2^23 packets;
// weights are Q24 and decay factors Q32. To avoid an exponential per cell and
// packet, the counters use forward decay: time is cut into epochs of 2^20 ns
// (1.05 ms) and slots of 2^12 ns (4.1 µs); a cell stores its counts scaled to
// the start of its epoch, a packet in slot s adds W[s], exp(s*2^12 ns/window)
// as a count, and a count is compared with threshold*G[s] instead of being
// decayed to now. Only a cell last touched in an older epoch is rescaled, by a
// decay factor looked up in three 512-entry tables (idle times up to 2^27
// epochs, 39 h; older cells are zeroed). Because epochs are absolute time, a
// new window (a reload) keeps every count valid.
//
// Errors: a packet weighs its slot's weight rounded to 1/256 (at most 0.2%
// off), a packet weighs as if it arrived at the start of its 4.1 µs slot
// (relative error at most 4.1 µs/window), decay factors are within 4 units of
// 2^-32 (TestTables), and each rescale floors a count by less than 1/256 of a
// packet. So an estimate is never more than 0.5% under a stream's exact
// decayed count (TestEstimateTracksExactRate sees 0.04% to 0.24%), and a cell
// rescaled in every epoch is under its exact count by at most window/epoch
// 256ths of a packet in all (3.7 packets at a 1 s window). A stream is held at
// its limit within 0.2% (TestBurst).
//
// A cell keeps the low 32 bits of its epoch, which wrap after 52 days. A
// clock reading up to SkewEpochs (about 1 s) older than a cell's epoch, which
// happens when another CPU moved the cell on first, is taken as the cell's
// own epoch: no decay and no change of epoch (the packet weighs at most a
// factor exp(epoch/window) too much, 0.1% at 1 s). Anything further behind is
// an idle time long enough to forget the cell. Sweep, run daily by the
// filter's owner, resets the cells idle for 39 h or more, so that none
// idles the 52 days its epoch would need to wrap round to look recent.
//
// # The decision
//
// The packet walks the nodes of its class by level, most specific first. At
// each node it is counted in one of two budgets of that node's cell:
//
//   - clean: traffic that no more specific node has found over its limit;
//   - limited: survivors of a node below that found their stream over its
//     limit.
//
// The budgets have separate counts and separate limits of `limit` each. A
// node compares the count of the packet's budget with the limit:
//
//  1. count <= threshold: the packet passes this node.
//  2. count > threshold: the stream is over its limit (Verdict.Limited).
//     The packet still passes this node, but from the next level on it
//     counts as limited.
//  3. count > threshold + margin, margin = sqrt(2*threshold) packets (two
//     standard deviations of the count of a Poisson stream at exactly the
//     limit): the node enforces the limit. It keeps a second count per
//     budget, of the packets it forwarded, and lets a packet through only
//     while that count is below the threshold, with the threshold dithered
//     down by a uniform random fraction of one packet. A dropped packet is
//     not counted at more general levels. The socket's total decides
//     differently, by sources (the fair total, below).
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
// # The fair total
//
// At every node but the last, a stream over its limit is one source, one
// network or one port, and holding it at the limit is the point. The last
// node, the socket's total, is everyone: dropping the same share of every
// packet there would make a quiet network's new connections fail as often as
// a flood's. So the total's cap is shared max-min fairly among the streams of
// the level below it that count networks (/24, /48): a network that sends
// less than the fair share loses nothing, and the ones above it are cut to
// it. And a capped total drops whole sources rather than a random share of
// everyone's packets (RFC 9312, section 4.4): a QUIC handshake needs several
// packets, so 50% loss for every source serves none of them, while serving
// half the sources fully serves half.
//
// When the total enforces its cap, a packet passes if its source (its address
// and port) is admitted: rank * network <= share, where rank is a
// keyed hash of the source and the current period of 2^32 ns (about 4.3 s),
// uniform in [0, 1), network is the estimated rate of the packet's network
// and share the fair share. A network sending r is admitted at min(r, share),
// by whole sources, chosen afresh every period. Core-stateless fair queueing
// (Stoica, Shenker and Zhang, SIGCOMM 1998) estimates the fair share from
// the accepted rate; here it is found by stochastic approximation from the
// packets themselves: the share should admit the fraction f = cap/total of
// what arrives, so every admitted packet shrinks it by 1/256 of itself times
// 1 - f and every refused one grows it by 1/256 times f, which balance when
// the admitted fraction is f (see admitFair). While a flood starts, its
// offered rate is still ramping up and the share admits too much; the
// forwarded count then scales the share down, to nothing at twice the cap,
// which bounds the total while the share settles. The scaling cuts every
// network alike, a quiet one too, so it starts only above the cap and
// reaches nothing only at twice it: with a bound of 1.25 times the cap, a
// network at two thirds of the fair share lost packets in every pulse of a
// flood that stops and starts. While the total forwards less than its cap,
// every packet passes and the share stays as it is: after a flood stops, the
// total's smoothed offered rate stays over the cap for a while, and a share
// learning from the few packets of the quiet would admit only cap / offered
// of them.
//
// Once the share has settled, the fair total does no worse for any network
// than one drop rate for everyone would: every network keeps at least f =
// cap/total of its packets (the proportional floor). The share sees a network through its estimate, and
// under a spoofed flood, a new random source on every packet, every /24 of the
// flood looks alike: a cell of the network node holds several of them, and a
// quiet network's cells hold its own rate on top of theirs. Its estimate is
// the highest, and the share admits it at a fraction of f (a fifth to a third
// in scenario spoofed). So a packet the rank refuses is still admitted, with
// probability (f - p) / (1 - p) when its network's sources are admitted with
// probability p < f: its network keeps f in all. The coin is the packet's
// random number, bits 8 to 23 (the top 8 dither the threshold, the low ones
// sample drops). A network the share admits at f or more never needs the
// floor, so one under the fair share still loses nothing. The floor is scaled
// down with the share while the total's forwarded count is over the cap; that
// count leaves out what the floor adds, so the share holds it at the cap and,
// once settled, does not scale the floor. The floor comes on top of what the
// share admits: it lifts every network whose estimate is over the typical one,
// and in a spoofed flood that is half of them, by the noise of their
// estimates: the total then forwards up to 15% over its cap (scenario spoofed;
// about 7% for a flood spread over a /4, 16% over a /12). While the share
// settles, the forwarded count bounds what it admits as before, and scales the
// floor alike: both admit nothing once the count reaches twice the cap.
//
// In scenario quiet-network, 204,800 pps from 256 /24s against a cap of
// 20,000, a client in a quiet /24 loses at most one packet (499 to 516 of 499
// to 516 over seeds 1-3), and the flood is held at 19,950 to 21,790 pps after
// the first second (56,000 in it: the burst and the settling; over 20,500, the
// floor tops up /24s whose sources drew high ranks for the period, which
// leaves the share a little under f for all of them); in
// quiet-network-pulse, the same flood for 0.5 s every 2 s, the client loses 6
// to 23 of 499 to 516, in the pulses only. With the cap shared by one drop
// rate for everyone, the client keeps 10 to 11% of its packets. In scenario
// spoofed, 100,000 pps from a new random source in a /9 on every packet
// against the same cap, the client keeps 88 to 100 of its 452 to 474 packets
// after the first second, where one drop rate for everyone leaves it 90 to 95
// (before the floor: 20 to 33); the flood is held at 22,498 to 23,013 pps.
//
// # The returning part
//
// A returning user's opening (Key.Returning) is not cut off by a flood from
// its own network: at the nodes of its network and wider but the total
// (Params.ReturningExempt) it passes as if under their limits, still counted
// there; its own address's nodes judge it as anyone's. At the fair total it
// goes first (admitted whatever the share) while the returning part, a
// pacer at ReturningShareShift of the total's limit (half of it, a
// second's worth at once), has room, and is counted in the part's cell
// (Params.ReturningLine); past the part it is ranked as anyone. Every
// other packet is ranked against what the part leaves: the total's offered
// and forwarded counts and its limit less the part's forwarded count, so
// that the share and the proportional floor give the rest of the limit to
// everyone else, and the two together hold the total. Ranked against the
// whole total instead, with the part's packets among those the share
// learns from, 60 returning sources at 900 pps each against a total of
// 20,000 passed 25,600 pps (TestReturningBotnet holds them at the total,
// and a quiet stranger network loses nothing). The screen never judges a
// returning user's packet, which passes its network's node.
//
// # The screen
//
// Under a spoofed flood nearly every packet is a new source that one general
// node drops, and the walk counts it at every node on the way, the cells of
// each a cache miss (a new source's cost is its cells), to no end: a new
// source is under every limit but that node's. The node is the fair total
// when the flood's source ports are random too, and the reflection node
// (all sources from one port) when the flood keeps one source port. So
// where such a node drops clean traffic (Limiter.screening), a clean packet
// is first screened there (Limiter.screen): its network node's cells and
// the node's are read without counting, and the node is asked what the walk
// would ask it, with the counts the walk would find. If the node drops the
// packet, it is counted at those two nodes as the walk would have counted
// it (offered, and forwarded at the network's node, which it passes), and
// dropped. If not, the packet is walked: the walk finds the same counts and
// gets the same answer. A new source dropped by the screen costs two nodes
// instead of six (with the default lattice), and one of the two, the node
// that drops the flood, is in the cache.
//
// The screen runs at the fair total while the last packet there was clean
// and the clean share bounded (noteScreen): the total enforces its share on
// clean traffic. A flood the walk limits below the total reaches it as
// limited traffic and turns that screen off. At the reflection node it runs
// from a clean packet dropped there, by the walk or the screen, until the
// screen meets a packet the node would not drop (noteReflect), which the
// walk then decides. The reflection node is asked first, as the walk would
// meet it first; the total's screen asks admitFair and moves the share as
// the walk would (a packet the total admits has the share put back), the
// reflection node's drops a packet over its enforcing threshold whose
// forwarded count is at the dithered limit, as judgeNode.
//
// What changes: the nodes the screen skips, those more specific than the
// network's and, at the total, the reflection node, do not count the
// packets it drops, so they count what the screening node admits; the
// verdict names the screening node, where the walk might have named a more
// specific node that dropped the packet first. For a new source under every
// limit nothing else changes: in scenarios spoofed and paper-2 every
// verdict and count the screening node and the networks see is the walk's,
// and TestScreenSpoofed finds the same verdict for every packet of a
// spoofed flood and of a reflection flood with and without the screen. The
// screen cannot know what the skipped nodes would have found, so it only
// screens what they cannot change:
//
//   - a packet whose network node holds any limited traffic (a stream that
//     some node below found over its limit), or is over half its limit with
//     it (ScreenHeadroomShift), is walked, and so is every packet of its
//     network. The nodes the screen skips miss at most what the network
//     counted of the screened packets, under half a limit, decaying from
//     the moment the network is walked again; a stream growing there
//     reaches its node's limit soon after it would have with the walk
//     alone, and that node limits it as before. Without the headroom
//     (screening up to the network's limit) the network crossed its limit
//     first and limited the stream one level up, and in scenario
//     queue-follow the total, moved by the queue, let 11 to 229 packets
//     find quic-go's queue full in seconds 4-7 (seeds 1-12), where the walk
//     alone loses none; with it, none either;
//   - the screen is on only when no node more specific than the network's
//     has a lower limit (Params.Screen). A stream over such a node's limit
//     is then over its network's too, so the first packets of a flood from
//     one source, screened as clean, bring its network past the headroom,
//     and from then on its network is walked and the source counted as
//     limited as before;
//   - a source the total refused for a period (its rank) is not counted at
//     its own node meanwhile, so when a later period admits it, its own node
//     starts from what it passed: at most one burst (limit x window) more
//     than the walk would have let through at that node, once per period
//     change, with the total still bounding everything;
//   - a reflection flood refused at the total (its port's node under its
//     limit, or no reflection screen) is counted at the reflection node
//     only for what the total admits, which that node still holds to its
//     limit.
//
// The reflection node's screen needs a lattice where it follows the
// network node (not with the destination port dimension) and a network
// node (a fair total: not with ProportionalTotal).
//
// Over the scenarios (seed 1): in spoofed (about 3 pps a /24) the screen
// decides 734,241 packets, 76,000 a second, nearly every drop, all at the
// total. In quiet-network (each /24 at 800 pps, over the headroom) it
// decides the flood only while the networks' estimates rise: 142,077
// packets in second 0, 3,407 in second 1, none after; the flood is then
// held at 20,380 to 21,116 pps (20,393 to 21,250 without) and the client
// loses nothing. In quiet-network-pulse it decides the start of each pulse
// (81,405 to 109,233 packets a pulse), in queue-follow 76,780 packets in the
// flood's first second. In paper-2 (100 pps from random addresses, all from
// port 53, a limit of 25) the reflection node's screen decides 2,640 of the
// flood's 4,346 drops; the rest are walked, each after a packet the node
// let through.
// Scenarios whose flood is limited below the total and the reflection node
// (distributed, the other papers') are walked and unchanged. Per packet, a
// new random source dropped by the screen costs about half of what the
// walk costs (see lab/NOTEBOOK.md).
//
// # The sketches
//
// Every node has a count-min sketch of Depth = 2 rows per class; a cell holds
// the low bits of its epoch and the offered and forwarded counts of both
// budgets, 20 bytes, and three cells share a 64-byte line, so that no cell
// straddles two cache lines. A stream's count is the minimum over its cells
// in the rows, and all its cells are updated. Columns come from strongly
// universal multiply-add-shift hashing of the key's 32-bit words under a
// HashKey drawn from crypto/rand per limiter (see HashKey), so collisions
// cannot be computed offline, followed by a fixed mixing step that keeps keys
// in arithmetic progression (consecutive /24s, ports) from crowding into a
// few columns.
//
// A row of the opening class has OpeningWidth = 4140 cells: an estimate
// exceeds the true count by more than epsilon*N, epsilon = e/4140 = 0.066%
// of the node's total count N, with probability at most delta = e^-2 =
// 13.5% (TestSketchAccuracyZipf). The bound that matters for losses is
// sharper: a legit stream is over-counted only if each of its cells collides
// with a heavy stream, probability (1 - (1 - 1/4140)^K)^2 for K heavy
// streams. In scenario distributed, K = 256 flooding /24s: 0.36% of legit
// /24s collide twice, where the reference implementation's 2 x 512 sketch
// collides for 15%; a flood from 1024 ports of one address (many-ports)
// shares both cells of a legit stream's port with probability 4.8%. A row of
// the established class has 576 cells (epsilon = e/576 = 0.47%): its limits
// are hundreds of times a client's rate, so cells shared with a few other
// clients change nothing, and a single flooding source shares both of a
// client's cells with probability 1/576^2. A row of the unverified class has
// 192 cells (epsilon = e/192 = 1.4%): it counts junk and the rare client not
// verified yet, whose estimate a flood of N packets a window inflates by
// more than 1.4% of N with probability at most delta; the class's small
// total holds the junk whatever the sketch makes of each source. The
// socket's total counts one stream and has one line per row. With the
// default lattice the sketches of the three classes, with the returning
// part's line, take ((5 x 1380 + 5 x 192 + 5 x 64 + 3) x 2 + 1) x 64 =
// 1,047,488 bytes, under 1 MiB (Params.TotalLines); the 16-node lattice
// takes 3.0 MiB.
//
// # Several CPUs
//
// The BPF program runs on every CPU that receives packets, and every packet
// of a class counts at the socket's total: with one shared cell, its cache
// line would move from CPU to CPU on every packet and concurrent increments
// would be lost, so that N CPUs would drop little more than one. Instead each
// CPU counts the total in a pending cell of its own (Limiter.countTotal; a
// per-CPU map in the C program) and adds the pending counts to the shared
// cells when it sees the epoch change, before the cells are brought to the
// new epoch; a CPU's estimate of the total is the shared count plus its own
// pending. On one CPU that is exactly the count of a single cell (a
// saturating add is associative, and the pending counts join the shared
// ones in the same epoch, before the decay). On several, a CPU's estimate
// lacks what the others counted since their last flush: at most one epoch
// (1.05 ms) of their packets, which they add with their next packet; an
// epoch is a thousandth of a one-second window. The fair shares are per CPU
// too: each CPU finds the share from its own packets, which admits the same
// fraction of them. The other nodes' cells are per stream, shared by the
// CPUs whose packets come from that stream: one source's datagrams usually
// arrive on one CPU (receive-side scaling hashes the addresses and ports).
// This limiter is one CPU; the differential tests run the BPF program on one
// CPU and compare its pending cells with Limiter.Pending.
//
// # Determinism
//
// Decide takes the time and a random number as arguments and allocates
// nothing. The charts and numbers of every scenario are in lab/docs/limiter.md;
// go run ./cmd/rakesim -scenario all -out DIR regenerates them.
package sketch
