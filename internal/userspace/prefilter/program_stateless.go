package prefilter

import (
	"math"

	"golang.org/x/net/bpf"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// QUIC wire constants the program checks (see package quicclass).
const (
	headerForm         = 0x80
	fixedBit           = 0x40
	longTypeMask       = 0x30
	longTypeShift      = 4
	longFixedLen       = 7 // first byte, version, the two ID lengths
	versionOff         = 1
	dcilOff            = 5
	scilOffAfterDCID   = 6
	typeInitial        = 0
	typeHandshake      = 2
	typeRetry          = 3
	v2TypeRotation     = 3
	numLongPacketTypes = 4
)

// ports sends a datagram from a blocked source port to invalidL. A set of
// more than MaxPortRanges ranges is left to the userspace limiter.
func (a *asm) ports(s *quicclass.Ports, invalidL label) {
	rs := s.Ranges()
	if len(rs) == 0 || len(rs) > MaxPortRanges {
		return
	}
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mSport})
	for _, r := range rs {
		miss := a.newLabel()
		if r[0] == r[1] {
			a.jump(bpf.JumpEqual, uint32(r[0]), next, miss)
		} else {
			a.jump(bpf.JumpGreaterOrEqual, uint32(r[0]), next, miss)
			a.jump(bpf.JumpGreaterThan, uint32(r[1]), miss, next)
		}
		a.ja(invalidL) // invalidL may be beyond a conditional jump's reach
		a.mark(miss)
	}
}

// classify is quicclass.Inspect without verification, for what it calls
// invalid: an invalid datagram goes to invalidL, one with an unknown
// version (the negotiation class, paced in userspace) is dropped with
// probability negotiation and otherwise kept, and the others go to rulesL
// with their Form stored: ShortForm, OpeningForm or AnsweringForm.
func (a *asm) classify(invalidL, rulesL label, negotiation float64) {
	long, known, notInitial, sameType := a.newLabel(), a.newLabel(), a.newLabel(), a.newLabel()
	// Empty.
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mLen})
	a.jump(bpf.JumpEqual, 0, invalidL, next)
	a.emit(bpf.LoadAbsolute{Off: udpHeaderLen, Size: 1}, bpf.StoreScratch{Src: bpf.RegA, N: mB0})
	a.jump(bpf.JumpBitsSet, headerForm, long, next)
	// A short header: the fixed bit, and room for the sample.
	a.jump(bpf.JumpBitsSet, fixedBit, next, invalidL)
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mLen})
	a.jump(bpf.JumpLessThan, quicclass.MinShortHeaderPacket, invalidL, next)
	a.emit(bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(ShortForm)}, bpf.StoreScratch{Src: bpf.RegA, N: mForm})
	a.ja(rulesL)

	a.mark(long)
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mLen})
	a.jump(bpf.JumpLessThan, longFixedLen, invalidL, next)
	a.emit(bpf.LoadAbsolute{Off: udpHeaderLen + versionOff, Size: 4}, bpf.StoreScratch{Src: bpf.RegA, N: mVer})
	a.jump(bpf.JumpEqual, 0, invalidL, next) // version negotiation
	a.jump(bpf.JumpEqual, quicclass.Version1, known, next)
	a.jump(bpf.JumpEqual, quicclass.Version2, known, next)
	// An unknown version: too small to answer, or the negotiation class.
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mLen})
	a.jump(bpf.JumpLessThan, quicclass.MinInitialDatagram, invalidL, next)
	a.dropWith(negotiation)
	a.emit(bpf.RetConstant{Val: accept})

	a.mark(known)
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mB0})
	a.jump(bpf.JumpBitsSet, fixedBit, next, invalidL)
	// The destination ID's length, then the datagram must hold it and the
	// source ID's length byte.
	a.emit(bpf.LoadAbsolute{Off: udpHeaderLen + dcilOff, Size: 1})
	a.jump(bpf.JumpGreaterThan, quicclass.MaxConnectionIDLen, invalidL, next)
	a.emit(
		bpf.StoreScratch{Src: bpf.RegA, N: mDCIL},
		bpf.ALUOpConstant{Op: bpf.ALUOpAdd, Val: longFixedLen},
		bpf.TAX{},
		bpf.LoadScratch{Dst: bpf.RegA, N: mLen},
	)
	a.jumpX(bpf.JumpLessThan, invalidL, next)
	// The source ID's length, at 6+DCIL: within the datagram, as checked.
	a.emit(
		bpf.LoadScratch{Dst: bpf.RegX, N: mDCIL},
		bpf.LoadIndirect{Off: udpHeaderLen + scilOffAfterDCID, Size: 1},
	)
	a.jump(bpf.JumpGreaterThan, quicclass.MaxConnectionIDLen, invalidL, next)
	a.emit(
		bpf.ALUOpX{Op: bpf.ALUOpAdd},
		bpf.ALUOpConstant{Op: bpf.ALUOpAdd, Val: longFixedLen},
		bpf.TAX{},
		bpf.LoadScratch{Dst: bpf.RegA, N: mLen},
	)
	a.jumpX(bpf.JumpLessThan, invalidL, next)
	// The packet type, numbered as in v1: v2 rotates the field.
	a.emit(
		bpf.LoadScratch{Dst: bpf.RegA, N: mB0},
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: longTypeMask},
		bpf.ALUOpConstant{Op: bpf.ALUOpShiftRight, Val: longTypeShift},
		bpf.StoreScratch{Src: bpf.RegA, N: mType},
		bpf.LoadScratch{Dst: bpf.RegA, N: mVer},
	)
	a.jump(bpf.JumpEqual, quicclass.Version2, next, sameType)
	a.emit(
		bpf.LoadScratch{Dst: bpf.RegA, N: mType},
		bpf.ALUOpConstant{Op: bpf.ALUOpAdd, Val: v2TypeRotation},
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: numLongPacketTypes - 1},
		bpf.StoreScratch{Src: bpf.RegA, N: mType},
	)
	a.mark(sameType)
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mType})
	a.jump(bpf.JumpEqual, typeRetry, invalidL, next)
	a.jump(bpf.JumpEqual, typeInitial, next, notInitial)
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mLen})
	a.jump(bpf.JumpLessThan, quicclass.MinInitialDatagram, invalidL, next)
	a.mark(notInitial)
	// An Initial or 0-RTT packet whose destination ID cannot be a server
	// ID opens a connection (OpeningForm); a Handshake packet, or one
	// addressed to an ID of the server's length, answers the server
	// (AnsweringForm).
	answering := a.newLabel()
	a.emit(
		bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(AnsweringForm)},
		bpf.StoreScratch{Src: bpf.RegA, N: mForm},
		bpf.LoadScratch{Dst: bpf.RegA, N: mType},
	)
	a.jump(bpf.JumpGreaterOrEqual, typeHandshake, answering, next)
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mDCIL})
	a.jump(bpf.JumpEqual, quicclass.ServerIDLen, answering, next)
	a.emit(bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(OpeningForm)}, bpf.StoreScratch{Src: bpf.RegA, N: mForm})
	a.mark(answering)
	a.ja(rulesL)
}

