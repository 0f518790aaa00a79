package decide

import (
	"fmt"
	"net/netip"
)

// The kernel filter's dimensions, which the userspace limiter keeps too, so
// that a configuration valid in one mode is valid in the other. The BPF
// program takes those marked "C: NAME" from internal/kernel/c/contract.h,
// generated from them; package kernel checks that the program agrees: at
// compile time where the generated types carry a dimension, and at load
// time for the sizes of its maps.
const (
	// MaxAllow is the most allowlist prefixes of one family.
	MaxAllow = 1024 // C: MAX_ALLOW
	// MaxTrackedStreams is how many limited streams are remembered at
	// once; past it the least recently dropped one is forgotten.
	MaxTrackedStreams = 1024 // C: MAX_TRACKED_STREAMS
	// DefaultTrackShift samples one drop in 2^4 for stream tracking.
	DefaultTrackShift = 4
	// TrackedStreamsPerSecond paces the streams the filter starts to track
	// (an entry and an event each), after a burst of MaxTrackedStreams: a
	// flood with a new source on every packet makes a new stream of nearly
	// every sampled drop, and reading their events would cost the server
	// more than the flood. Sampled drops of streams refused by the pacer
	// are counted (Untracked), not tracked.
	TrackedStreamsPerSecond = 200
	// InvalidNode is the node of a tracked stream of invalid datagrams:
	// keyed by source address, not by a lattice node.
	InvalidNode = 0xff // C: INVALID_NODE
)

// CheckAllowCapacity refuses more distinct prefixes of a family than the
// kernel's allowlist holds.
func CheckAllowCapacity(prefixes []netip.Prefix) error {
	var seen [2]map[netip.Prefix]bool
	for _, p := range prefixes {
		p = p.Masked()
		fi := 0
		if p.Addr().Is6() {
			fi = 1
		}
		if seen[fi] == nil {
			seen[fi] = map[netip.Prefix]bool{}
		}
		seen[fi][p] = true
	}
	for fi, fam := range []string{"IPv4", "IPv6"} {
		if n := len(seen[fi]); n > MaxAllow {
			return fmt.Errorf("%d %s prefixes, more than the filter holds (at most %d per family); "+
				"merge them into shorter prefixes", n, fam, MaxAllow)
		}
	}
	return nil
}
