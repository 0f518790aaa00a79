//go:build linux

package bench

import (
	"slices"
	"testing"
)

func TestRepOrder(t *testing.T) {
	vs := []Variant{{Name: Plain}, {Name: "rakelimit"}, {Name: "userspace"}}
	names := func(vs []Variant) []string {
		var n []string
		for _, v := range vs {
			n = append(n, v.Name)
		}
		return n
	}
	tests := []struct {
		rep  int
		want []string
	}{
		{1, []string{Plain, "rakelimit", "userspace"}},
		{2, []string{"userspace", "rakelimit", Plain}},
		{3, []string{Plain, "rakelimit", "userspace"}},
		{4, []string{"userspace", "rakelimit", Plain}},
	}
	for _, tt := range tests {
		if got := names(repOrder(vs, tt.rep)); !slices.Equal(got, tt.want) {
			t.Errorf("repOrder(rep %d) = %v, want %v", tt.rep, got, tt.want)
		}
	}
	if got := names(vs); !slices.Equal(got, []string{Plain, "rakelimit", "userspace"}) {
		t.Errorf("repOrder changed its argument: %v", got)
	}
}