// shedLen is the length of shed's code.
const shedLen = 7

// shed drops a long header that matched no rule with probability p, but
// not one addressed to a connection ID of the length of the server's
// (quicclass.ServerIDLen): it belongs to a handshake under way, since a
// client's first Initial carries an ID of its own choosing, of 8 bytes at
// least. The length is read from the packet: the scratch slot holding it is
// not stored on every path here, which the kernel's checker refuses.
func (a *asm) shed(p float64) {
	if dropThreshold(p) == 0 {
		return
	}
	keep := a.newLabel()
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mForm})
	a.jump(bpf.JumpBitsSet, uint32(LongForm), next, keep)
	a.emit(bpf.LoadAbsolute{Off: udpHeaderLen + dcilOff, Size: 1})
	a.jump(bpf.JumpEqual, quicclass.ServerIDLen, keep, next)
	a.dropWith(p)
	a.mark(keep)
}

// dropWith drops the datagram with probability p, and goes on with the
// rest; p = 0 emits nothing.
func (a *asm) dropWith(p float64) {
	if t := dropThreshold(p); t > 0 {
		a.emit(
			bpf.LoadExtension{Num: bpf.ExtRand},
			bpf.JumpIf{Cond: bpf.JumpLessThan, Val: t, SkipFalse: 1},
			bpf.RetConstant{Val: 0},
		)
	}
}

// invalid drops an invalid datagram, but one in 2^shift, which passes.
func (a *asm) invalid(shift uint8) {
	a.emit(
		bpf.LoadExtension{Num: bpf.ExtRand},
		bpf.JumpIf{Cond: bpf.JumpLessThan, Val: sampleThreshold(shift), SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: accept},
	)
}

// sampleThreshold is the random number under which one datagram in
// 2^shift is sampled; shift 0 samples none.
func sampleThreshold(shift uint8) uint32 {
	if shift == 0 || shift >= 32 {
		return 0
	}
	return uint32(uint64(1) << (32 - shift) & math.MaxUint32)
}

// dropThreshold converts a probability to the random number under which
// a datagram is dropped.
func dropThreshold(p float64) uint32 {
	switch {
	case p <= 0:
		return 0
	case p >= 1:
		return math.MaxUint32
	}
	return uint32(p * (1 << 32))
}
