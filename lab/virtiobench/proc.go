//go:build linux

package virtiobench

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Ticks are one CPU's times (or all CPUs' together) from /proc/stat, in
// USER_HZ ticks.
type Ticks struct {
	User, Nice, System, Idle, IOWait, IRQ, Softirq, Steal uint64
}

// sub is t - u, column by column.
func (t Ticks) sub(u Ticks) Ticks {
	return Ticks{t.User - u.User, t.Nice - u.Nice, t.System - u.System, t.Idle - u.Idle, t.IOWait - u.IOWait,
		t.IRQ - u.IRQ, t.Softirq - u.Softirq, t.Steal - u.Steal}
}

// Times are a CPU's times in seconds (ticks of 1/clockTicks).
type Times struct {
	User    float64 `json:"user"`
	Nice    float64 `json:"nice"`
	System  float64 `json:"system"`
	Idle    float64 `json:"idle"`
	IOWait  float64 `json:"iowait"`
	IRQ     float64 `json:"irq"`
	Softirq float64 `json:"softirq"`
	Steal   float64 `json:"steal"`
}

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/PID/stat.
const clockTicks = 100

// seconds converts ticks into Times.
func (t Ticks) seconds() Times {
	s := func(v uint64) float64 { return float64(v) / clockTicks }
	return Times{s(t.User), s(t.Nice), s(t.System), s(t.Idle), s(t.IOWait), s(t.IRQ), s(t.Softirq), s(t.Steal)}
}

// Kernel is the kernel's time: softirq (the NIC's receive path: its NAPI
// poll, the XDP program, IP and UDP input, the socket filter), system
// (system calls: Caddy's reads among them) and hard interrupts.
func (t Times) Kernel() float64 { return t.Softirq + t.System + t.IRQ }

// Total is every column's time: the window times the CPUs.
func (t Times) Total() float64 {
	return t.User + t.Nice + t.System + t.Idle + t.IOWait + t.IRQ + t.Softirq + t.Steal
}

// Busy is every non-idle time the guest ran: the kernel's and user space's
// (Caddy's).
func (t Times) Busy() float64 { return t.Kernel() + t.User + t.Nice }

// ParseStat reads /proc/stat's CPU lines: all CPUs together first, then
// each CPU in order.
func ParseStat(b []byte) ([]Ticks, error) {
	var out []Ticks
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if len(f) < 9 {
			return nil, fmt.Errorf("/proc/stat: short line %q", line)
		}
		var v [8]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			v[i] = n
		}
		if (f[0] == "cpu") != (len(out) == 0) {
			return nil, fmt.Errorf("/proc/stat: %q out of place", f[0])
		}
		out = append(out, Ticks{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]})
	}
	if len(out) < 2 {
		return nil, fmt.Errorf("/proc/stat: no CPU lines in %.100q", b)
	}
	return out, nil
}

// XDPAttach is how `ip link show` says an interface runs an XDP program:
// "xdp" (native, in the driver), "xdpgeneric" (after the kernel built the
// packet), "xdpoffload", "xdpmulti", or "none".
func XDPAttach(ipLink string) string {
	f := strings.Fields(ipLink)
	for i := 0; i+2 < len(f); i++ {
		if f[i] == "mtu" {
			switch f[i+2] {
			case "xdp", "xdpgeneric", "xdpoffload", "xdpmulti":
				return f[i+2]
			}
			return "none"
		}
	}
	return "none"
}

// LinkStats are an interface's packet counters.
type LinkStats struct {
	RxPackets, RxDropped, TxPackets, TxDropped uint64
}

// ParseLinkStats reads the counters of the one interface of
// `ip -j -s link show dev NAME`.
func ParseLinkStats(b []byte) (LinkStats, error) {
	var links []struct {
		Stats struct {
			Rx struct {
				Packets uint64 `json:"packets"`
				Dropped uint64 `json:"dropped"`
			} `json:"rx"`
			Tx struct {
				Packets uint64 `json:"packets"`
				Dropped uint64 `json:"dropped"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(b, &links); err != nil {
		return LinkStats{}, fmt.Errorf("ip -j -s link: %w", err)
	}
	if len(links) != 1 {
		return LinkStats{}, fmt.Errorf("ip -j -s link: %d interfaces, want 1", len(links))
	}
	s := links[0].Stats
	return LinkStats{RxPackets: s.Rx.Packets, RxDropped: s.Rx.Dropped, TxPackets: s.Tx.Packets, TxDropped: s.Tx.Dropped}, nil
}
