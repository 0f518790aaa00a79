package userspace

import (
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// benchConfig is a production-like configuration: QUIC classes, 1000
// connection-opening packets per second per stream, the default lattice.
func benchConfig() decide.Config { return testutil.QUICLimits(1000, 100_000) }

var fixedSource = netip.MustParseAddrPort("192.0.2.1:40000")

// sourceAt is the i-th source of a flood: one address, or a new address
// (spread over the whole IPv4 space) for each datagram.
func sourceAt(i int, fixed bool) netip.AddrPort {
	if fixed {
		return fixedSource
	}
	w := uint32(i) * 2654435761
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(w >> 24), byte(w >> 16), byte(w >> 8), byte(w)}), 40000)
}

// BenchmarkDecide is the userspace decision on one flood datagram (an
// Initial), alone (Decide) and in quic-go's batches of 8 (DecideBatch, per
// datagram), from one source or from a new source each time, and traffic
// under the limit, which walks every level. "key" is the
// floor: what a pass-through wrapper reads of a datagram (its key and
// probe) without deciding.
func BenchmarkDecide(b *testing.B) {
	payload := quicclasstest.Initial()
	for _, bc := range []struct {
		name  string
		fixed bool
		batch bool
		floor bool
		limit uint32 // 0: benchConfig's
	}{
		{"key/fixed-source", true, false, true, 0},
		{"single/fixed-source", true, false, false, 0},
		{"single/new-source", false, false, false, 0},
		{"batch8/fixed-source", true, true, false, 0},
		{"batch8/new-source", false, true, false, 0},
		{"batch8/under-limit", true, true, false, 8_000_000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := benchConfig()
			if bc.limit != 0 {
				cfg = testutil.QUICLimits(bc.limit, 100_000)
			}
			l := newTestDecider(b, cfg, nil, -1)
			ds := make([]decide.Datagram, 8)
			drop := make([]bool, 8)
			var sink int
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				j := i % len(ds)
				ds[j] = decide.Datagram{Key: sketch.KeyFrom(sourceAt(i, bc.fixed), 443), Length: len(payload),
					Probe: payload[:quicclass.ProbeBytes]}
				switch {
				case bc.floor:
					sink += int(ds[j].Key.Words[0])
				case !bc.batch:
					if l.Decide(&ds[j]).Drop {
						sink++
					}
				case j == len(ds)-1:
					l.DecideBatch(ds, drop)
				}
			}
			_ = sink
		})
	}
}

// BenchmarkReadBatch reads Initials from a loopback socket through a Conn
// with ReadBatch, as quic-go does (batches of 8, each slot its own buffer),
// and reports the time per datagram received: with no limiter ("pass", the
// floor: the wrapper only passes datagrams through), and with the limiter
// on a flood from one source, on a flood from a new source address per
// datagram (Linux only: the sender picks the source with IP_PKTINFO), and
// on traffic it lets through ("under-limit"). The sender fills the socket
// with rounds of datagrams while the timer is stopped; each round ends with
// a valid datagram from an allowlisted address, which is always kept.
func BenchmarkReadBatch(b *testing.B) {
	for _, bc := range []struct {
		name    string
		limiter bool
		fixed   bool
		limit   uint32
	}{
		{"pass", false, true, 1000},
		{"flood/fixed-source", true, true, 1000},
		{"flood/new-source", true, false, 1000},
		{"under-limit/fixed-source", true, true, 5_000_000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if !bc.fixed && runtime.GOOS != "linux" {
				b.Skip("choosing the source of each datagram needs Linux (any 127/8 address, IP_PKTINFO)")
			}
			benchReadBatch(b, bc.limiter, bc.fixed, bc.limit)
		})
	}
}

// floodSource is the i-th new source of the Linux flood: an address of
// 127/8 other than 127.0.0.1, which is allowlisted.
func floodSource(i int) netip.Addr {
	a := sourceAt(i+1, false).Addr().As4()
	a[0] = 127
	if a == [4]byte{127, 0, 0, 1} {
		a[3] = 3
	}
	return netip.AddrFrom4(a)
}

func benchReadBatch(b *testing.B, withLimiter, fixed bool, limit uint32) {
	const round = 128
	conn := testutil.Listen(b, "udp4", "127.0.0.1:0")
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testutil.PortOf(conn))
	cfg := testutil.QUICLimits(limit, 100_000)
	cfg.Limiter.LevelLimits = map[int]uint32{3: limit}
	cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	var l *Decider
	if withLimiter {
		l = newTestDecider(b, cfg, nil, -1)
	}
	c := wrap(b, conn, l)
	// The flood comes from 127.0.0.2 (or any 127/8 address), the sentinel
	// from the allowlisted 127.0.0.1.
	floodAddr := "127.0.0.2:0"
	if runtime.GOOS != "linux" {
		floodAddr = "[::1]:0" // other systems have 127.0.0.1 alone
		conn = testutil.Listen(b, "udp", "[::]:0")
		c = wrap(b, conn, l)
		dst = netip.AddrPortFrom(netip.IPv6Loopback(), testutil.PortOf(conn))
	}
	flood := sender(b, floodAddr)
	pc := ipv4.NewPacketConn(flood)
	sentinel := sender(b, "127.0.0.1:0")
	sentinelDst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testutil.PortOf(conn))
	payload := quicclasstest.Initial()
	ms, _ := quicGoBatch()
	sent := 0
	send := func(n int) {
		for range n {
			if fixed {
				if _, err := flood.WriteToUDPAddrPort(payload, dst); err != nil {
					b.Fatal(err)
				}
			} else {
				cm := &ipv4.ControlMessage{Src: floodSource(sent).AsSlice()}
				if _, err := pc.WriteTo(payload, cm, net.UDPAddrFromAddrPort(dst)); err != nil {
					b.Fatal(err)
				}
			}
			sent++
		}
		// An Initial, like the flood: the allowlist exempts from the
		// limits, not from validity, and a datagram that is not QUIC
		// would be dropped as invalid, leaving the reader waiting.
		if _, err := sentinel.WriteToUDPAddrPort(payload, sentinelDst); err != nil {
			b.Fatal(err)
		}
	}
	end := sentinel.LocalAddr().(*net.UDPAddr).AddrPort()
	readRound := func() {
		for {
			n, err := c.ReadBatch(ms, 0)
			if err != nil {
				b.Fatal(err)
			}
			if a := ms[n-1].Addr.(*net.UDPAddr).AddrPort(); a.Addr().Unmap() == end.Addr() && a.Port() == end.Port() {
				return
			}
		}
	}
	// Check once that the sender sets the source it is asked to.
	if !fixed {
		send(1)
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, from, err := c.UDPConn.ReadFromUDPAddrPort(make([]byte, 1500)) // unfiltered: just look
		if err != nil {
			b.Fatal(err)
		}
		if want := floodSource(0); from.Addr().Unmap() != want {
			b.Fatalf("datagram from %v, asked for %v", from, want)
		}
		c.SetReadDeadline(time.Time{})
		readRound()
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		b.StopTimer()
		send(min(round, b.N-done))
		b.StartTimer()
		readRound()
	}
	b.StopTimer()
	if l != nil {
		st, _ := l.Stats()
		var dropped uint64
		for c := range sketch.NumClasses {
			for f := range decide.Families {
				for lvl := range sketch.MaxLevels {
					dropped += st.Dropped[c][f][lvl]
				}
			}
		}
		b.ReportMetric(float64(dropped)/float64(sent), "dropped/op")
	}
}
