//go:build linux

package virtiobench

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseSetups: CPUS/QUEUES, each queue count at most the vCPUs.
func TestParseSetups(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []Setup
	}{
		{"1/1", []Setup{{1, 1}}},
		{"1/1,2/1,2/2", []Setup{{1, 1}, {2, 1}, {2, 2}}},
		{" 4/2 , 4/4", []Setup{{4, 2}, {4, 4}}},
		{"1/2", nil},
		{"0/1", nil},
		{"9/1", nil},
		{"2", nil},
		{"2/x", nil},
		{"1/1,1/1", nil},
		{"", nil},
	} {
		got, err := ParseSetups(c.in)
		if (err == nil) != (c.want != nil) || !slices.Equal(got, c.want) {
			t.Errorf("ParseSetups(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

// TestParseFlags: the defaults, the boots they make, and each bad value
// refused.
func TestParseFlags(t *testing.T) {
	o, err := ParseFlags([]string{"-kernel", "/k"}, new(strings.Builder))
	if err != nil {
		t.Fatal(err)
	}
	if o.Reps != 3 || o.For != 5*time.Second || o.Accel != AccelAuto || o.Senders != 1 || !o.Floor ||
		!slices.Equal(o.Setups, []Setup{{1, 1}, {2, 1}, {2, 2}}) || !slices.Equal(o.Rates, []int{0}) ||
		len(o.modes()) != 3 || !slices.Equal(o.boots(), []int{1, 2}) {
		t.Fatalf("defaults %+v (boots %v, modes %v)", o, o.boots(), o.modes())
	}
	o, err = ParseFlags([]string{"-kernel", "/k", "-setups", "2/2,1/1,2/1", "-rates", "1000,max", "-floor=false"}, new(strings.Builder))
	if err != nil || !slices.Equal(o.boots(), []int{2, 1}) || !slices.Equal(o.Rates, []int{1000, 0}) || len(o.modes()) != 2 {
		t.Fatalf("%+v, %v", o, err)
	}
	for _, args := range [][]string{{}, {"-accel", "hvf"}, {"-memory", "128"}, {"-setups", "1/2"}, {"-reps", "0"},
		{"-floods", "big"}, {"-rates", "fast"}, {"-for", "0s"}, {"-senders", "4", "-sources", "2"}, {"-sender", "pigeon"},
		{"-max-count", "0"}, {"extra"}} {
		if len(args) > 0 {
			args = append([]string{"-kernel", "/k"}, args...)
		}
		if _, err := ParseFlags(args, new(strings.Builder)); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestParseGuestFlags: the agent's defaults are the guest's addresses.
func TestParseGuestFlags(t *testing.T) {
	o, err := ParseGuestFlags(nil, new(strings.Builder))
	if err != nil || o.Listen != "[fd00:78:c::1]:9000" || o.Iface != "eth0" || o.Caddy != caddyPath {
		t.Fatalf("%+v, %v", o, err)
	}
	if _, err := ParseGuestFlags([]string{"extra"}, new(strings.Builder)); err == nil {
		t.Error("an argument: no error")
	}
}
