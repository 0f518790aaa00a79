package sketch

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	mathrand "math/rand/v2"
)

// Sketch dimensions, shared with the C program (internal/kernel/c).
const (
	// Depth is the number of rows (independent hash functions) per sketch.
	Depth = 2 // C: DEPTH
	// CellsPerLine is the number of cells in a 64-byte line.
	CellsPerLine = 3 // C: CELLS_PER_LINE
	// Rows are made of lines; their length depends on the class. A row
	// of the opening class (connection-opening packets, or every
	// datagram) has OpeningLines lines (OpeningWidth = 4140 cells), where
	// a flood of many sources must not crowd out a legitimate one. A row
	// of the established class (established connections) has
	// EstablishedLines (576 cells): its limits are hundreds of times a
	// client's rate, so sharing a cell with a few other sources changes
	// nothing. A row of the unverified class (unverified short headers)
	// has UnverifiedLines (192 cells): what it counts is
	// junk, or a legitimate client for the moment before it is verified,
	// and its small total, shared fairly, is what holds the junk. The
	// socket's total node counts a single stream and has one line per
	// row. With the default lattice (6 nodes) the sketches of the three
	// classes, with the returning part's line, take ((5 x 1380 + 5 x 192 +
	// 5 x 64 + 3) x 2 + 1) x 64 bytes = 1,047,488 bytes, under 1 MiB.
	OpeningLines     = 1380
	EstablishedLines = 192
	UnverifiedLines  = 64
	OpeningWidth     = OpeningLines * CellsPerLine
	// HashWords is the number of 32-bit words a node's key is hashed from:
	// the family, four address words and one port word.
	HashWords = 6 // C: HASH_WORDS
)

// HashKey is the secret of one limiter instance: the multipliers and offsets
// of Depth multiply-add-shift hash functions (Dietzfelbinger; Thorup, "High
// Speed Hashing for Integers and Strings"). For words x_i < 2^32 and A, B
// drawn uniformly, the top l bits of h(x) = (sum A_i*x_i + B) mod 2^64 are
// strongly universal for l up to about 32 (the bound covers 64 bits less
// the words' 32): two distinct keys collide in a row with probability one
// over the row's width (rows are far narrower than 2^32), whatever the
// keys, as long as the secret is unknown. An attacker therefore cannot
// compute colliding sources offline. The learned sets use more bits (a set
// and a 38-bit tag): beyond the first 32 the collision bound is about
// 2^-32, not less (see package decide).
//
// R and RB are a further such function, over the source address and port
// and a time period, that ranks the sources at the fair total (see
// Limiter.Decide). LearnID and LearnAddr are two more, which key the
// learned sets of the filter (package decide): a server ID with the address
// it was sent to (the ID's word, the address's four words, the offset), and
// an address (its four words, the offset).
type HashKey struct {
	A         [Depth][HashWords]uint64
	B         [Depth]uint64
	R         [HashWords]uint64
	RB        uint64
	LearnID   [LearnIDWords + 1]uint64
	LearnAddr [LearnAddrWords + 1]uint64
}

// The words the learned sets' hashes take: a server ID's and an address's
// four (LearnIDWords), an address's four (LearnAddrWords); each hash has an
// offset besides.
const (
	LearnIDWords   = 5 // C: LEARN_ID_WORDS
	LearnAddrWords = 4 // C: LEARN_ADDR_WORDS
)

// SeededHashKey is the hash key a deterministic generator seeded with seed
// draws: the same seed gives the same key. It is for tests and reproducible
// experiments; a listener's key must be secret and comes from NewHashKey.
func SeededHashKey(seed uint64) HashKey {
	rng := mathrand.New(mathrand.NewPCG(seed, ^seed))
	var k HashKey
	for r := range Depth {
		for i := range HashWords {
			k.A[r][i] = rng.Uint64()
		}
		k.B[r] = rng.Uint64()
	}
	for i := range HashWords {
		k.R[i] = rng.Uint64()
	}
	k.RB = rng.Uint64()
	for i := range k.LearnID {
		k.LearnID[i] = rng.Uint64()
	}
	for i := range k.LearnAddr {
		k.LearnAddr[i] = rng.Uint64()
	}
	return k
}

