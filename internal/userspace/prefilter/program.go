package prefilter

import (
	"fmt"
	"math"
	"net/netip"
	"slices"

	"golang.org/x/net/bpf"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Limits and constants of the program.
const (
	// MaxInstructions is the kernel's limit on a classic BPF program
	// (BPF_MAXINSNS).
	MaxInstructions = 4096
	// DefaultSampleShift lets one invalid datagram in 2^10 through to the
	// userspace limiter, which counts it by reason: the kernel's drops of
	// that reason are estimated from it. A flood of invalid junk at 300,000
	// datagrams a second still leaves about 300 samples a second. One in
	// 2^6 cost Caddy 1.5x its idle CPU under the end-to-end benchmark's
	// invalid flood, one in 2^10 1.1x: the sample's wakeups were the cost.
	DefaultSampleShift = 10
	// MaxPortRanges bounds the blocked source port ranges compiled; a set
	// with more leaves the ports to the userspace limiter.
	MaxPortRanges = 64
	// MaxAllowInstructions bounds the allowlist's share of the program.
	MaxAllowInstructions = 1024
	// accept keeps the whole datagram: the filter returns the number of
	// bytes to keep, and 0 drops.
	accept = math.MaxUint32

	// skfNetOff is SKF_NET_OFF: absolute loads from it on are relative to
	// the network header; a UDP socket's filter sees the data at the UDP
	// header.
	skfNetOff = 0xfff00000 // -0x100000
	// udpHeaderLen is where the QUIC packet starts in the data the filter
	// sees.
	udpHeaderLen = 8
	// Offsets in the network header: the version nibble, IPv4's source
	// address, IPv6's.
	ipVersionOff = 0
	ipv4SrcOff   = 12
	ipv6SrcOff   = 8
	// Offsets in the UDP header.
	udpSrcPortOff = 0
	udpDstPortOff = 2
)

// Scratch memory slots (classic BPF has 16).
const (
	mLen   = iota // the UDP payload's length
	mSport        // source port
	mDport        // destination port
	mIPVer        // the network header's version: 4 or 6
	mSrc0         // mSrc0..mSrc0+3: the source address's words (IPv4: one)
	mSrc1
	mSrc2
	mSrc3
	mForm // the header's Form (0 when the filter does not classify)
	mB0   // the first byte of the QUIC packet
	mDCIL // a long header's destination connection ID length
	mVer  // a long header's version
	mType // a long header's packet type, numbered as in v1
	numScratch
)

// Classic BPF has 16 scratch slots: this fails to compile with more.
var _ [16 - numScratch]struct{}

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
	typeRetry          = 3
	v2TypeRotation     = 3
	numLongPacketTypes = 4
)

// Form is what a stream rule matches of a datagram's QUIC header.
type Form uint8

// Forms.
const (
	// AnyForm matches every datagram (the limiter does not classify).
	AnyForm Form = iota
	// ShortForm matches short headers: the established and unverified
	// classes.
	ShortForm
	// LongForm matches long headers of a known version: the opening class.
	LongForm
)

// Rule is a stream the kernel drops packets of with probability Drop: a
// source prefix, optionally the source and destination ports, and the
// header form of the stream's class.
type Rule struct {
	Family sketch.Family
	// Words is the source address (IPv4 in Words[0]), masked to Bits.
	Words [4]uint32
	Bits  int
	// SrcPort and DstPort are matched when MatchSrcPort, MatchDstPort.
	SrcPort, DstPort           uint16
	MatchSrcPort, MatchDstPort bool
	Form                       Form
	// Drop is the probability of a drop, in [0, 1].
	Drop float64
	// arrival and rate are the stream's arrival rate in packets per
	// second and as a count per window, and class its class, for the
	// estimates and the order of the rules.
	arrival, rate float64
	class         quicclass.Class
}

