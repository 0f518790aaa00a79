package svgchart

import (
	"slices"
	"testing"
)

func TestNiceCeil(t *testing.T) {
	for _, tt := range []struct{ in, want float64 }{
		{0, 1}, {-3, 1}, {0.7, 1}, {1, 1}, {1.1, 2}, {3, 5}, {7, 10}, {110, 200}, {5000, 5000},
	} {
		if got := NiceCeil(tt.in); got != tt.want {
			t.Errorf("NiceCeil(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestHuman(t *testing.T) {
	for _, tt := range []struct {
		in   float64
		want string
	}{
		{0, "0"}, {12.5, "12.5"}, {1000, "1k"}, {1500, "1.5k"}, {2.5e6, "2.5M"}, {-2000, "-2k"},
	} {
		if got := Human(tt.in); got != tt.want {
			t.Errorf("Human(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestAxis(t *testing.T) {
	lin := NewAxis(0, 90, 10, 110)
	if lin.Log || lin.Hi != 100 || lin.Pos(0) != 110 || lin.Pos(100) != 10 || lin.Pos(50) != 60 {
		t.Errorf("linear axis %+v: Pos(0)=%v Pos(50)=%v Pos(100)=%v", lin, lin.Pos(0), lin.Pos(50), lin.Pos(100))
	}
	if got := lin.Ticks(); !slices.Equal(got, []float64{0, 20, 40, 60, 80, 100}) {
		t.Errorf("linear ticks %v", got)
	}
	lg := NewAxis(3, 40000, 0, 400)
	if !lg.Log || lg.Lo != 1 || lg.Hi != 1e5 {
		t.Fatalf("log axis %+v", lg)
	}
	if lg.Pos(0) != 400 || lg.Pos(1e5) != 0 || lg.Pos(100) != 240 {
		t.Errorf("log axis positions: 0→%v 100→%v 1e5→%v", lg.Pos(0), lg.Pos(100), lg.Pos(1e5))
	}
	if got := lg.Ticks(); len(got) != 6 || got[0] != 1 || got[5] < 99999 {
		t.Errorf("log ticks %v", got)
	}
}

func TestEsc(t *testing.T) {
	if got := Esc(`a<b & "c">`); got != "a&lt;b &amp; &quot;c&quot;&gt;" {
		t.Errorf("Esc = %q", got)
	}
}
