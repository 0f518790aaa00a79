package decide

import (
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Stream is a stream a filter (the kernel's or the userspace one) has
// recently dropped packets of: as the lattice node that dropped them counts
// it, or the source of invalid datagrams.
type Stream struct {
	// Class is the stream's class: quicclass.Opening, Established or
	// Unverified (or Opening for every datagram when the filter does not
	// classify), or quicclass.Invalid, and then Reason says why.
	Class  quicclass.Class
	Reason quicclass.Reason
	// Node and Level are the lattice node that dropped the packets (not
	// for invalid datagrams).
	Node  sketch.Node
	Level int
	// Key is the stream: the packet's key reduced to the node (address
	// masked to its prefix, ports the node ignores set to zero; the
	// destination port is kept), or an invalid datagram's source address
	// (without its port).
	Key sketch.Key
	// First and Last are the first and the latest sampled drop.
	First, Last time.Time
	// Drops estimates the packets dropped: sampled drops times the
	// sampling rate.
	Drops uint64
	// Estimate is the node's rate estimate at the latest sampled drop, a
	// decayed count per window (sketch.Params.PPS converts it).
	Estimate uint64
	// DryRun is true when the drops were not applied.
	DryRun bool
}
