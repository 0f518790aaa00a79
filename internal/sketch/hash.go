package sketch

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
)

// Sketch dimensions, shared with bpf/rakelimit.c.
const (
	// Depth is the number of rows (independent hash functions) per sketch.
	Depth = 2
	// WidthBits is log2 of the number of cells per row.
	WidthBits = 12
	// Width is the number of cells per row.
	Width = 1 << WidthBits
	// HashWords is the number of 32-bit words a node's key is hashed from:
	// the family, four address words and one port word.
	HashWords = 6
)

// HashKey is the secret of one limiter instance: the multipliers and offsets
// of Depth multiply-add-shift hash functions (Dietzfelbinger; Thorup, "High
// Speed Hashing for Integers and Strings"). For words x_i < 2^32 and A, B
// drawn uniformly, h(x) = (sum A_i*x_i + B) mod 2^64 >> (64-WidthBits) is
// strongly universal: two distinct keys collide in a row with probability
// 1/Width, whatever the keys, as long as the secret is unknown. An attacker
// therefore cannot compute colliding sources offline.
type HashKey struct {
	A [Depth][HashWords]uint64
	B [Depth]uint64
}

// NewHashKey draws a hash key from r, or from crypto/rand when r is nil.
func NewHashKey(r io.Reader) (HashKey, error) {
	if r == nil {
		r = rand.Reader
	}
	var buf [Depth * (HashWords + 1) * 8]byte
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

// column maps a full hash to a cell of a row.
func column(h uint64) uint64 { return h >> (64 - WidthBits) }
