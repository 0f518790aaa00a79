package sim

import (
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// dstPort is the port of the simulated socket.
const dstPort = 443

const second = int64(time.Second)

// fixed is a source that always sends from one address and port.
func fixed(addr string, port uint16) Source {
	k := sketch.KeyFrom(netip.AddrPortFrom(netip.MustParseAddr(addr), port), dstPort)
	return func(*rand.Rand, int64) sketch.Key { return k }
}

// randomIn draws every packet's source address at random inside prefix pfx
// and, when port is 0, its source port at random too.
func randomIn(pfx string, port uint16) Source {
	p := netip.MustParsePrefix(pfx)
	base := p.Addr().As16()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return func(rng *rand.Rand, _ int64) sketch.Key {
		a := base
		for i := bits; i < 128; i++ {
			if rng.Uint32()&1 == 1 {
				a[i/8] |= 0x80 >> (i % 8)
			}
		}
		addr := netip.AddrFrom16(a).Unmap()
		sp := port
		if sp == 0 {
			sp = uint16(1024 + rng.IntN(64512))
		}
		return sketch.KeyFrom(netip.AddrPortFrom(addr, sp), dstPort)
	}
}

// oneOf picks one of the given sources at random for every packet.
func oneOf(srcs []Source) Source {
	return func(rng *rand.Rand, now int64) sketch.Key { return srcs[rng.IntN(len(srcs))](rng, now) }
}

// until switches from source a to source b at time t.
func until(t int64, a, b Source) Source {
	return func(rng *rand.Rand, now int64) sketch.Key {
		if now < t {
			return a(rng, now)
		}
		return b(rng, now)
	}
}

func poisson(rate float64, seconds int) Poisson {
	return Poisson{Rate: rate, Until: int64(seconds) * second}
}

func cfg(limit uint32) sketch.Config {
	return sketch.Config{Limit: limit, Window: time.Second}
}

// Scenarios returns every scenario, in the order of the documentation.
func Scenarios() []*Scenario {
	top := cfg(1000).WithDefaults().Levels() - 1
	distributed := cfg(1000)
	distributed.LevelLimits = map[int]uint32{top: sketch.Unlimited}

	// 65,536 attackers: 10.1.0.0/16 is 256 /24s of 256 addresses.
	attackers := randomIn("10.1.0.0/16", 0)

	// A total cap of 20,000 pps that a wide flood fills: 256 /24s of 4
	// sources each (an address and a port), every /24 under its own limit.
	capped := cfg(1000)
	capped.LevelLimits = map[int]uint32{top: 20_000}
	proportional := capped
	proportional.ProportionalTotal = true
	var wide []Source
	for n := range 256 {
		for a := range 4 {
			wide = append(wide, fixed(netip.AddrFrom4([4]byte{10, 2, byte(n), byte(1 + a)}).String(), uint16(30000+n)))
		}
	}
	var clients []Source
	for c := range 100 {
		a := netip.AddrFrom4([4]byte{172, 16, byte(c), 10})
		clients = append(clients, fixed(a.String(), uint16(40000+c)))
	}

	return []*Scenario{
		{
			Name:        "paper-1",
			Description: "flood 100 pps from one 4-tuple, legit 5 pps from another address in the same /24; limit 25",
			Config:      cfg(25),
			Seconds:     60,
			Streams: []Stream{
				{Flood, poisson(100, 60), fixed("198.51.100.7", 5000)},
				{Legit, poisson(5, 60), fixed("198.51.100.9", 6000)},
			},
		},
		{
			Name:        "paper-2",
			Description: "reflection: 100 pps from random addresses, all from source port 53; legit 20 pps from random addresses and ports; limit 25",
			Config:      cfg(25),
			Seconds:     60,
			Streams: []Stream{
				{Flood, poisson(100, 60), randomIn("0.0.0.0/0", 53)},
				{Legit, poisson(20, 60), randomIn("0.0.0.0/0", 0)},
			},
		},
		{
			Name:        "paper-3",
			Description: "1,000,000 pps from one 4-tuple; limit 250,000",
			Config:      cfg(250_000),
			Seconds:     5,
			Streams:     []Stream{{Flood, poisson(1e6, 5), fixed("198.51.100.7", 5000)}},
		},
		{
			Name:        "paper-4",
			Description: "1,000,000 pps from one 4-tuple; limit 25",
			Config:      cfg(25),
			Seconds:     5,
			Streams:     []Stream{{Flood, poisson(1e6, 5), fixed("198.51.100.7", 5000)}},
		},
		{
			Name:        "many-ports",
			Description: "one address over 1024 source ports, 400,000 pps in total; legit 5 pps from another /24; limit 25",
			Config:      cfg(25),
			Seconds:     10,
			Streams: []Stream{
				{Flood, poisson(400_000, 10), func(rng *rand.Rand, _ int64) sketch.Key {
					return sketch.KeyFrom(netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), uint16(20000+rng.IntN(1024))), dstPort)
				}},
				{Legit, poisson(5, 10), fixed("192.0.2.10", 7000)},
			},
		},
		{
			Name:        "distributed",
			Description: "65,536 addresses in 256 /24s, 1,000,000 pps in total; 100 legit clients at 5 pps each in other /24s; limit 1000, all-sources cap lifted",
			Config:      distributed,
			Seconds:     10,
			Streams: []Stream{
				{Flood, poisson(1e6, 10), attackers},
				{Legit, poisson(500, 10), oneOf(clients)},
			},
		},
		{
			Name: "quiet-network",
			Description: "1024 sources in 256 /24s, 800 pps per /24 (204,800 pps), fill the socket's total, capped at 20,000 pps; " +
				"a client in a quiet /24 opens connections, 50 pps from random ports; limit 1000",
			Config:  capped,
			Seconds: 10,
			Streams: []Stream{
				{Flood, poisson(204_800, 10), oneOf(wide)},
				{Legit, poisson(50, 10), randomIn("192.0.2.10/32", 0)},
			},
		},
		{
			Name: "quiet-network-proportional",
			Description: "1024 sources in 256 /24s, 800 pps per /24 (204,800 pps), fill the socket's total, capped at 20,000 pps; " +
				"a client in a quiet /24 opens connections, 50 pps from random ports; limit 1000; the total drops the same share of everyone (for comparison)",
			Config:  proportional,
			Seconds: 10,
			Streams: []Stream{
				{Flood, poisson(204_800, 10), oneOf(wide)},
				{Legit, poisson(50, 10), randomIn("192.0.2.10/32", 0)},
			},
		},
		{
			Name: "quiet-network-pulse",
			Description: "1024 sources in 256 /24s, 400,000 pps for 0.5 s every 2 s, over the socket's total, capped at 20,000 pps; " +
				"a client in a quiet /24 opens connections, 50 pps from random ports; limit 1000",
			Config:  capped,
			Seconds: 10,
			Streams: []Stream{
				{Flood, Pulses{Rate: 400_000, Until: 10 * second, On: second / 2, Period: 2 * second}, oneOf(wide)},
				{Legit, poisson(50, 10), randomIn("192.0.2.10/32", 0)},
			},
		},
		{
			Name: "queue-follow",
			Description: "1024 sources in 256 /24s flood 400,000 pps from 2 s to 8 s; quic-go serves 50,000 pps from a queue of 8,192; " +
				"the socket's total starts at 20,000 and follows the queue; a client in a quiet /24 opens connections, 50 pps; limit 1000",
			Config:  capped,
			Seconds: 15,
			Server:  &Server{Rate: 50_000, Queue: 8192},
			Streams: []Stream{
				{Flood, Poisson{Rate: 400_000, From: 2 * second, Until: 8 * second}, oneOf(wide)},
				{Legit, poisson(50, 15), randomIn("192.0.2.10/32", 0)},
			},
		},
		{
			Name: "spoofed",
			Description: "a spoofed flood, 100,000 pps from a new random address and port in 10.128.0.0/9 on every packet (every /24 looks alike), " +
				"over the socket's total, capped at 20,000 pps; a client in a quiet /24 opens connections, 50 pps from random ports; limit 1000",
			Config:  capped,
			Seconds: 10,
			Streams: []Stream{
				{Flood, poisson(100_000, 10), randomIn("10.128.0.0/9", 0)},
				{Legit, poisson(50, 10), randomIn("192.0.2.10/32", 0)},
			},
		},
		{
			Name:        "new-client-burst",
			Description: "a client idle for 10 windows sends limit x window packets back to back, 10 times; limit 1000, window 1 s",
			Config:      cfg(1000),
			Seconds:     101,
			Streams: []Stream{{Legit, Bursts{From: 10 * second, Every: 10 * second, Spacing: 1000, Count: 1000, Times: 10},
				fixed("192.0.2.44", 40000)}},
		},
		{
			Name:        "ipv6-rotation",
			Description: "100,000 pps from a fresh random address per packet inside one /64 (0-5 s), then inside its /48 (5-10 s); legit 5 pps from another /48; limit 1000",
			Config:      cfg(1000),
			Seconds:     10,
			Streams: []Stream{
				{Flood, poisson(100_000, 10), until(5*second, randomIn("2001:db8:1:2::/64", 0), randomIn("2001:db8:1::/48", 0))},
				{Legit, poisson(5, 10), fixed("2001:db8:ffff::5", 5555)},
			},
		},
	}
}

// Find returns the scenario with the given name, or nil.
func Find(name string) *Scenario {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s
		}
	}
	return nil
}
