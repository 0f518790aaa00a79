//go:build linux

package virtiobench

import (
	"math"
	"testing"
)

// near reports whether a and b agree to a millionth.
func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// TestParseStat: the CPU lines of /proc/stat, all CPUs first; anything
// else is refused.
func TestParseStat(t *testing.T) {
	const good = "cpu  10 1 20 300 4 5 60 7 0 0\ncpu0 10 1 20 300 4 5 60 7 0 0\nintr 1 2 3\nctxt 99\n"
	for _, c := range []struct {
		name, in string
		want     []Ticks
		err      bool
	}{
		{name: "one CPU", in: good, want: []Ticks{{10, 1, 20, 300, 4, 5, 60, 7}, {10, 1, 20, 300, 4, 5, 60, 7}}},
		{name: "two CPUs", in: "cpu 3 0 3 3 0 0 3 0\ncpu0 1 0 1 1 0 0 1 0\ncpu1 2 0 2 2 0 0 2 0\n",
			want: []Ticks{{3, 0, 3, 3, 0, 0, 3, 0}, {1, 0, 1, 1, 0, 0, 1, 0}, {2, 0, 2, 2, 0, 0, 2, 0}}},
		{name: "no aggregate", in: "cpu0 1 0 1 1 0 0 1 0\ncpu1 2 0 2 2 0 0 2 0\n", err: true},
		{name: "aggregate twice", in: "cpu 1 0 1 1 0 0 1 0\ncpu 1 0 1 1 0 0 1 0\n", err: true},
		{name: "short line", in: "cpu 1 2 3\ncpu0 1 2 3\n", err: true},
		{name: "not a number", in: "cpu 1 0 1 x 0 0 1 0\ncpu0 1 0 1 1 0 0 1 0\n", err: true},
		{name: "empty", in: "", err: true},
	} {
		got, err := ParseStat([]byte(c.in))
		if (err != nil) != c.err {
			t.Errorf("%s: error %v, want one: %v", c.name, err, c.err)
			continue
		}
		if len(got) != len(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: line %d %v, want %v", c.name, i, got[i], c.want[i])
			}
		}
	}
}

// TestTimes: ticks to seconds, the kernel's and busy time.
func TestTimes(t *testing.T) {
	before := Ticks{User: 100, System: 50, Idle: 1000, IRQ: 1, Softirq: 20, Steal: 3}
	after := Ticks{User: 150, Nice: 10, System: 80, Idle: 1100, IOWait: 2, IRQ: 3, Softirq: 120, Steal: 5}
	tm := after.sub(before).seconds()
	if !near(tm.Kernel(), 1.32) || !near(tm.Busy(), 1.92) || !near(tm.Total(), 2.96) {
		t.Errorf("%+v: kernel %v, busy %v, total %v", tm, tm.Kernel(), tm.Busy(), tm.Total())
	}
}

// TestXDPAttach: the attach word after the MTU in ip link's first line.
func TestXDPAttach(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 xdp qdisc pfifo_fast state UP mode DEFAULT group default qlen 1000\n" +
			"    link/ether 52:54:00:78:0c:01 brd ff:ff:ff:ff:ff:ff\n    prog/xdp id 12 tag 0123456789abcdef jited", "xdp"},
		{"2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 xdpgeneric qdisc mq state UP", "xdpgeneric"},
		{"2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 xdpoffload qdisc mq state UP", "xdpoffload"},
		{"2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc pfifo_fast state UP mode DEFAULT", "none"},
		{"", "none"},
		{"mtu", "none"},
	} {
		if got := XDPAttach(c.in); got != c.want {
			t.Errorf("XDPAttach(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestParseLinkStats: the counters of `ip -j -s link show dev NAME`.
func TestParseLinkStats(t *testing.T) {
	const one = `[{"ifindex":2,"ifname":"rkvt","stats64":{"rx":{"bytes":10,"packets":3,"errors":0,"dropped":1},` +
		`"tx":{"bytes":20,"packets":7,"errors":0,"dropped":2,"carrier_errors":0}}}]`
	for _, c := range []struct {
		name, in string
		want     LinkStats
		err      bool
	}{
		{name: "one", in: one, want: LinkStats{RxPackets: 3, RxDropped: 1, TxPackets: 7, TxDropped: 2}},
		{name: "none", in: `[]`, err: true},
		{name: "two", in: "[" + one[1:len(one)-1] + "," + one[1:], err: true},
		{name: "not JSON", in: `Device "rkvt" does not exist.`, err: true},
	} {
		got, err := ParseLinkStats([]byte(c.in))
		if (err != nil) != c.err || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v, error %v", c.name, got, err, c.want, c.err)
		}
	}
}