// Spec is what a program does.
type Spec struct {
	// DryRun drops nothing: the program accepts every datagram.
	DryRun bool
	// Classify drops, statelessly, the datagrams quicclass calls invalid
	// (see Stateless), all but one in 2^SampleShift.
	Classify bool
	// BlockedPorts are source ports whose datagrams are invalid (nil:
	// none).
	BlockedPorts *quicclass.Ports
	// Allow are source prefixes the program never drops.
	Allow []netip.Prefix
	// Rules are the streams to drop packets of, largest first: as many as
	// fit in MaxInstructions are compiled.
	Rules []Rule
	// SampleShift: one invalid datagram in 2^SampleShift passes, for the
	// userspace limiter to count; 0 samples none.
	SampleShift uint8
	// Negotiation is the probability of dropping a datagram of the
	// negotiation class (an unknown version, 1200 bytes or more), in [0,
	// 1], when classifying: the userspace limiter paces what passes to the
	// configured rate of Version Negotiation replies.
	Negotiation float64
	// Shed is the probability of dropping a long header of a known
	// version (the opening class), in [0, 1], when classifying: a
	// Shedder (package backlog) raises it while the receive queue
	// overflows, so that short headers keep their room in it. It applies
	// to the packets of the opening class's rules, on top of each rule's
	// probability, and, when there is no such rule (a flood no stream
	// stands out of, a spoofed one), to every long header but one
	// addressed to an ID of the server's length (a handshake under way).
	// Networks and sources no rule names so keep what they have while
	// rules name the flood's.
	Shed float64
}

// Stateless lists the invalid reasons the program drops: every rule of
// quicclass that needs neither the server's state nor a varint's parse.
// UnknownConnectionID (learned IDs) and Length (verification's varints) stay
// with the userspace limiter.
var Stateless = []quicclass.Reason{quicclass.Empty, quicclass.SourcePort, quicclass.FixedBit, quicclass.Truncated,
	quicclass.ConnectionIDLength, quicclass.SmallInitial, quicclass.SmallUnknownVersion, quicclass.ServerOnly}

// Program is a compiled pre-filter.
type Program struct {
	// Instructions are the program, for the kernel (Raw) or a test's VM.
	Instructions []bpf.Instruction
	Raw          []bpf.RawInstruction
	// Rules is how many of Spec.Rules were compiled (the first ones).
	Rules int
	// Stateless is true when the program drops invalid datagrams.
	Stateless bool
	// SampleShift is Spec.SampleShift when Stateless.
	SampleShift uint8
	// Negotiation is the drop probability of the negotiation class in
	// force (Spec.Negotiation when Stateless, else 0).
	Negotiation float64
	// Shed is the drop probability of long headers in force
	// (Spec.Shed when Stateless, else 0).
	Shed float64
}

// Len is the program's length in instructions.
func (p *Program) Len() int { return len(p.Raw) }

// Build compiles s. It fails only when the allowlist is too large for the
// program; the rules that do not fit are left out.
func Build(s Spec) (*Program, error) {
	if s.DryRun {
		return finish(&asm{ins: []bpf.Instruction{bpf.RetConstant{Val: accept}}}, 0, false, 0)
	}
	a := &asm{}
	acceptL, invalidL, rulesL := a.newLabel(), a.newLabel(), a.newLabel()
	a.loadKey()
	if n, err := a.allow(s.Allow, acceptL); err != nil {
		return nil, err
	} else if n > MaxAllowInstructions {
		return nil, fmt.Errorf("compiling the pre-filter: the allowlist's %d prefixes take %d instructions, over %d",
			len(s.Allow), n, MaxAllowInstructions)
	}
	// The kernel's checker follows the scratch slots a path stores
	// without regard to returns: the form is stored on every path.
	a.emit(bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(AnyForm)}, bpf.StoreScratch{Src: bpf.RegA, N: mForm})
	if s.Classify {
		a.ports(s.BlockedPorts, invalidL)
		a.classify(invalidL, rulesL, s.Negotiation)
		a.mark(invalidL)
		a.invalid(s.SampleShift)
	}
	a.mark(rulesL)
	// The rules that fit: ruleLen counts a check of the form per rule,
	// which rules makes once per group, in 3 instructions (groupGuards
	// for all the forms at most).
	n, used := 0, len(a.ins)+groupGuards
	for _, r := range s.Rules {
		if used+ruleLen(&r)+2 > MaxInstructions {
			break
		}
		used += ruleLen(&r)
		n++
	}
	rules := shedRules(s.Rules[:n], s.Shed)
	a.rules(rules)
	if s.Classify && !slices.ContainsFunc(rules, func(r Rule) bool { return r.Form == LongForm }) {
		a.shed(s.Shed)
	}
	a.mark(acceptL)
	a.emit(bpf.RetConstant{Val: accept})
	p, err := finish(a, n, s.Classify, s.SampleShift)
	if err == nil && s.Classify {
		p.Negotiation = min(max(s.Negotiation, 0), 1)
		p.Shed = min(max(s.Shed, 0), 1)
	}
	return p, err
}

