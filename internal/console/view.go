// Package console is the operator's terminal view of a running rakelimit:
// it fetches the admin view (GET /rakelimit/ on Caddy's admin endpoint),
// turns two snapshots into rates, and renders one screen with a one-line
// verdict per limiter. The caddy rakelimit status and top commands are
// thin wrappers around it; nothing here needs a running Caddy.
package console

import "time"

// View is the JSON of GET /rakelimit/, as admin.go serves it.
type View struct {
	Limiters []Limiter `json:"limiters"`
}

// Limiter is one limiter of the admin view.
type Limiter struct {
	Name                string              `json:"name"`
	Mode                string              `json:"mode"`
	Listeners           []string            `json:"listeners"`
	Config              Config              `json:"config"`
	Counters            map[string]Counters `json:"counters"`
	LimitedStreams      []Stream            `json:"limited_streams"`
	LimitedStreamsTotal int                 `json:"limited_streams_total"`
	UntrackedDrops      uint64              `json:"untracked_drops"`
	OpeningTotal        OpeningTotal        `json:"opening_total"`
	Verification        Verification        `json:"verification"`
}

// Verification is the state of connection ID verification.
type Verification struct {
	On        bool   `json:"on"`
	ServerIDs uint64 `json:"server_ids"`
	Peers     uint64 `json:"peers"`
	OddIDs    uint64 `json:"odd_ids"`
}

// OpeningTotal is the cap in force on the socket's connection-opening
// packets; CapPPS 0 means lifted.
type OpeningTotal struct {
	Adaptive   bool    `json:"adaptive"`
	CapPPS     uint32  `json:"cap_pps"`
	QueueFill  float64 `json:"receive_queue_fill,omitempty"`
	QueueDrops uint64  `json:"receive_queue_drops,omitempty"`
	OpenedPPS  float64 `json:"opening_pps,omitempty"`
}

// Config is a limiter's configuration in force.
type Config struct {
	Limit                  uint32   `json:"limit"`
	Window                 string   `json:"window"`
	Classify               bool     `json:"classify"`
	LevelLimits            []uint32 `json:"level_limits"`
	EstablishedLevelLimits []uint32 `json:"established_level_limits"`
	IPv4Prefixes           []int    `json:"ipv4_prefixes"`
	IPv6Prefixes           []int    `json:"ipv6_prefixes"`
	PerDestinationPort     bool     `json:"per_destination_port"`
	BlockSourcePorts       []string `json:"block_source_ports"`
	VersionNegotiation     uint32   `json:"version_negotiation"`
	DryRun                 bool     `json:"dry_run"`
	Allow                  []string `json:"allow"`
}

// Counters are one family's datagram counts.
type Counters struct {
	Classes       map[string]ClassCounters `json:"classes"`
	Negotiation   map[string]uint64        `json:"negotiation"`
	Invalid       map[string]uint64        `json:"invalid"`
	InvalidDryRun map[string]uint64        `json:"invalid_dry_run"`
	Allowlisted   uint64                   `json:"allowlisted"`
	Verified      map[string]uint64        `json:"verified"`
}

// ClassCounters are one limiter class's counts; the maps are keyed by
// level.
type ClassCounters struct {
	Passed  uint64            `json:"passed"`
	Limited map[string]uint64 `json:"limited"`
	Dropped map[string]uint64 `json:"dropped"`
	DryRun  map[string]uint64 `json:"dry_run"`
}

// Stream is a limited stream, or a source of invalid datagrams (Level -1).
type Stream struct {
	Stream   string    `json:"stream"`
	Class    string    `json:"class"`
	Reason   string    `json:"reason,omitempty"`
	Level    int       `json:"level"`
	RatePPS  float64   `json:"rate_pps"`
	LimitPPS uint32    `json:"limit_pps"`
	Since    time.Time `json:"since"`
	LastDrop time.Time `json:"last_drop"`
	Dropped  uint64    `json:"dropped"`
	DryRun   bool      `json:"dry_run"`
}
