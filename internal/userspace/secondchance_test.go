package userspace

import "testing"

func TestVictim(t *testing.T) {
	tests := []struct {
		name string
		ref  []bool
		hand int
		want int
		// after is the marks once the victim is chosen.
		after []bool
	}{
		{"none referenced", []bool{false, false, false}, 0, 0, []bool{false, false, false}},
		{"the first spared once", []bool{true, false, true}, 0, 1, []bool{false, false, true}},
		{"from the hand on", []bool{false, true, true}, 1, 0, []bool{false, false, false}},
		{"all referenced: the hand comes round", []bool{true, true, true}, 2, 2, []bool{false, false, false}},
	}
	for _, tt := range tests {
		ref := append([]bool(nil), tt.ref...)
		h := ClockHand{pos: tt.hand}
		got := h.Victim(len(ref), func(i int) bool {
			r := ref[i]
			ref[i] = false
			return r
		})
		if got != tt.want {
			t.Errorf("%s: victim %d, want %d", tt.name, got, tt.want)
		}
		for i := range ref {
			if ref[i] != tt.after[i] {
				t.Errorf("%s: marks %v afterwards, want %v", tt.name, ref, tt.after)
				break
			}
		}
		if h.pos != (tt.want+1)%len(ref) {
			t.Errorf("%s: hand at %d, want just past the victim", tt.name, h.pos)
		}
	}
}
