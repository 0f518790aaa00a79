// Package a holds marked constants for cgen's tests.
package a

import "time"

// Kind is a small typed enumeration, as quicclass.Class is.
type Kind uint8

// Kinds.
const (
	First  Kind = iota // C: KIND_FIRST
	Second             // C: KIND_SECOND
	third              // not shared
	// Fourth is marked in its doc comment.
	// C: KIND_FOURTH
	Fourth
)

// Shift and Size are shared through an expression of another constant.
const (
	Shift = 10                   // C: SHIFT
	Size  = 1 << (Shift - 2)     // C: SIZE
	mask  = ^uint32(0)           // C: MASK
	big   = uint64(1) << 32      // C: BIG
	mul   = 0x9E3779B1           // C: MUL
	Wait  = 3 * time.Millisecond // C: WAIT
	neg   = -2                   // C: NEG
)

// Alone is marked in the doc comment of an ungrouped declaration.
//
// C: ALONE
const Alone = 0x7f
