package testutil

import (
	"encoding/binary"
	"time"
)

// StampSize is the size of a send-time stamp: the last bytes of a datagram
// a Flood with Stamp set sends.
const StampSize = 8

// A stamp is a big-endian uint64: stampMark in its top 16 bits, which a
// reader checks before it trusts the rest, and the nanoseconds since the
// flood's epoch in the low 48 bits (78 hours). The mark makes random bytes
// pass for a stamp once in 65,536 datagrams, and maxStamp narrows that to
// once in millions: a test's floods last seconds.
const (
	stampMark  = 0x5a7e
	stampShift = 48
	stampMask  = 1<<stampShift - 1
	// maxStamp is the latest send time a reader accepts.
	maxStamp = time.Hour
)

// PutStamp writes since, a send time relative to a flood's epoch, into the
// last StampSize bytes of b; a shorter b is left as it is.
func PutStamp(b []byte, since time.Duration) {
	if len(b) < StampSize || since < 0 {
		return
	}
	v := uint64(stampMark)<<stampShift | uint64(since)&stampMask
	binary.BigEndian.PutUint64(b[len(b)-StampSize:], v)
}

// ReadStamp returns the send time PutStamp wrote into b, and false when b
// carries no stamp.
func ReadStamp(b []byte) (time.Duration, bool) {
	if len(b) < StampSize {
		return 0, false
	}
	v := binary.BigEndian.Uint64(b[len(b)-StampSize:])
	if v>>stampShift != stampMark {
		return 0, false
	}
	since := time.Duration(v & stampMask)
	if since > maxStamp {
		return 0, false
	}
	return since, true
}