func finish(a *asm, rules int, stateless bool, shift uint8) (*Program, error) {
	ins, err := a.resolve()
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(ins)
	if err != nil {
		return nil, fmt.Errorf("assembling the pre-filter: %w", err)
	}
	p := &Program{Instructions: ins, Raw: raw, Rules: rules, Stateless: stateless}
	if stateless {
		p.SampleShift = shift
	}
	return p, nil
}

// loadKey stores the payload length, the ports and the source address;
// a datagram without an IPv4 or IPv6 header is kept.
func (a *asm) loadKey() {
	v4, v6, notV4, done := a.newLabel(), a.newLabel(), a.newLabel(), a.newLabel()
	a.emit(
		bpf.LoadExtension{Num: bpf.ExtLen},
		bpf.ALUOpConstant{Op: bpf.ALUOpSub, Val: udpHeaderLen},
		bpf.StoreScratch{Src: bpf.RegA, N: mLen},
		bpf.LoadAbsolute{Off: udpSrcPortOff, Size: 2},
		bpf.StoreScratch{Src: bpf.RegA, N: mSport},
		bpf.LoadAbsolute{Off: udpDstPortOff, Size: 2},
		bpf.StoreScratch{Src: bpf.RegA, N: mDport},
		bpf.LoadAbsolute{Off: skfNetOff + ipVersionOff, Size: 1},
		bpf.ALUOpConstant{Op: bpf.ALUOpShiftRight, Val: 4},
		bpf.StoreScratch{Src: bpf.RegA, N: mIPVer},
	)
	a.jump(bpf.JumpEqual, 4, v4, notV4)
	a.mark(v4)
	// The kernel's checker wants every scratch slot a later load reads
	// stored on every path to it: an IPv4 source zeroes the IPv6 words.
	a.emit(
		bpf.LoadAbsolute{Off: skfNetOff + ipv4SrcOff, Size: 4},
		bpf.StoreScratch{Src: bpf.RegA, N: mSrc0},
		bpf.LoadConstant{Dst: bpf.RegA, Val: 0},
		bpf.StoreScratch{Src: bpf.RegA, N: mSrc1},
		bpf.StoreScratch{Src: bpf.RegA, N: mSrc2},
		bpf.StoreScratch{Src: bpf.RegA, N: mSrc3},
	)
	a.ja(done)
	a.mark(notV4)
	a.jump(bpf.JumpEqual, 6, v6, next)
	a.emit(bpf.RetConstant{Val: accept}) // acceptL is beyond a conditional jump's reach
	a.mark(v6)
	for i := range 4 {
		a.emit(bpf.LoadAbsolute{Off: skfNetOff + ipv6SrcOff + 4*uint32(i), Size: 4},
			bpf.StoreScratch{Src: bpf.RegA, N: mSrc0 + i})
	}
	a.mark(done)
}

// familyVersion is the IP version nibble of a family.
func familyVersion(f sketch.Family) uint32 {
	if f == sketch.IPv6 {
		return 6
	}
	return 4
}

// prefixMask returns word i's mask of a prefix of bits (IPv4 in word 0).
func prefixMask(bits, i int) uint32 {
	b := bits - 32*i
	switch {
	case b <= 0:
		return 0
	case b >= 32:
		return math.MaxUint32
	}
	return ^uint32(0) << (32 - b)
}

// matchLen is the length of matchPrefix's code.
func matchLen(bits int) int {
	n := 2
	for i := range 4 {
		switch m := prefixMask(bits, i); m {
		case 0:
		case math.MaxUint32:
			n += 2
		default:
			n += 3
		}
	}
	return n
}

// matchPrefix goes on when the source is in the prefix, else to miss.
func (a *asm) matchPrefix(f sketch.Family, words [4]uint32, bits int, miss label) {
	a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mIPVer})
	a.jump(bpf.JumpEqual, familyVersion(f), next, miss)
	for i := range 4 {
		m := prefixMask(bits, i)
		if m == 0 {
			continue
		}
		a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mSrc0 + i})
		if m != math.MaxUint32 {
			a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: m})
		}
		a.jump(bpf.JumpEqual, words[i]&m, next, miss)
	}
}