// NewHashKey draws a hash key from r, or from crypto/rand when r is nil.
func NewHashKey(r io.Reader) (HashKey, error) {
	if r == nil {
		r = rand.Reader
	}
	var buf [((Depth+1)*(HashWords+1) + LearnIDWords + 1 + LearnAddrWords + 1) * 8]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return HashKey{}, fmt.Errorf("drawing hash key: %w", err)
	}
	var k HashKey
	off := 0
	next := func() uint64 {
		v := binary.LittleEndian.Uint64(buf[off:])
		off += 8
		return v
	}
	for r := range Depth {
		for i := range HashWords {
			k.A[r][i] = next()
		}
		k.B[r] = next()
	}
	for i := range HashWords {
		k.R[i] = next()
	}
	k.RB = next()
	for i := range k.LearnID {
		k.LearnID[i] = next()
	}
	for i := range k.LearnAddr {
		k.LearnAddr[i] = next()
	}
	return k, nil
}

// prefixMask returns the mask of address word i (0-3) for a prefix of l bits.
func prefixMask(l uint8, i int) uint32 {
	lo := i * 32
	switch {
	case int(l) >= lo+32:
		return ^uint32(0)
	case int(l) <= lo:
		return 0
	}
	return ^uint32(0) << (32 - (int(l) - lo))
}

// addrHashes computes, for prefix slot s and every row, the address part of
// the hash: A[r][0]*FamilyWord + sum A[r][1+i]*(word_i & Mask_i). The family
// word is 0 for a /0 prefix, so that IPv4 and IPv6 share the all-sources
// nodes. (A key of unknown family has no address and reaches only those.)
// IPv4 hashes one word: its others are zero.
func (hk *HashKey) addrHashes(p *Params, k *Key, s int, out *[Depth]uint64) {
	fi, words := 0, 1
	if k.Family == IPv6 {
		fi, words = 1, 4
	}
	for r := range Depth {
		h := hk.A[r][0] * p.FamilyWord[fi][s]
		for i := range words {
			h += hk.A[r][1+i] * uint64(k.Words[i]&p.Mask[fi][s][i])
		}
		out[r] = h
	}
}

// portWord is the key's port word at node n: the ports the node specifies,
// zero for wildcards. Without the destination port dimension the
// destination port is left out (it is the same for every packet).
func portWord(n Node, k *Key, perDstPort bool) uint64 {
	var w uint64
	if !n.SrcPortAny() {
		w = uint64(k.SrcPort) << 16
	}
	if perDstPort && !n.DstPortAny() {
		w |= uint64(k.DstPort)
	}
	return w
}

// nodeHash is a node's full hash in row r, from the address part ah
// (addrHashes) and the node's port word pw (portWord).
func (hk *HashKey) nodeHash(r int, ah, pw uint64) uint64 {
	return ah + hk.A[r][HashWords-1]*pw + hk.B[r]
}

// mixMul is an odd 64-bit constant (2^64 divided by the golden ratio).
const mixMul = 0x9E3779B97F4A7C15 // C: MIX_MUL

// mix breaks the linear structure of a multiply-add hash before its top bits
// are used. Keys in arithmetic progression, such as 256 consecutive /24s or
// ports, make a linear hash an arithmetic progression too; for one draw in
// seven or so of the secret, its step is close to a fraction with a small
// denominator and the keys crowd into a few columns (up to 244 of 256
// colliding in a row of 2046, against 16 for random columns). Folding the
// high half into the low half and multiplying is a fixed bijection, so two
// keys still collide only when their hashes did or by chance, and
// progressions spread like random keys (TestHashSpreadsProgressions).
func mix(h uint64) uint64 {
	h ^= h >> 32
	return h * mixMul
}

// column maps a full hash to a cell of a row of lines lines: the top 32
// bits of the mixed hash, scaled to [0, lines*CellsPerLine), give the line
// (the integer part over lines) and the cell in the line (the fraction, times
// CellsPerLine). This is floor(x*lines*CellsPerLine/2^32) split in two
// without a division.
func column(h uint64, lines uint32) (line, cell uint64) {
	t := (mix(h) >> 32) * uint64(lines)
	return t >> 32, (t & low32) * CellsPerLine >> 32
}

// rank is the rank of k's source (address and port) in period: uniform in
// [0, 2^32) and independent of other sources' under a secret key.
func (hk *HashKey) rank(k *Key, period uint64) uint32 {
	h := hk.R[0]*period + hk.R[HashWords-1]*uint64(k.SrcPort) + hk.RB
	for i, w := range k.Words {
		h += hk.R[1+i] * uint64(w)
	}
	return uint32(mix(h) >> 32)
}
