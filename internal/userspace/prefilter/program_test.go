package prefilter

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// corpus returns datagrams of every shape the classifier tells apart, and
// random and mutated ones.
func corpus() [][]byte {
	var out [][]byte
	versions := []uint32{quicclass.Version1, quicclass.Version2, 0, 0xff00001d, 0x0a0a0a0a}
	sizes := []int{0, 1, 4, 5, 6, 7, 8, 12, 20, 21, 22, 30, 47, 48, 1199, 1200, 1350}
	for _, v := range versions {
		for typ := range uint8(4) {
			for _, dcil := range []int{0, 4, 8, 20, 21, 255} {
				for _, scil := range []int{0, 4, 20, 21, 255} {
					for _, size := range sizes {
						b := quicclasstest.LongHeader(v, typ, dcil, scil, size)
						out = append(out, b)
						if size > 0 {
							nofix := append([]byte(nil), b...)
							nofix[0] &^= fixedBit
							out = append(out, nofix)
						}
					}
				}
			}
		}
	}
	for _, size := range sizes {
		b := quicclasstest.ShortHeader(size)
		out = append(out, b)
		if size > 0 {
			nofix := append([]byte(nil), b...)
			nofix[0] &^= fixedBit
			out = append(out, nofix)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	n := len(out)
	for range 20000 {
		var b []byte
		if r.IntN(2) == 0 {
			b = make([]byte, r.IntN(1400))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
		} else {
			b = append([]byte(nil), out[r.IntN(n)]...)
			for range 1 + r.IntN(3) {
				if len(b) > 0 {
					b[r.IntN(min(len(b), quicclass.ProbeBytes+2))] ^= byte(1 << r.IntN(8))
				}
			}
		}
		out = append(out, b)
	}
	return out
}

// formOf is the Form the program gives a datagram of class (Classify's,
// without verification) whose UDP payload is b: a short header's, or for a
// long header, an Initial's or 0-RTT packet's whose destination ID is not
// of the server's length OpeningForm, any other's AnsweringForm.
func formOf(b []byte, class quicclass.Class) Form {
	switch class {
	case quicclass.Established:
		return ShortForm
	case quicclass.Opening:
		typ := b[0] & longTypeMask >> longTypeShift
		if binary.BigEndian.Uint32(b[versionOff:]) == quicclass.Version2 {
			typ = (typ + v2TypeRotation) % numLongPacketTypes
		}
		if typ < typeHandshake && b[dcilOff] != quicclass.ServerIDLen {
			return OpeningForm
		}
		return AnsweringForm
	}
	return AnyForm
}

// ruleForms are the forms of the rules the tests compile: each datagram
// form, and the sets FormOf gives the limiter's classes.
var ruleForms = []Form{ShortForm, OpeningForm, AnsweringForm, LongForm, EstablishedForm}

// TestInvalidMatchesQuicclass runs the stateless program on the corpus from
// several source ports and addresses and compares its verdicts with
// quicclass: it drops exactly what Classify calls invalid (never what
// quicclass keeps, with or without verification), lets the sample through,
// and stores the header form the stream rules match (formOf).
func TestInvalidMatchesQuicclass(t *testing.T) {
	blocked := quicclass.DefaultBlockedPorts()
	build := func(rules ...Rule) *Program {
		p, err := Build(Spec{Classify: true, BlockedPorts: blocked, SampleShift: DefaultSampleShift, Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := build()
	ruled := map[Form]*Program{}
	for _, f := range ruleForms {
		ruled[f] = build(Rule{Family: sketch.IPv4, Form: f, Drop: 1})
	}
	sources := []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("::1"), netip.MustParseAddr("::ffff:127.0.0.3")}
	ports := []uint16{50000, 443, 0, 1023, 1024, 1900, 5353, 11211, 65535}
	drops, checked := 0, 0
	for i, b := range corpus() {
		sport := ports[i%len(ports)]
		src := netip.AddrPortFrom(sources[i%len(sources)], sport)
		class, reason := quicclass.Classify(blocked, sport, b, len(b))
		verified := quicclass.Inspect(blocked, sport, b, len(b), true)
		p := packet{src: src, dport: 443, payload: b, rnd: math.MaxUint32}
		kept := run(t, plain, p)
		if kept != (class != quicclass.Invalid) {
			t.Fatalf("datagram %d % x from %v: kept %v, quicclass says %v (%v)", i, b[:min(len(b), 32)], src, kept, class, reason)
		}
		if !kept && verified.Class != quicclass.Invalid {
			t.Fatalf("datagram %d % x: dropped, but verification keeps it (%v)", i, b[:min(len(b), 32)], verified.Class)
		}
		if !kept {
			drops++
		}
		checked++
		p.rnd = 0 // the sampled one in 2^SampleShift passes; rules drop
		if !run(t, plain, p) {
			t.Fatalf("datagram %d: the sampled invalid datagram is dropped", i)
		}
		if !src.Addr().Unmap().Is4() {
			continue // the rules are IPv4's
		}
		form := formOf(b, class)
		for _, f := range ruleForms {
			if got, want := !run(t, ruled[f], p), form&f != 0; got != want {
				t.Fatalf("datagram %d % x: a rule of forms %#x drops %v, class %v of form %#x", i, b[:min(len(b), 32)], f, got,
					class, form)
			}
		}
	}
	if drops == 0 || drops == checked {
		t.Fatalf("the corpus is one-sided: %d drops of %d", drops, checked)
	}
	t.Logf("%d datagrams, %d invalid; program of %d instructions", checked, drops, plain.Len())
}

// TestRules checks the stream rules' matching and drop probability.
func TestRules(t *testing.T) {
	v4 := netip.MustParseAddrPort("127.1.2.3:40000")
	v6 := netip.MustParseAddrPort("[fd00:1:2:3::9]:40000")
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	shortPkt := quicclasstest.ShortHeader(100)
	exact := Rule{Family: sketch.IPv4, Words: [4]uint32{0x7f010203}, Bits: 32, SrcPort: 40000, MatchSrcPort: true,
		DstPort: 443, MatchDstPort: true, Form: LongForm, Drop: 0.25}
	net6 := Rule{Family: sketch.IPv6, Words: [4]uint32{0xfd000001, 0x00020000}, Bits: 40, Form: ShortForm, Drop: 1}
	quarter := uint32(1 << 30)
	tests := []struct {
		name string
		rule Rule
		p    packet
		kept bool
	}{
		{"exact, under the threshold", exact, packet{src: v4, dport: 443, payload: initial, rnd: quarter - 1}, false},
		{"exact, at the threshold", exact, packet{src: v4, dport: 443, payload: initial, rnd: quarter}, true},
		{"other source port", exact, packet{src: netip.AddrPortFrom(v4.Addr(), 40001), dport: 443, payload: initial}, true},
		{"other destination port", exact, packet{src: v4, dport: 8443, payload: initial}, true},
		{"other address", exact, packet{src: netip.MustParseAddrPort("127.1.2.4:40000"), dport: 443, payload: initial}, true},
		{"other form", exact, packet{src: v4, dport: 443, payload: shortPkt}, true},
		{"IPv4-mapped source", exact, packet{src: netip.MustParseAddrPort("[::ffff:127.1.2.3]:40000"), dport: 443, payload: initial}, false},
		{"IPv6 prefix", net6, packet{src: v6, dport: 443, payload: shortPkt, rnd: math.MaxUint32 - 1}, false},
		{"IPv6 prefix, any port", net6, packet{src: netip.AddrPortFrom(v6.Addr(), 1), dport: 9, payload: shortPkt}, false},
		{"IPv6 outside the prefix", net6, packet{src: netip.MustParseAddrPort("[fd00:1:102::9]:40000"), dport: 443, payload: shortPkt}, true},
		{"IPv6 rule, IPv4 source", Rule{Family: sketch.IPv6, Drop: 1}, packet{src: v4, dport: 443, payload: shortPkt}, true},
		{"no drop probability", Rule{Family: sketch.IPv4, Drop: 0}, packet{src: v4, dport: 443, payload: shortPkt}, true},
		{"no network header", Rule{Family: sketch.IPv4, Drop: 1}, packet{src: v4, dport: 443, payload: shortPkt, noNetHeader: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Build(Spec{Classify: true, SampleShift: DefaultSampleShift, Rules: []Rule{tt.rule}})
			if err != nil {
				t.Fatal(err)
			}
			if p.Rules != 1 {
				t.Fatalf("compiled %d rules, want 1", p.Rules)
			}
			if got := run(t, p, tt.p); got != tt.kept {
				t.Errorf("kept = %v, want %v", got, tt.kept)
			}
		})
	}
}

// TestAllowAndDryRun: an allowlisted source and a dry run are never
// dropped; without classification nothing is invalid.
func TestAllowAndDryRun(t *testing.T) {
	junk := []byte{0x00, 0x01}
	src := netip.MustParseAddrPort("127.9.9.9:53")
	all := []Rule{{Family: sketch.IPv4, Drop: 1}}
	tests := []struct {
		name string
		spec Spec
		src  netip.AddrPort
		kept bool
	}{
		{"junk", Spec{Classify: true, BlockedPorts: quicclass.DefaultBlockedPorts()}, src, false},
		{"allowlisted junk", Spec{Classify: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.9.0.0/16")}}, src, true},
		{"allowlisted IPv6", Spec{Classify: true, Rules: all, Allow: []netip.Prefix{netip.MustParsePrefix("::1/128")}},
			netip.MustParseAddrPort("[::1]:5000"), true},
		{"allowlist of another source", Spec{Classify: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.8.0.0/16")}}, src, false},
		{"dry run", Spec{DryRun: true, Classify: true, Rules: all}, src, true},
		{"not classifying", Spec{}, src, true},
		{"not classifying, a rule", Spec{Rules: all}, src, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Build(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := run(t, p, packet{src: tt.src, dport: 443, payload: junk, rnd: math.MaxUint32 - 1}); got != tt.kept {
				t.Errorf("kept = %v, want %v", got, tt.kept)
			}
		})
	}
}

// TestBudget: rules beyond MaxInstructions are left out, the rest work, and
// an allowlist too large is refused.
func TestBudget(t *testing.T) {
	var rules []Rule
	for i := range 2000 {
		rules = append(rules, Rule{Family: sketch.IPv6, Words: [4]uint32{0xfd000000, uint32(i), 0, 1}, Bits: 128,
			SrcPort: uint16(2000 + i), MatchSrcPort: true, DstPort: 443, MatchDstPort: true, Form: ShortForm, Drop: 1})
	}
	p, err := Build(Spec{Classify: true, BlockedPorts: quicclass.DefaultBlockedPorts(), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() > MaxInstructions || p.Rules < 100 || p.Rules >= len(rules) {
		t.Fatalf("%d instructions, %d rules compiled of %d", p.Len(), p.Rules, len(rules))
	}
	last := rules[p.Rules-1]
	b := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, byte((p.Rules - 1) >> 8), byte(p.Rules - 1), 15: 1})
	pk := packet{src: netip.AddrPortFrom(b, last.SrcPort), dport: 443, payload: quicclasstest.ShortHeader(100)}
	if run(t, p, pk) {
		t.Errorf("the last rule compiled (%d) does not drop its stream", p.Rules)
	}
	out := rules[p.Rules]
	pk.src = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, byte(p.Rules >> 8), byte(p.Rules), 15: 1}), out.SrcPort)
	if !run(t, p, pk) {
		t.Errorf("a rule left out (%d) drops its stream", p.Rules)
	}
	var allow []netip.Prefix
	for i := range 200 {
		allow = append(allow, netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 1, byte(i), 15: 1}), 128))
	}
	if _, err := Build(Spec{Allow: allow}); err == nil {
		t.Error("an allowlist of 200 IPv6 addresses fits, want it refused")
	}
}

// TestCodeLengths checks the lengths Build budgets the rules by against
// the code it emits: the shed's (shedLen), a rule's (ruleLen) and its
// group's check of the form (groupGuardLen, once per form); and that a
// program of as many rules as fit, of several forms, with an allowlist and
// the shed, stays within MaxInstructions and leaves less than a rule
// unused.
func TestCodeLengths(t *testing.T) {
	length := func(s Spec) int {
		t.Helper()
		p, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		return p.Len()
	}
	base := Spec{Classify: true, BlockedPorts: quicclass.DefaultBlockedPorts(), SampleShift: DefaultSampleShift}
	empty := length(base)
	shed := base
	shed.Shed = 0.5
	if got := length(shed) - empty; got != shedLen {
		t.Errorf("the shed takes %d instructions, shedLen says %d", got, shedLen)
	}
	v4 := Rule{Family: sketch.IPv4, Words: [4]uint32{0x7f010200}, Bits: 24, Drop: 0.5}
	v6 := Rule{Family: sketch.IPv6, Words: [4]uint32{0xfd000000, 1, 2, 3}, Bits: 128, SrcPort: 4000, MatchSrcPort: true,
		DstPort: 443, MatchDstPort: true, Drop: 0.5}
	with := func(r Rule, f Form) Rule { r.Form = f; return r }
	tests := []struct {
		name  string
		rules []Rule
		want  int
	}{
		{"an IPv4 rule of any form", []Rule{v4}, ruleLen(&v4)},
		{"an IPv4 rule of opening headers", []Rule{with(v4, OpeningForm)}, ruleLen(&v4) + groupGuardLen},
		{"an IPv6 rule with ports, of established headers", []Rule{with(v6, EstablishedForm)}, ruleLen(&v6) + groupGuardLen},
		{"two rules of one form", []Rule{with(v4, ShortForm), with(v6, ShortForm)}, ruleLen(&v4) + ruleLen(&v6) + groupGuardLen},
		{"two rules of two forms", []Rule{with(v4, ShortForm), with(v6, LongForm)}, ruleLen(&v4) + ruleLen(&v6) + 2*groupGuardLen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			s.Rules = tt.rules
			if got := length(s) - empty; got != tt.want {
				t.Errorf("the rules take %d instructions, the budget counts %d", got, tt.want)
			}
		})
	}
	// As many rules as fit, of every form that lets the shed be emitted
	// and AnyForm, behind an allowlist.
	var rules []Rule
	forms := []Form{ShortForm, AnsweringForm, EstablishedForm, AnyForm}
	for i := range 2000 {
		r := with(v6, forms[i%len(forms)])
		r.Words[1] = uint32(i)
		rules = append(rules, r)
	}
	full := shed
	full.Rules = rules
	for i := range 20 {
		full.Allow = append(full.Allow, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16))
	}
	p, err := Build(full)
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() > MaxInstructions || MaxInstructions-p.Len() >= ruleLen(&v6)+groupGuardLen {
		t.Errorf("%d rules in %d instructions, want at most %d and less than a rule short of it", p.Rules, p.Len(), MaxInstructions)
	}
	t.Logf("%d rules in %d instructions", p.Rules, p.Len())
}

