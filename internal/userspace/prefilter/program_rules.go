package prefilter

import (
	"fmt"
	"math"
	"net/netip"
	"slices"

	"golang.org/x/net/bpf"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

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

// opening reports whether r is a rule of the opening class: its forms hold
// OpeningForm (FormOf).
func opening(r Rule) bool { return r.Form&OpeningForm != 0 }

// shedRules applies the shed of long headers to the rules of the opening
// class: a packet of a limited stream or network passes both its rule and
// the shed, 1 - (1-Drop)(1-shed).
func shedRules(rules []Rule, shed float64) []Rule {
	if shed <= 0 {
		return rules
	}
	out := slices.Clone(rules)
	for i := range out {
		if opening(out[i]) {
			out[i].Drop = 1 - (1-out[i].Drop)*(1-min(shed, 1))
		}
	}
	return out
}

// ruleLen is the length of rule's code, its group's check of the form
// aside (groupGuardLen).
func ruleLen(r *Rule) int {
	n := matchLen(r.Bits) + 3
	if r.MatchSrcPort {
		n += 2
	}
	if r.MatchDstPort {
		n += 2
	}
	if len(r.Except) > 0 {
		n += 2 + len(r.Except)*exceptLen(r.Family, r.Bits)
	}
	return n
}

// fullBits is the length of a family's address.
func fullBits(f sketch.Family) int {
	if f == sketch.IPv6 {
		return 128
	}
	return 32
}

// exceptReturning gives each rule of the opening class over a network the
// returning users in it (Spec.Returning), up to MaxReturningPerRule, the
// order of returning kept; the other rules are left as they are.
func exceptReturning(rules []Rule, returning []netip.Addr) []Rule {
	if len(returning) == 0 {
		return rules
	}
	out := slices.Clone(rules)
	for i := range out {
		r := &out[i]
		if !opening(*r) || r.Bits >= fullBits(r.Family) {
			continue
		}
		r.Except = nil
		for _, a := range returning {
			if len(r.Except) == MaxReturningPerRule {
				break
			}
			if f, w := addrWords(a); f == r.Family && inPrefix(w, r.Words, r.Bits) {
				r.Except = append(r.Except, a.Unmap())
			}
		}
	}
	return out
}

// addrWords is an address's family and big-endian words (IPv4 in word 0).
func addrWords(a netip.Addr) (sketch.Family, [4]uint32) {
	var w [4]uint32
	a = a.Unmap()
	if a.Is4() {
		b := a.As4()
		w[0] = be32(b[:])
		return sketch.IPv4, w
	}
	b := a.As16()
	for i := range w {
		w[i] = be32(b[4*i:])
	}
	return sketch.IPv6, w
}

// inPrefix reports whether words w are in the prefix of bits of net.
func inPrefix(w, net [4]uint32, bits int) bool {
	for i := range w {
		if m := prefixMask(bits, i); w[i]&m != net[i]&m {
			return false
		}
	}
	return true
}

// words is how many words of an address a family has.
func words(f sketch.Family) int {
	if f == sketch.IPv6 {
		return 4
	}
	return 1
}

// exceptLen is the length of the code that leaves one source alone in a
// rule of family f over a prefix of bits: a load and a comparison for each
// word the prefix does not hold whole, and a jump past the rule.
func exceptLen(f sketch.Family, bits int) int {
	n := 1
	for i := range words(f) {
		if prefixMask(bits, i) != math.MaxUint32 {
			n += 2
		}
	}
	return n
}

// groupGuardLen is the length of a group's check of the form (rules).
const groupGuardLen = 3

// rules emits rs grouped by their Form, each group in the order of rs and
// the groups in the order of their first rule, behind one check of the
// form: a datagram walks only the rules whose forms hold its own (a short
// header, most of an established connection's traffic, skips the opening
// class's rules of a flood from many networks). A group of AnyForm is
// checked for nothing; any other in groupGuardLen instructions.
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
			a.jump(bpf.JumpBitsSet, uint32(f), in, next)
			a.ja(end) // the group may be beyond a conditional jump's reach
			a.mark(in)
		}
		for i := range rs {
			if rs[i].Form == f {
				a.rule(&rs[i])
			}
		}
		a.mark(end)
	}
}

// rule drops a datagram of r's source and ports with probability r.Drop,
// unless it comes from one of r.Except; any other goes on to the next rule.
// Its group checked the form.
func (a *asm) rule(r *Rule) {
	miss := a.newLabel()
	// With exceptions, the matches' conditional jumps go to a jump to
	// the rule's end, which may be beyond their reach.
	out := miss
	if len(r.Except) > 0 {
		out = a.newLabel()
	}
	a.matchPrefix(r.Family, r.Words, r.Bits, out)
	if r.MatchSrcPort {
		a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mSport})
		a.jump(bpf.JumpEqual, uint32(r.SrcPort), next, out)
	}
	if r.MatchDstPort {
		a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mDport})
		a.jump(bpf.JumpEqual, uint32(r.DstPort), next, out)
	}
	if len(r.Except) > 0 {
		check := a.newLabel()
		a.ja(check)
		a.mark(out)
		a.ja(miss)
		a.mark(check)
		for _, x := range r.Except {
			_, w := addrWords(x)
			other := a.newLabel()
			for i := range words(r.Family) {
				if prefixMask(r.Bits, i) == math.MaxUint32 {
					continue
				}
				a.emit(bpf.LoadScratch{Dst: bpf.RegA, N: mSrc0 + i})
				a.jump(bpf.JumpEqual, w[i], next, other)
			}
			a.ja(miss)
			a.mark(other)
		}
	}
	a.emit(bpf.LoadExtension{Num: bpf.ExtRand})
	a.jump(bpf.JumpLessThan, dropThreshold(r.Drop), next, miss)
	a.emit(bpf.RetConstant{Val: 0})
	a.mark(miss)
}
