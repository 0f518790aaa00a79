// Package loopbacktest holds what the socket tests of the filter (bpf) and
// of the userspace limiter share: sockets for a test, paced and bounded
// sends, and the check that a flood was held at its limit.
//
// The project's tests send floods only to loopback addresses (127.0.0.0/8,
// ::1) and to IPv6 ULA addresses (fd00::/8) assigned inside a network
// namespace the test creates; Pace refuses any other destination, and every
// send it makes is bounded in count.
package loopbacktest

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
)

// ReadBuffer is the receive buffer Listen asks for: room for a burst of a
// paced flood while the test's reader catches up.
const ReadBuffer = 8 << 20

// ula is the IPv6 unique local range tests may use inside their own network
// namespaces.
var ula = netip.MustParsePrefix("fd00::/8")

// Listen opens a UDP socket on addr for a test; it is closed when the test
// ends.
func Listen(t testing.TB, network, addr string) *net.UDPConn {
	t.Helper()
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetReadBuffer(ReadBuffer); err != nil {
		t.Fatalf("listen %s %s: read buffer: %v", network, addr, err)
	}
	return conn
}

// Sender opens a socket bound to src (port 0: any) to send from; it is
// closed when the test ends.
func Sender(t testing.TB, src netip.AddrPort) *net.UDPConn {
	t.Helper()
	network := "udp4"
	if src.Addr().Is6() {
		network = "udp6"
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(src))
	if err != nil {
		t.Fatalf("bind sender %v: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Allowed reports whether a test may send to dst: a loopback address or an
// IPv6 ULA address.
func Allowed(dst netip.Addr) bool {
	dst = dst.Unmap()
	return dst.IsLoopback() || (dst.Is6() && ula.Contains(dst))
}

// Pace sends n datagrams from conn to dst at about rate per second, in
// bursts of 50, then stops; next gives each datagram's payload. It refuses a
// destination Allowed refuses.
func Pace(conn *net.UDPConn, dst netip.AddrPort, rate, n int, next func() []byte) error {
	if !Allowed(dst.Addr()) {
		return fmt.Errorf("pace: destination %v is neither loopback nor fd00::/8", dst)
	}
	if rate <= 0 {
		return fmt.Errorf("pace: rate %d is not positive", rate)
	}
	const burst = 50
	tick := time.Duration(float64(time.Second) * burst / float64(rate))
	at := time.Now()
	for sent := 0; sent < n; {
		for i := 0; i < burst && sent < n; i++ {
			if _, err := conn.WriteToUDPAddrPort(next(), dst); err != nil {
				return fmt.Errorf("pace to %v: %w", dst, err)
			}
			sent++
		}
		at = at.Add(tick)
		time.Sleep(time.Until(at))
	}
	return nil
}

// CheckHeld fails the test unless every full second of perSecond after the
// first (seconds in all) lies within limit +- 10%.
func CheckHeld(t testing.TB, what string, perSecond []int, seconds int, limit float64) {
	t.Helper()
	if len(perSecond) < seconds {
		t.Fatalf("%s: received in %d seconds only: %v", what, len(perSecond), perSecond)
	}
	for s := 1; s < seconds; s++ {
		if got := float64(perSecond[s]); got < 0.9*limit || got > 1.1*limit {
			t.Errorf("%s: second %d received %v, want %v +- 10%% (all seconds: %v)", what, s, got, limit, perSecond)
		}
	}
}
