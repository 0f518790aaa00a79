package quicclass_test

import (
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
)

// FuzzClassifier runs the classifier on datagrams of any bytes and length,
// from any source port, and checks what must hold whatever the input: no
// panic; Classify is Inspect without verification; reading only the probe
// (ProbeBytes) classifies as the whole payload does; a reason exactly for
// invalid datagrams; verification refines the class without it (the same
// invalid and negotiation verdicts, a short header unverified until
// resolved, an opening still an opening or invalid by its lengths); and
// Resolve returns a class with a consistent verification for every answer.
func FuzzClassifier(f *testing.F) {
	for _, b := range [][]byte{
		quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200), quicclasstest.LongHeader(quicclass.Version2, 1, 8, 8, 1250), quicclasstest.LongHeader(quicclass.Version1, 2, 4, 8, 90),
		quicclasstest.LongPacket(quicclass.Version1, 0, []byte{1, 2, 3, 4}, []byte{5, 6, 7, 8}, make([]byte, 40), 1200),
		quicclasstest.LongPacket(quicclass.Version1, 2, []byte{1, 2, 3, 4}, nil, nil, 90), quicclasstest.ShortHeader(30), quicclasstest.ShortHeader(20),
		quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 1200), quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 300), quicclasstest.LongHeader(0, 0, 8, 8, 100),
		quicclasstest.LongHeader(quicclass.Version1, 3, 8, 8, 100), quicclasstest.LongHeader(quicclass.Version1, 0, 21, 8, 1200), {}, make([]byte, 64),
	} {
		f.Add(uint16(50000), b, false)
		f.Add(uint16(53), b, true)
	}
	blocked := quicclass.DefaultBlockedPorts()
	f.Fuzz(func(t *testing.T, sport uint16, b []byte, verify bool) {
		h := quicclass.Inspect(blocked, sport, b, len(b), verify)
		plain := quicclass.Inspect(blocked, sport, b, len(b), false)
		if c, r := quicclass.Classify(blocked, sport, b, len(b)); c != plain.Class || r != plain.Reason {
			t.Fatalf("Classify %v/%v, Inspect %v/%v", c, r, plain.Class, plain.Reason)
		}
		if len(b) > quicclass.ProbeBytes {
			if p := quicclass.Inspect(blocked, sport, b[:quicclass.ProbeBytes], len(b), false); p != plain {
				t.Fatalf("from the probe %+v, from the whole payload %+v", p, plain)
			}
		}
		for _, x := range []quicclass.Header{h, plain} {
			if x.Class >= quicclass.NumClasses || x.Reason >= quicclass.NumReasons || (x.Class == quicclass.Invalid) != (x.Reason != quicclass.NotInvalid) {
				t.Fatalf("class %v with reason %v", x.Class, x.Reason)
			}
		}
		switch {
		case plain.Class == quicclass.Invalid || plain.Class == quicclass.Negotiation:
			if h != plain {
				t.Fatalf("verified %+v, unverified %+v", h, plain)
			}
		case plain.Class == quicclass.Established && verify:
			if h.Class != quicclass.Unverified || h.Check != quicclass.CheckShort || !h.HasID {
				t.Fatalf("a short header verified %+v", h)
			}
		case plain.Class == quicclass.Opening && verify:
			if !(h.Class == quicclass.Opening && (h.Check == quicclass.CheckOpening || h.Check == quicclass.CheckHandshake)) &&
				!(h.Class == quicclass.Invalid && h.Reason == quicclass.Length) {
				t.Fatalf("an opening verified %+v", h)
			}
		}
		for _, id := range []bool{false, true} {
			for _, peer := range []int{0, 1, 2, 3} { // none, proven, answered, credited
				c, r, v := h.Resolve(id && h.HasID, peer == 1, peer >= 2, peer == 3)
				if c >= quicclass.NumClasses || r >= quicclass.NumReasons || v >= quicclass.NumVerifications ||
					(c == quicclass.Invalid) != (r != quicclass.NotInvalid) || (v != quicclass.NotVerified && c == quicclass.Invalid) {
					t.Fatalf("%+v resolved (id %v, peer %v) to %v/%v/%v", h, id, peer, c, r, v)
				}
				if h.Check == quicclass.CheckNone && (c != h.Class || v != quicclass.NotVerified) {
					t.Fatalf("%+v with nothing to check resolved to %v/%v", h, c, v)
				}
			}
		}
	})
}