// TestNegotiationDrop checks the negotiation class's drop probability: an
// unknown version of 1200 bytes is dropped under the threshold and kept at
// it, never without a probability, without classification or from an
// allowlisted source; known versions and invalid datagrams are unaffected.
func TestNegotiationDrop(t *testing.T) {
	src := netip.MustParseAddrPort("127.1.2.3:40000")
	unknown := quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200)
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	small := quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1199)
	half := uint32(1 << 31)
	spec := Spec{Classify: true, SampleShift: DefaultSampleShift, Negotiation: 0.5}
	allowed := spec
	allowed.Allow = []netip.Prefix{netip.MustParsePrefix("127.1.0.0/16")}
	tests := []struct {
		name    string
		spec    Spec
		payload []byte
		rnd     uint32
		kept    bool
	}{
		{"under the threshold", spec, unknown, half - 1, false},
		{"at the threshold", spec, unknown, half, true},
		{"no probability", Spec{Classify: true, SampleShift: DefaultSampleShift}, unknown, 0, true},
		{"not classifying", Spec{Negotiation: 1}, unknown, 0, true},
		{"allowlisted", allowed, unknown, 0, true},
		{"version 1", spec, initial, 0, true},
		{"too small to answer: invalid, sampled", spec, small, 0, true},
		{"too small to answer: invalid", spec, small, half, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Build(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := run(t, p, packet{src: src, dport: 443, payload: tt.payload, rnd: tt.rnd}); got != tt.kept {
				t.Errorf("kept = %v, want %v", got, tt.kept)
			}
		})
	}
}

