package sketch

// Fixed-point arithmetic shared, operation for operation, with bpf/rakelimit.c.
//
// Counters are unsigned Q24 numbers (24 fractional bits). Weights g are Q24,
// decay factors and inverse weights are Q32 fractions in [0, 1]. Every product
// is split so that no intermediate exceeds 64 bits, because BPF has no 128-bit
// multiply; the splits are part of the contract: the C program performs
// exactly these steps and gets exactly these roundings.

const (
	// FracBits is the number of fractional bits of a counter.
	FracBits = 24
	// One is 1.0 as a counter.
	One = uint64(1) << FracBits

	q32One  = uint64(1) << 32
	low24   = One - 1
	low32   = q32One - 1
	maxU64  = ^uint64(0)
	oneQ32f = float64(q32One)
	oneQ24f = float64(One)
)

// mulQ32 returns floor(a*b / 2^32) for b <= 2^32 without overflowing 64 bits.
func mulQ32(a, b uint64) uint64 {
	return (a>>32)*b + ((a&low32)*b)>>32
}

// mulQ24 returns a*b / 2^24 for a < 2^60 and b < 2^26, rounding the low part
// down, without overflowing 64 bits.
func mulQ24(a, b uint64) uint64 {
	return (a>>FracBits)*b + ((a&low24)*b)>>FracBits
}

// satAdd adds without wrapping: a counter that would overflow sticks at the
// maximum, which is over every limit.
func satAdd(a, b uint64) uint64 {
	s := a + b
	if s < a {
		return maxU64
	}
	return s
}