// allow accepts the allowlisted sources, and returns the instructions it
// took.
func (a *asm) allow(prefixes []netip.Prefix, acceptL label) (int, error) {
	start := len(a.ins)
	for _, p := range prefixes {
		p = p.Masked()
		f, words, bits := sketch.IPv4, [4]uint32{}, p.Bits()
		b := p.Addr().As16()
		if p.Addr().Is4() {
			b4 := p.Addr().As4()
			words[0] = be32(b4[:])
		} else {
			f = sketch.IPv6
			for i := range words {
				words[i] = be32(b[4*i:])
			}
		}
		if bits < 0 {
			return 0, fmt.Errorf("compiling the pre-filter: allowlisted prefix %v is not valid", p)
		}
		miss := a.newLabel()
		a.matchPrefix(f, words, bits, miss)
		a.ja(acceptL)
		a.mark(miss)
	}
	return len(a.ins) - start, nil
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// portRanges lists the ranges of a port set.
func portRanges(s *quicclass.Ports) [][2]uint16 {
	var out [][2]uint16
	if s == nil {
		return nil
	}
	for p := 0; p < 65536; p++ {
		if !s.Has(uint16(p)) {
			continue
		}
		lo := p
		for p+1 < 65536 && s.Has(uint16(p+1)) {
			p++
		}
		out = append(out, [2]uint16{uint16(lo), uint16(p)})
	}
	return out
}

// ports sends a datagram from a blocked source port to invalidL. A set of
// more than MaxPortRanges ranges is left to the userspace limiter.
func (a *asm) ports(s *quicclass.Ports, invalidL label) {
	rs := portRanges(s)
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
// with their Form stored.
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
	a.emit(bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(LongForm)}, bpf.StoreScratch{Src: bpf.RegA, N: mForm})
	a.ja(rulesL)
}

// shedRules applies the shed of long headers to the rules of the opening
// class: a packet of a limited stream or network passes both its rule and
// the shed, 1 - (1-Drop)(1-shed).
func shedRules(rules []Rule, shed float64) []Rule {
	if shed <= 0 {
		return rules
	}
	out := slices.Clone(rules)
	for i := range out {
		if out[i].Form == LongForm {
			out[i].Drop = 1 - (1-out[i].Drop)*(1-min(shed, 1))
		}
	}
	return out
}

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
	a.jump(bpf.JumpEqual, uint32(LongForm), next, keep)
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

// ruleLen is the length of rule's code.
func ruleLen(r *Rule) int {
	n := matchLen(r.Bits) + 3
	if r.MatchSrcPort {
		n += 2
	}
	if r.MatchDstPort {
		n += 2
	}
	if r.Form != AnyForm {
		n += 2
	}
	return n
}

// groupGuards bounds the instructions of the groups' checks of the form.
const groupGuards = 3 * 3

// rules emits rs grouped by header form, each group in the order of rs and
// the groups in the order of their first rule, behind one check of the
// form: a datagram walks only the rules of its form (a short header, most
// of an established connection's traffic, skips the opening class's rules
// of a flood from many networks). The form is checked once per group
// rather than per rule, so the program is no longer than ruleLen counts.
func (a *asm) rules(rs []Rule) {
	var forms []Form
	for i := range rs {
		if !slices.Contains(forms, rs[i].Form) {
			forms = append(forms, rs[i].Form)
		}
	}
	for _, f := range forms {
		end := a.newLabel()
		if f != AnyForm {
			in := a.newLabel()
			a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mForm})
			a.jump(bpf.JumpEqual, uint32(f), in, next)
			a.ja(end) // the group may be beyond a conditional jump's reach
			a.mark(in)
		}
		for i := range rs {
			if rs[i].Form == f {
				r := rs[i]
				r.Form = AnyForm // checked for the group
				a.rule(&r)
			}
		}
		a.mark(end)
	}
}

// rule drops a datagram of r's stream with probability r.Drop; any other
// goes on to the next rule.
func (a *asm) rule(r *Rule) {
	miss := a.newLabel()
	a.matchPrefix(r.Family, r.Words, r.Bits, miss)
	if r.MatchSrcPort {
		a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mSport})
		a.jump(bpf.JumpEqual, uint32(r.SrcPort), next, miss)
	}
	if r.MatchDstPort {
		a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mDport})
		a.jump(bpf.JumpEqual, uint32(r.DstPort), next, miss)
	}
	if r.Form != AnyForm {
		a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mForm})
		a.jump(bpf.JumpEqual, uint32(r.Form), next, miss)
	}
	a.emit(bpf.LoadExtension{Num: bpf.ExtRand})
	a.jump(bpf.JumpLessThan, dropThreshold(r.Drop), next, miss)
	a.emit(bpf.RetConstant{Val: 0})
	a.mark(miss)
}
