// Package report is the snapshot of running limiters that every view
// renders: the admin API serves it as JSON (GET /rakelimit/), the Prometheus
// collector builds its metrics from it, and the console decodes the admin
// JSON back into it. Package engine fills it (Limiter.Report); ConfigOf
// reads a decision configuration as every view shows it. It holds only the
// types and that conversion, with the standard library and the decision's
// packages (pure Go) beneath them, so that the console reads the schema
// without the engines' dependencies (BPF, quic-go).
package report

import (
	"time"
)

// View is the JSON of GET /rakelimit/: every running limiter, by name.
type View struct {
	Limiters []Limiter `json:"limiters"`
}

// Families are the keys of a limiter's Counters, the address families, in
// the order of the engines' counters.
var Families = [...]string{"unknown", "ipv4", "ipv6"}

// The names of the classes in counters, limits, streams and metrics.
const (
	// ClassOpening is the class of connection-opening packets (long
	// headers); ClassAll stands for it when the limiter does not classify
	// and every datagram counts alike.
	ClassOpening = "opening"
	ClassAll     = "all"
	// ClassEstablished is the class of packets of established
	// connections (short headers), ClassUnverified that of short headers
	// whose connection ID or source the server did not give out.
	ClassEstablished = "established"
	ClassUnverified  = "unverified"
	// ClassNegotiation is the class of datagrams with a QUIC version
	// quic-go lacks, ClassInvalid that of invalid datagrams, which no
	// limiter counts.
	ClassNegotiation = "negotiation"
	ClassInvalid     = "invalid"
)

// Limiter is one limiter's report.
type Limiter struct {
	Name string `json:"name"`
	// Mode is the concrete mode the limiter runs in: xdp (at the driver),
	// bpf (in the kernel) or userspace (in front of quic-go).
	Mode      string   `json:"mode"`
	Listeners []string `json:"listeners"`
	// XDP are the interfaces of the listeners' traffic in mode xdp (absent
	// in the others): those the XDP program runs on, and those where it
	// does not (socket_filter_only); the sockets' filter decides what
	// arrives elsewhere (loopback) and what the program did not pass.
	XDP []XDPInterface `json:"xdp,omitempty"`
	// XDPTableError is the last failure to keep the XDP program's table of
	// destinations current (the host's addresses, its other sockets).
	XDPTableError string `json:"xdp_table_error,omitempty"`
	// Config is the configuration in force, with every default filled in.
	Config Config `json:"config"`
	// Counters are packet counts by family (Families).
	Counters map[string]Counters `json:"counters"`
	// LimitedStreams are the streams with recent drops, the fastest first,
	// at most 20.
	LimitedStreams []Stream `json:"limited_streams"`
	// LimitedStreamsTotal counts them all.
	LimitedStreamsTotal int `json:"limited_streams_total"`
	// UntrackedDrops estimates the drops of streams not tracked because
	// new streams came faster than 200 a second (a flood from a new source
	// on every packet): they are counted, not listed.
	UntrackedDrops uint64 `json:"untracked_drops"`
	// OpeningTotal is the cap in force on the socket's connection-opening
	// packets.
	OpeningTotal Total `json:"opening_total"`
	// EstablishedTotal is the cap in force on the socket's packets of
	// established connections.
	EstablishedTotal Total `json:"established_total"`
	// Verification says whether the limiter verifies what clients send
	// against what the server sent, and what it learned.
	Verification Verification `json:"verification"`
	// AttachErrors counts the listeners the limiter should protect and
	// could not.
	AttachErrors uint64 `json:"attach_errors"`
	// Prefilter is the userspace mode's kernel pre-filter (absent in the
	// bpf mode).
	Prefilter *Prefilter `json:"prefilter,omitempty"`
}

// XDPInterface is a network interface that carries the traffic of
// listeners of a limiter in mode xdp: one the XDP program runs on, or one
// where the socket filter alone decides.
type XDPInterface struct {
	Name string `json:"name"`
	// Attach is how the program runs there: native (in the driver),
	// generic (after the kernel has allocated the packet), or
	// socket_filter_only (it does not: the socket filter decides).
	Attach string `json:"attach"`
	// Reason says why the program does not run there (socket_filter_only):
	// the kernel's refusal, or why it was left out (LeftOut).
	Reason string `json:"reason,omitempty"`
	// LeftOut: the interface was not chosen (a bridge, a VLAN, a bond or
	// a port of one, a tunnel), rather than refused; xdp_interfaces
	// names it to try.
	LeftOut bool `json:"left_out,omitempty"`
	// Listeners are the limiter's listeners whose traffic arrives there.
	Listeners []string `json:"listeners"`
}

// How the XDP program runs on an interface (XDPInterface.Attach).
const (
	XDPNative           = "native"
	XDPGeneric          = "generic"
	XDPSocketFilterOnly = "socket_filter_only"
)