// TestShedDrop checks the shed of long headers: with no rule of the opening
// class, a long header of a known version (an Initial, a v2 Handshake) is
// dropped under the threshold and kept at it; with one, the rule's packets
// pass both it and the shed and other sources keep theirs (with
// verification, the rule's packets only: its source's Handshakes pass).
// Never without a probability, without classification or from an
// allowlisted source, nor one addressed to an ID of the server's length (a
// handshake under way); short headers, unknown versions and the invalid
// sample are unaffected.
func TestShedDrop(t *testing.T) {
	src := netip.MustParseAddrPort("127.1.2.3:40000")
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	handshake := quicclasstest.LongHeader(quicclass.Version2, 3, 8, 8, 300) // type 3 is v2's Handshake
	short := quicclasstest.ShortHeader(100)
	unknown := quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200)
	retry := quicclasstest.LongHeader(quicclass.Version1, typeRetry, 8, 8, 300) // server-only: invalid
	quarter := uint32(1 << 30)
	spec := Spec{Classify: true, SampleShift: DefaultSampleShift, Shed: 0.25}
	allowed := spec
	allowed.Allow = []netip.Prefix{netip.MustParsePrefix("127.1.0.0/16")}
	// A rule of the opening class for 127.1.2.0/24 dropping half: its
	// packets pass it and the shed, 1 - 0.5 x 0.75 = 0.625 dropped; a
	// source no rule names keeps its long headers.
	ruled := spec
	ruled.Rules = []Rule{{Family: sketch.IPv4, Words: [4]uint32{0x7f010200}, Bits: 24, Form: LongForm, Drop: 0.5}}
	at625 := uint32(0.625 * (1 << 32))
	elsewhere := netip.MustParseAddrPort("127.9.9.9:40000")
	// The same rule with verification matches only what opens
	// connections: the source's Handshakes pass both.
	verifying := ruled
	verifying.Rules = []Rule{{Family: sketch.IPv4, Words: [4]uint32{0x7f010200}, Bits: 24, Form: OpeningForm, Drop: 0.5}}
	v1Handshake := quicclasstest.LongHeader(quicclass.Version1, 2, 8, 8, 300)
	tests := []struct {
		name    string
		spec    Spec
		from    netip.AddrPort // src when zero
		payload []byte
		rnd     uint32
		kept    bool
	}{
		{"initial under the threshold", spec, netip.AddrPort{}, initial, quarter - 1, false},
		{"initial at the threshold", spec, netip.AddrPort{}, initial, quarter, true},
		{"handshake under the threshold", spec, netip.AddrPort{}, handshake, 0, false},
		{"a handshake under way: spared", spec, netip.AddrPort{}, quicclasstest.LongHeader(quicclass.Version1, 2, quicclass.ServerIDLen, 8, 300), 0, true},
		{"an Initial to a server ID: spared", spec, netip.AddrPort{}, quicclasstest.LongHeader(quicclass.Version1, 0, quicclass.ServerIDLen, 8, 1200), 0, true},
		{"no probability", Spec{Classify: true, SampleShift: DefaultSampleShift}, netip.AddrPort{}, initial, 0, true},
		{"not classifying", Spec{Shed: 1}, netip.AddrPort{}, initial, 0, true},
		{"allowlisted", allowed, netip.AddrPort{}, initial, 0, true},
		{"short header", spec, netip.AddrPort{}, short, 0, true},
		{"unknown version", spec, netip.AddrPort{}, unknown, 0, true},
		{"invalid: sampled as before", spec, netip.AddrPort{}, retry, 0, true},
		{"invalid: dropped as before", spec, netip.AddrPort{}, retry, quarter, false},
		{"a ruled source under both", ruled, netip.AddrPort{}, initial, at625 - 1, false},
		{"a ruled source over both", ruled, netip.AddrPort{}, initial, at625, true},
		{"no rule names it: kept", ruled, elsewhere, initial, 0, true},
		{"no rule: shed", spec, elsewhere, initial, 0, false},
		{"verifying: a ruled source under both", verifying, netip.AddrPort{}, initial, at625 - 1, false},
		{"verifying: a ruled source over both", verifying, netip.AddrPort{}, initial, at625, true},
		{"verifying: a ruled source's Handshake", verifying, netip.AddrPort{}, v1Handshake, 0, true},
		{"verifying: no rule names it: kept", verifying, elsewhere, initial, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Build(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			from := tt.from
			if !from.IsValid() {
				from = src
			}
			if got := run(t, p, packet{src: from, dport: 443, payload: tt.payload, rnd: tt.rnd}); got != tt.kept {
				t.Errorf("kept = %v, want %v", got, tt.kept)
			}
			if want := tt.spec.Shed; tt.spec.Classify && p.Shed != want {
				t.Errorf("Program.Shed = %v, want %v", p.Shed, want)
			}
		})
	}
}

