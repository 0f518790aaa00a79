package sketch

// Fixed-point arithmetic shared, operation for operation, with the C
// program (internal/kernel/c/fixed.h).
//
// Counters are unsigned 32-bit numbers with FracBits fractional bits (a
// count of 1 packet is One). Slot weights G are Q24; decay factors and
// inverse weights are Q32 fractions in [0, 1]. The products below fit in 64
// bits for the operands the limiter gives them (see each function), because
// BPF has no 128-bit multiply; the roundings are part of the contract: the C
// program performs exactly these steps.

const (
	// FracBits is the number of fractional bits of a counter: a packet's
	// weight is resolved to 1/256, and a count reaches 2^24 packets.
	FracBits = 8 // C: FRAC_BITS
	// One is one packet as a counter.
	One = uint32(1) << FracBits

	// weightBits is the number of fractional bits of the slot weights G.
	weightBits = 24 // C: WEIGHT_BITS

	q32One  = uint64(1) << 32 // C: Q32_ONE
	low32   = q32One - 1      // C: LOW32
	maxU64  = ^uint64(0)
	maxU32  = ^uint32(0) // C: U32_MAX
	oneQ32f = float64(q32One)
	oneQ24f = float64(uint64(1) << weightBits)
	oneF    = float64(One)
)

// mulQ32 returns floor(a*b / 2^32) for b <= 2^32 without overflowing 64 bits.
func mulQ32(a, b uint64) uint64 {
	return (a>>32)*b + ((a&low32)*b)>>32
}

// scale returns a count c (below 2^32) scaled by a Q24 slot weight g (below
// 2^26), floored: the threshold of a node as of the packet's slot.
func scale(c uint32, g uint64) uint64 {
	return uint64(c) * g >> weightBits
}

// satAdd adds without wrapping: a counter that would overflow sticks at the
// maximum, which is over every limit.
func satAdd(a, b uint32) uint32 {
	s := a + b
	if s < a {
		return maxU32
	}
	return s
}

// satAdd64 is satAdd for 64-bit numbers.
func satAdd64(a, b uint64) uint64 {
	s := a + b
	if s < a {
		return maxU64
	}
	return s
}
