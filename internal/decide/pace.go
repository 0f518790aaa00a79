package decide

import (
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// The pacers' rates: the twin of the pacers the C program keeps in the map
// pacer (internal/kernel/c/pace.h, gcra, and the slots PACER_*): the
// version negotiation cap, the tracking pacer and the proof pacer here,
// the returning part of the opening total in sketch (its GCRA,
// sketch.Pacing.Admit, is the twin of gcra).

// Pacing is a pacer's rate (sketch.Pacing): the version negotiation cap,
// the proof attempts (ProofPacing) and the tracked streams (TrackPacing).
type Pacing = sketch.Pacing

// NewPacing compiles a rate in datagrams per second, with a burst of as
// many (sketch.NewPacing).
func NewPacing(rate uint32) Pacing { return sketch.NewPacing(rate) }

// TrackPacing is the pacing of new tracked streams (the kernel's tracking
// pacer): TrackedStreamsPerSecond, with a burst of MaxTrackedStreams.
func TrackPacing() Pacing {
	iv := uint64(time.Second) / TrackedStreamsPerSecond
	return Pacing{Interval: iv, Tau: iv * (MaxTrackedStreams - 1)}
}

// ProofAttemptsPerSecond bounds the attempts at a proof (quicclass
// Header.Attempts) the filter looks up, for the whole socket: each pays a
// token of the proof pacer (ProofPacing) before its ID is looked up, and
// one without a token proves nothing, whether its ID verifies it or not.
// An attempt hits one of the at most LearnedWays IDs bound to its source
// with odds of LearnedWays in 2^32 at best (a spoofer chooses the address
// and has the server answer it as often as it likes, but the IDs are 4
// random bytes it never sees), so that the proofs a spoofer can forge, at
// any rate of sending, are at most ProofAttemptsPerSecond * LearnedWays /
// 2^32 a second: one in about three days. A client proves itself with the
// first Handshake packet it sends back (one attempt); past 2,000 such a
// second, some new clients go unproven until their next connection, and
// are verified by their IDs and their credit meanwhile.
const ProofAttemptsPerSecond = 2_000

// ProofPacing is the proof pacer's pacing: ProofAttemptsPerSecond, with a
// burst of as many.
func ProofPacing() Pacing { return NewPacing(ProofAttemptsPerSecond) }