// TestRuleGroups: rules of both forms, interleaved, each drop only their
// form's datagrams of their source, and the program checks the form once
// per group, not once per rule.
func TestRuleGroups(t *testing.T) {
	rule := func(addr uint32, f Form) Rule {
		return Rule{Family: sketch.IPv4, Words: [4]uint32{addr}, Bits: 32, Form: f, Drop: 1}
	}
	a, b, c := uint32(0x7f010001), uint32(0x7f010002), uint32(0x7f010003)
	p, err := Build(Spec{Classify: true, SampleShift: DefaultSampleShift,
		Rules: []Rule{rule(a, LongForm), rule(b, ShortForm), rule(c, LongForm), rule(a, ShortForm)}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Rules != 4 {
		t.Fatalf("compiled %d rules, want 4", p.Rules)
	}
	checks := 0
	for _, in := range p.Instructions {
		if in == (bpf.LoadScratch{Dst: bpf.RegA, N: mForm}) {
			checks++
		}
	}
	if checks != 2 {
		t.Errorf("the form is loaded %d times, want once for each of the 2 groups", checks)
	}
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	shortPkt := quicclasstest.ShortHeader(100)
	src := func(addr uint32) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(addr >> 24), byte(addr >> 16), byte(addr >> 8), byte(addr)}), 40000)
	}
	tests := []struct {
		name    string
		addr    uint32
		payload []byte
		kept    bool
	}{
		{"long from a", a, initial, false},
		{"short from a", a, shortPkt, false},
		{"long from b", b, initial, true},
		{"short from b", b, shortPkt, false},
		{"long from c", c, initial, false},
		{"short from c", c, shortPkt, true},
		{"long from elsewhere", 0x7f010004, initial, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := run(t, p, packet{src: src(tt.addr), dport: 443, payload: tt.payload}); got != tt.kept {
				t.Errorf("kept = %v, want %v", got, tt.kept)
			}
		})
	}
}

