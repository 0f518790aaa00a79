package filterbench

import (
	"net/netip"
	"slices"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// verdict is what a program is expected to decide on a case's packets.
type verdict int

const (
	anyVerdict verdict = iota // a mix, or not checked
	pass
	drop
)

func (v verdict) String() string {
	return [...]string{"any", "pass", "drop"}[v]
}

// Limits of the cases, in packets per second at every node, for both
// programs but where said.
const (
	// underLimit is this filter's limit in the cases under it: the
	// largest its counters hold over a window of one second
	// (sketch.MaxBurst, 8,388,608), far above what one CPU runs.
	underLimit = sketch.MaxBurst
	// cloudflareUnder is Cloudflare's limit in the cases under it. Its
	// estimate of a cell's rate starts at 1e9 over the time between the
	// cell's first two packets, which BPF_PROG_TEST_RUN runs some hundred
	// nanoseconds apart, and moves slowly after; only 1e9 is sure to stay
	// above every estimate.
	cloudflareUnder = 1_000_000_000
	// overLimit is the limit in the cases of one source flooding over it
	// (as the project's BenchmarkFilter).
	overLimit = 25
	// randomLimit is the limit in the cases of a new source on every
	// packet: each source is under it, and the nodes every packet shares
	// (the whole socket, or Cloudflare's wildcard source) over it.
	randomLimit = 1000
)

// The payload sizes: an Initial of the minimum datagram size a client must
// send, and the 100-byte junk of BenchmarkFilter's invalid case.
const (
	initialSize = 1200
	junkSize    = 100
)

// serverID is a server connection ID the filter learns, bound to the
// case's source, in the cases of a verified short header.
var serverID = decide.ServerID{0x5e, 0x17, 0xa2, 0x09}

// unknownVersion is a QUIC version no one speaks, which asks for a Version
// Negotiation.
const unknownVersion = 0x1a2a3a4a

// caseSpec is one case: a frame (or, with a new source on every packet,
// frames from random sources), this filter's configuration and
// Cloudflare's limit.
type caseSpec struct {
	key, name string
	// ipv6 sends the frame over IPv6 (Cloudflare's filter_ipv6).
	ipv6    bool
	payload []byte
	// ours is this filter's configuration; learn has it learn serverID,
	// bound to the source, and the source as a peer, first; prove has it
	// learn the source as a proven peer too.
	ours         decide.Config
	learn, prove bool
	// randomSource runs this filter's benchmark entry in place of its
	// production one (kernel.BenchOptions.RandomSource): one frame
	// repeated, a new source on every run. Cloudflare's has no such
	// entry, and is not run.
	randomSource bool
	// randomPort gives the once case's frames a random source port too;
	// without, they keep the frame's, so that every packet shares the
	// nodes of that port (in this filter, all sources from one port).
	randomPort bool
	// once runs distinct frames from random sources, each once, for both
	// programs, and subtracts the floor program's time on them.
	once bool
	// cloudflareLimit is Cloudflare's LIMIT; 0 does not run Cloudflare's.
	cloudflareLimit uint32
	// wantOurs and wantCloudflare are the expected verdicts (checked on
	// the last packet of every timed run, and for pass on the counters).
	wantOurs, wantCloudflare verdict
}

// production is this filter configured as Caddy configures it by default
// (classes, connection ID verification, the default blocked source ports,
// 10 version negotiations a second, established connections' socket total
// unlimited) with opening datagrams per second at every node of the opening
// class and established at every other node of the established class.
func production(opening, established uint32) decide.Config {
	top := sketch.Config{}.WithDefaults().Levels() - 1
	return decide.Config{
		Limiter: sketch.Config{
			Limit:  opening,
			Window: time.Second,
			Established: sketch.Limits{Limit: established,
				LevelLimits: map[int]uint32{top: sketch.Unlimited}},
		},
		Classify:     true,
		VerifyIDs:    true,
		BlockedPorts: quicclass.DefaultBlockedPorts(),
		Negotiation:  10,
	}
}

// plain is this filter with every datagram counted alike, as Cloudflare's
// counts them: no classes, so no verification, with limit datagrams per
// second at every node.
func plain(limit uint32) decide.Config {
	return decide.Config{Limiter: sketch.Config{Limit: limit, Window: time.Second}}
}

// cases returns every case, in the table's order.
func cases() []caseSpec {
	initial := quicclasstest.LongPacket(quicclass.Version1, 0, make([]byte, 8), make([]byte, 8), nil, initialSize)
	short := quicclasstest.ShortPacket(serverID, initialSize)
	stranger := quicclasstest.ShortPacket(decide.ServerID{1, 2, 3, 4}, junkSize)
	negotiation := quicclasstest.LongHeader(unknownVersion, 0, 8, 8, initialSize)
	under, over, random := production(underLimit, underLimit), production(overLimit, overLimit), production(randomLimit, randomLimit)
	return []caseSpec{
		{key: "ipv4-under", name: "one source, under the limit",
			payload: initial, ours: under, cloudflareLimit: cloudflareUnder, wantOurs: pass, wantCloudflare: pass},
		{key: "ipv4-over", name: "one source, flooding over it",
			payload: initial, ours: over, cloudflareLimit: overLimit, wantOurs: drop, wantCloudflare: drop},
		{key: "ipv4-random", name: "a new random source on every packet (each run once, minus the floor)",
			payload: initial, ours: random, cloudflareLimit: randomLimit, once: true},
		{key: "ipv4-spoofed", name: "a new random source address and port on every packet (each run once, minus the floor)",
			payload: initial, ours: random, cloudflareLimit: randomLimit, once: true, randomPort: true},
		{key: "ipv4-random-switch", name: "a new random source on every packet (this filter's bench switch, repeated)",
			payload: initial, ours: random, randomSource: true},
		{key: "ipv4-under-plain", name: "one source, under the limit; this filter without classes",
			payload: initial, ours: plain(underLimit), cloudflareLimit: cloudflareUnder, wantOurs: pass, wantCloudflare: pass},
		{key: "ipv4-over-plain", name: "one source, flooding over it; this filter without classes",
			payload: initial, ours: plain(overLimit), cloudflareLimit: overLimit, wantOurs: drop, wantCloudflare: drop},
		{key: "ipv4-random-plain", name: "a new random source on every packet (each run once, minus the floor); this filter without classes",
			payload: initial, ours: plain(randomLimit), cloudflareLimit: randomLimit, once: true},
		{key: "ipv6-under", name: "IPv6, one source, under the limit", ipv6: true,
			payload: initial, ours: under, cloudflareLimit: cloudflareUnder, wantOurs: pass, wantCloudflare: pass},
		{key: "ipv6-over", name: "IPv6, one source, flooding over it", ipv6: true,
			payload: initial, ours: over, cloudflareLimit: overLimit, wantOurs: drop, wantCloudflare: drop},
		{key: "ipv6-random", name: "IPv6, a new random source on every packet (each run once, minus the floor)", ipv6: true,
			payload: initial, ours: random, cloudflareLimit: randomLimit, once: true},
		{key: "established-under", name: "established: short header to a learned ID, under the limit", learn: true,
			payload: short, ours: under, cloudflareLimit: cloudflareUnder, wantOurs: pass, wantCloudflare: pass},
		{key: "established-over", name: "established: short header to a learned ID, over the limit", learn: true,
			payload: short, ours: production(underLimit, overLimit), cloudflareLimit: overLimit, wantOurs: drop, wantCloudflare: drop},
		{key: "established-peer", name: "established: short header to an unknown ID from a proven peer, under the limit", prove: true,
			payload: stranger, ours: under, cloudflareLimit: cloudflareUnder, wantOurs: pass, wantCloudflare: pass},
		{key: "unverified", name: "unverified: short header to an unknown ID (Cloudflare's under its limit)",
			payload: stranger, ours: under, cloudflareLimit: cloudflareUnder, wantOurs: drop, wantCloudflare: pass},
		{key: "invalid", name: "invalid: 100 bytes of zeros (Cloudflare's under its limit)",
			payload: make([]byte, junkSize), ours: under, cloudflareLimit: cloudflareUnder, wantOurs: drop, wantCloudflare: pass},
		{key: "negotiation", name: "unknown QUIC version, paced (Cloudflare's under its limit)",
			payload: negotiation, ours: under, cloudflareLimit: cloudflareUnder, wantOurs: drop, wantCloudflare: pass},
	}
}

// CaseKeys returns the keys of every case, in the table's order.
func CaseKeys() []string {
	var keys []string
	for _, c := range cases() {
		keys = append(keys, c.key)
	}
	return keys
}

// selectCases returns the cases of keys (all for none), in the table's
// order.
func selectCases(keys []string) []caseSpec {
	var out []caseSpec
	for _, c := range cases() {
		if len(keys) == 0 || slices.Contains(keys, c.key) {
			out = append(out, c)
		}
	}
	return out
}

// addresses returns a case's source and destination.
func (c *caseSpec) addresses() (src, dst netip.Addr) {
	if c.ipv6 {
		return srcIPv6, dstIPv6
	}
	return srcIPv4, dstIPv4
}

// frame returns the case's frame from its one source.
func (c *caseSpec) frame() []byte {
	src, dst := c.addresses()
	return testutil.Frame{Src: src, Dst: dst, SrcPort: srcPort, DstPort: dstPort, Data: c.payload}.Bytes()
}
