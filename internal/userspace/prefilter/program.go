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
	// datagrams a second still leaves about 300 samples a second; a larger
	// sample's cost is the reading goroutine's wakeups (the lab's notebook,
	// "The pre-filter's sample of invalid datagrams").
	DefaultSampleShift = 10
	// MaxPortRanges bounds the blocked source port ranges compiled; a set
	// with more leaves the ports to the userspace limiter.
	MaxPortRanges = 64
	// MaxAllowInstructions bounds the allowlist's share of the program.
	MaxAllowInstructions = 1024
	// MaxReturningPerRule bounds the returning users one network's rule
	// leaves alone (Spec.Returning): the most recent first.
	MaxReturningPerRule = 32
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
	mForm // the header's Form, one bit (AnyForm when the filter does not classify)
	mB0   // the first byte of the QUIC packet
	mDCIL // a long header's destination connection ID length
	mVer  // a long header's version
	mType // a long header's packet type, numbered as in v1
	numScratch
)

// Classic BPF has 16 scratch slots: this fails to compile with more.
var _ [16 - numScratch]struct{}

// Form is a set of the header forms the program tells the datagrams that
// reach the rules apart by: a datagram has one (ShortForm, OpeningForm or
// AnsweringForm; none when the program does not classify), a rule matches
// those in its set, and AnyForm, the empty set, matches every datagram.
// Classic BPF cannot verify a connection ID: the forms are what the header
// says without the server's state, drawn so that only the established
// class's rules match a packet that verification makes established (see
// FormOf).
type Form uint8

// Forms.
const (
	// AnyForm matches every datagram (the limiter does not classify).
	AnyForm Form = 0
	// ShortForm is a short header: the established class without
	// verification; with it, the established class (a server ID bound to
	// the source, or a proven peer) or the unverified one, which the
	// program cannot tell apart.
	ShortForm Form = 1 << 0
	// OpeningForm is an Initial or 0-RTT packet of a known version whose
	// destination connection ID is not quicclass.ServerIDLen bytes long:
	// it opens a connection and cannot carry a server ID, so verification
	// never makes it established: it is of the opening class (or, with
	// verification, invalid by its lengths).
	OpeningForm Form = 1 << 1
	// AnsweringForm is any other long header of a known version: a
	// Handshake packet, or an Initial or 0-RTT packet addressed to an ID
	// of quicclass.ServerIDLen bytes (a client's packets after the
	// server's first Initial or a Retry carry the server's ID; a client's
	// first Initial carries one of 8 bytes at least, RFC 9000 section
	// 7.2). Verification makes it established (a server ID bound to the
	// source, a Handshake from a proven peer), unverified, invalid, or,
	// an Initial or 0-RTT packet to an ID that verifies nothing, of the
	// opening class; without verification it is of the opening class.
	AnsweringForm Form = 1 << 2
	// LongForm is every long header of a known version: the opening
	// class without verification.
	LongForm = OpeningForm | AnsweringForm
	// EstablishedForm is every header the established class holds with
	// verification: short headers and answering long headers.
	EstablishedForm = ShortForm | AnsweringForm
)

// Rule is a stream the kernel drops packets of with probability Drop: a
// source prefix, optionally the source and destination ports, and the
// header forms its class's rules match (FormOf).
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
	// Except are sources in the rule's network that it leaves alone
	// (Spec.Returning; Build fills it).
	Except []netip.Addr
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
	// Returning are the sources of returning users, most recent first: a
	// rule of the opening class over a network (not a single address)
	// leaves up to MaxReturningPerRule of those in it alone, as the
	// userspace limiter passes their openings through their network's
	// limits (sketch.Key's Returning). The rules of a single address
	// judge its returning user, as the limiter's nodes of its address do.
	Returning []netip.Addr
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
	// to the packets of the opening class's rules (those whose Form holds
	// OpeningForm), on top of each rule's probability, and, when there is
	// no such rule (a flood no stream stands out of, a spoofed one), to
	// every long header but one addressed to an ID of the server's length
	// (a handshake under way). Networks and sources no rule names so keep
	// what they have while rules name the flood's.
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
	// The rules that fit, with what follows them (the shed, at most
	// shedLen, and the accept): each rule's code (ruleLen) and, for the
	// first rule of each form, its group's check (groupGuardLen).
	n, used := 0, len(a.ins)+shedLen+1
	var forms []Form
	rs := exceptReturning(s.Rules, s.Returning)
	for _, r := range rs {
		l, group := ruleLen(&r), r.Form != AnyForm && !slices.Contains(forms, r.Form)
		if group {
			l += groupGuardLen
		}
		if used+l > MaxInstructions {
			break
		}
		if group {
			forms = append(forms, r.Form)
		}
		used += l
		n++
	}
	rules := shedRules(rs[:n], s.Shed)
	a.rules(rules)
	if s.Classify && !slices.ContainsFunc(rules, opening) {
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