// TestFormsKeepClassesApart runs well-formed datagrams of every kind
// through programs with a rule of each datagram form, and checks the form
// each gets against what verification can make of it (quicclass.Resolve,
// whatever the server learned): only the established class's rules
// (FormOf) match a datagram verification makes established, and they match
// everything that class can hold. Without verification, the opening class's
// rules match exactly the long headers, the established class's the short
// ones.
func TestFormsKeepClassesApart(t *testing.T) {
	id := []byte{0xc1, 0x1e, 0x47, 0x01}
	scid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	type datagram struct {
		name string
		b    []byte
		want Form
	}
	var datagrams []datagram
	for _, v := range []struct {
		name    string
		version uint32
		wire    [3]uint8 // Initial, 0-RTT, Handshake as on the wire
	}{{"v1", quicclass.Version1, [3]uint8{0, 1, 2}}, {"v2", quicclass.Version2, [3]uint8{1, 2, 3}}} {
		for typ, name := range []string{"Initial", "0-RTT", "Handshake"} {
			for _, dcil := range []int{0, 3, quicclass.ServerIDLen, 5, 8, quicclass.MaxConnectionIDLen} {
				dcid := make([]byte, dcil)
				copy(dcid, id)
				want := AnsweringForm
				if typ != typeHandshake && dcil != quicclass.ServerIDLen {
					want = OpeningForm
				}
				datagrams = append(datagrams, datagram{fmt.Sprintf("%s %s, %d-byte ID", v.name, name, dcil),
					quicclasstest.LongPacket(v.version, v.wire[typ], dcid, scid, nil, 1200), want})
			}
		}
	}
	datagrams = append(datagrams, datagram{"short header", quicclasstest.ShortPacket([4]byte(id), 100), ShortForm})
	programs := map[Form]*Program{}
	for _, f := range []Form{ShortForm, OpeningForm, AnsweringForm} {
		p, err := Build(Spec{Classify: true, SampleShift: DefaultSampleShift, Rules: []Rule{{Family: sketch.IPv4, Form: f, Drop: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		programs[f] = p
	}
	verifying := decide.Config{Classify: true, VerifyIDs: true}
	plain := decide.Config{Classify: true}
	for _, d := range datagrams {
		t.Run(d.name, func(t *testing.T) {
			var form Form
			for f, p := range programs {
				if !run(t, p, packet{src: netip.MustParseAddrPort("127.0.0.9:40000"), dport: 443, payload: d.b}) {
					form |= f
				}
			}
			if form != d.want {
				t.Fatalf("form %#x, want %#x", form, d.want)
			}
			// Every class verification can give it, with each verification.
			h := quicclass.Inspect(nil, 40000, d.b, len(d.b), true)
			if h.Class == quicclass.Invalid {
				t.Fatalf("invalid with verification (%v)", h.Reason)
			}
			// A network's node: the rules that may take other sources'
			// packets than the flooding stream's (the unverified class's
			// rules of one address and port take only its own).
			network := sketch.NewNode(1, true, true)
			for _, idKnown := range []bool{false, h.HasID} {
				for _, proven := range []bool{false, true} {
					for _, answered := range []bool{false, !proven} {
						class, _, how := h.Resolve(idKnown, proven, answered, answered)
						if class != quicclass.Established {
							continue
						}
						for rc := range quicclass.Class(quicclass.LimiterClasses) {
							rf, ok := FormOf(verifying, rc, network)
							switch {
							case !ok:
							case rc == class && rf&form == 0:
								t.Errorf("%v (%v): the established class's rules (forms %#x) miss it", class, how, rf)
							case rc != class && rf&form != 0:
								t.Errorf("%v (%v): the %v class's rules (forms %#x) match it", class, how, rc, rf)
							}
						}
					}
				}
			}
			// Without verification: the class is Classify's, and its
			// rules match exactly its datagrams.
			class, _ := quicclass.Classify(nil, 40000, d.b, len(d.b))
			for rc := range quicclass.Class(quicclass.LimiterClasses) {
				rf, ok := FormOf(plain, rc, sketch.NewNode(1, true, true))
				if ok && (rf&form != 0) != (rc == class) {
					t.Errorf("without verification, the %v class's rules (forms %#x) match a datagram of the %v class: %v",
						rc, rf, class, rf&form != 0)
				}
			}
		})
	}
}

// TestReturningExcepted: a rule of the opening class over a network leaves
// the returning users in it alone (the review's finding 6: a spoofed
// flood from a network cut its verified users' new connections off), up to
// MaxReturningPerRule of them, the most recent first; every other source of
// the network, and the rules of one address or of other forms, drop as
// before. Each case is also measured by the code's length against ruleLen.
func TestReturningExcepted(t *testing.T) {
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	shortPkt := quicclasstest.ShortHeader(100)
	net4 := Rule{Family: sketch.IPv4, Words: [4]uint32{0x7f840000}, Bits: 24, Form: OpeningForm, Drop: 1}
	net6 := Rule{Family: sketch.IPv6, Words: [4]uint32{0xfd000001, 0x00020000}, Bits: 48, Form: OpeningForm, Drop: 1}
	one4 := Rule{Family: sketch.IPv4, Words: [4]uint32{0x7f840003}, Bits: 32, Form: OpeningForm, Drop: 1}
	short4 := net4
	short4.Form = ShortForm
	ret4 := netip.MustParseAddr("127.132.0.3")
	ret6 := netip.MustParseAddr("fd00:1:2:0:aa::3")
	returning := []netip.Addr{ret4, netip.MustParseAddr("127.133.0.3"), ret6}
	var crowd []netip.Addr // more returning users of 127.132.0.0/24 than a rule takes
	for i := range MaxReturningPerRule + 8 {
		crowd = append(crowd, netip.AddrFrom4([4]byte{127, 132, 0, byte(100 + i)}))
	}
	crowd = append(crowd, ret4) // the oldest: left out
	src := func(a string) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(a), 40000) }
	tests := []struct {
		name      string
		rule      Rule
		returning []netip.Addr
		src       netip.AddrPort
		payload   []byte
		kept      bool
	}{
		{"IPv4: a returning user's Initial", net4, returning, netip.AddrPortFrom(ret4, 40000), initial, true},
		{"IPv4: a stranger of its /24", net4, returning, src("127.132.0.4"), initial, false},
		{"IPv4: a returning user of another /24", net4, returning, src("127.133.0.3"), initial, true},
		{"IPv4: mapped", net4, returning, src("::ffff:127.132.0.3"), initial, true},
		{"IPv6: a returning user's Initial", net6, returning, netip.AddrPortFrom(ret6, 40000), initial, true},
		{"IPv6: a stranger of its /48", net6, returning, src("fd00:1:2:0:aa::4"), initial, false},
		{"IPv6: differs in the last word only", net6, returning, src("fd00:1:2:0:aa::1:3"), initial, false},
		{"the rule of one address judges it", one4, returning, netip.AddrPortFrom(ret4, 40000), initial, false},
		{"another form's rule takes it", short4, returning, netip.AddrPortFrom(ret4, 40000), shortPkt, false},
		{"the most recent of a crowd", net4, crowd, src("127.132.0.100"), initial, true},
		{"the last that fits", net4, crowd, src(fmt.Sprintf("127.132.0.%d", 100+MaxReturningPerRule-1)), initial, true},
		{"beyond the rule's room", net4, crowd, src(fmt.Sprintf("127.132.0.%d", 100+MaxReturningPerRule)), initial, false},
		{"the oldest of a crowd", net4, crowd, netip.AddrPortFrom(ret4, 40000), initial, false},
		{"none returning", net4, nil, netip.AddrPortFrom(ret4, 40000), initial, false},
	}
	base := Spec{Classify: true, SampleShift: DefaultSampleShift}
	empty, err := Build(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			s.Rules, s.Returning = []Rule{tt.rule}, tt.returning
			p, err := Build(s)
			if err != nil {
				t.Fatal(err)
			}
			if p.Rules != 1 {
				t.Fatalf("compiled %d rules, want 1", p.Rules)
			}
			if got := run(t, p, packet{src: tt.src, dport: 443, payload: tt.payload, rnd: 1}); got != tt.kept {
				t.Errorf("kept = %v, want %v", got, tt.kept)
			}
			r := exceptReturning([]Rule{tt.rule}, tt.returning)[0]
			if got, want := p.Len()-empty.Len(), ruleLen(&r)+groupGuardLen; got != want {
				t.Errorf("the rule takes %d instructions, ruleLen says %d", got, want)
			}
		})
	}
}