// Prefilter is what the kernel pre-filter (classic BPF) of a userspace
// limiter does. Its drops are estimated: classic BPF cannot count.
type Prefilter struct {
	Sockets      int  `json:"sockets"`
	Instructions int  `json:"instructions"`
	Streams      int  `json:"streams"`
	Invalid      bool `json:"drops_invalid"`
	// InvalidDroppedEstimated is by reason; StreamDroppedEstimated by
	// class, the packets of limited streams.
	InvalidDroppedEstimated map[string]uint64 `json:"invalid_dropped_estimated"`
	StreamDroppedEstimated  map[string]uint64 `json:"stream_dropped_estimated"`
	// NegotiationDroppedEstimated counts unknown-version datagrams over
	// the Version Negotiation cap; Negotiation is their drop probability
	// in force.
	NegotiationDroppedEstimated uint64  `json:"negotiation_dropped_estimated"`
	Negotiation                 float64 `json:"negotiation_drop_probability"`
	// ShedDroppedEstimated counts long headers shed while the receive
	// queue overflowed; Shed is their drop probability in force.
	ShedDroppedEstimated uint64  `json:"shed_dropped_estimated"`
	Shed                 float64 `json:"shed_drop_probability"`
	Updates              uint64  `json:"updates"`
	AttachErrors         uint64  `json:"attach_errors"`
}

// Verification is the state of connection ID verification.
type Verification struct {
	On bool `json:"on"`
	// ServerIDs and Peers count what the limiter taught the filter (new
	// and refreshed); OddIDs the server's packets whose connection IDs
	// are not 4 bytes (which turn verification off).
	ServerIDs uint64 `json:"server_ids"`
	Peers     uint64 `json:"peers"`
	OddIDs    uint64 `json:"odd_ids"`
	// Credits counts the credits the server's datagrams granted to the
	// addresses they went to (see decide.Credit).
	Credits uint64 `json:"credits"`
	// Proofs counts the addresses that proved themselves, by sending back
	// a server ID bound to them; UnpacedAttempts the attempts at a proof
	// the proof pacer had no room for (decide.ProofAttemptsPerSecond).
	Proofs          uint64 `json:"proofs"`
	UnpacedAttempts uint64 `json:"unpaced_attempts"`
	// Held counts what the learned sets hold now, by set: server_ids,
	// proven_peers, answered_peers.
	Held map[string]int `json:"held"`
}

// Total is a class's total in force (the opening or the established
// class's) and, when it follows the receive queue, what its last period
// saw.
type Total struct {
	Adaptive bool `json:"adaptive"`
	// CapPPS is the cap in packets per second, 0 when lifted.
	CapPPS    uint32  `json:"cap_pps"`
	QueueFill float64 `json:"receive_queue_fill,omitempty"`
	// QueueDrops are the datagrams the socket dropped for want of room
	// in the last period (50 ms).
	QueueDrops uint64 `json:"receive_queue_drops,omitempty"`
	// PassedPPS is the rate of the class's packets that passed.
	PassedPPS float64 `json:"passed_pps,omitempty"`
}

// Counters are one family's datagram counts.
type Counters struct {
	// Classes are the counts of the limiter classes: "opening",
	// "established" and "unverified", or "all" for opening without
	// classify.
	Classes map[string]ClassCounters `json:"classes"`
	// Negotiation counts datagrams with a version quic-go lacks: passed,
	// dropped over the cap, or dry_run.
	Negotiation map[string]uint64 `json:"negotiation"`
	// Invalid counts invalid datagrams by reason (dropped), InvalidDryRun
	// those a dry run delivered.
	Invalid       map[string]uint64 `json:"invalid"`
	InvalidDryRun map[string]uint64 `json:"invalid_dry_run"`
	Allowlisted   uint64            `json:"allowlisted"`
	// Verified counts datagrams verified against what the server sent,
	// by how (see the metric caddy_rakelimit_verified_packets_total).
	Verified map[string]uint64 `json:"verified"`
}

// ClassCounters are one limiter class's counts; the maps are keyed by
// level.
type ClassCounters struct {
	Passed  uint64            `json:"passed"`
	Limited map[string]uint64 `json:"limited"`
	Dropped map[string]uint64 `json:"dropped"`
	DryRun  map[string]uint64 `json:"dry_run"`
}

// Stream is a stream with recent drops, or a source of invalid datagrams
// (Level -1).
type Stream struct {
	// Stream names the generalisation that drops it, e.g.
	// "198.51.100.0/24 sport=* -> :443", or the source of invalid
	// datagrams, "198.51.100.7 -> :443".
	Stream string `json:"stream"`
	// Class is opening, established, unverified, all or invalid; Reason
	// says why invalid datagrams are.
	Class  string `json:"class"`
	Reason string `json:"reason,omitempty"`
	// Level, RatePPS and LimitPPS: the lattice level that drops the
	// stream, its estimated rate and the level's limit (not for invalid
	// datagrams).
	Level    int       `json:"level"`
	RatePPS  float64   `json:"rate_pps"`
	LimitPPS uint32    `json:"limit_pps"`
	Since    time.Time `json:"since"`
	LastDrop time.Time `json:"last_drop"`
	// Dropped estimates the packets dropped since Since (sampled).
	Dropped uint64 `json:"dropped"`
	DryRun  bool   `json:"dry_run"`
}

// LearnedSets names the learned sets in Verification.Held, indexed as
// package decide indexes them.
var LearnedSets = [3]string{"server_ids", "proven_peers", "answered_peers"}
