package testutil

import (
	"errors"
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
	c, err := bind(src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// bind opens a UDP socket of src's family bound to src.
func bind(src netip.AddrPort) (*net.UDPConn, error) {
	network := "udp4"
	if src.Addr().Is6() {
		network = "udp6"
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(src))
	if err != nil {
		return nil, fmt.Errorf("bind sender %v: %w", src, err)
	}
	return c, nil
}

// Allowed reports whether a test may send to dst: a loopback address or an
// IPv6 ULA address.
func Allowed(dst netip.Addr) bool {
	dst = dst.Unmap()
	return dst.IsLoopback() || (dst.Is6() && ula.Contains(dst))
}

// LoopbackFor is the loopback address of src's family (127.0.0.1 or ::1)
// with port: where a socket bound to src reaches a test's listener.
func LoopbackFor(src netip.Addr, port uint16) netip.AddrPort {
	if src.Unmap().Is4() {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port)
	}
	return netip.AddrPortFrom(netip.IPv6Loopback(), port)
}

// PortOf is the local port of a socket.
func PortOf(c *net.UDPConn) uint16 { return c.LocalAddr().(*net.UDPAddr).AddrPort().Port() }

// burst is how many datagrams a Flood sends between two pauses.
const burst = 50

// Flood is a paced, bounded stream of datagrams to one destination.
type Flood struct {
	// From are the sockets to send from, in turn.
	From []*net.UDPConn
	// To is the destination: a loopback address, or fd00::/8.
	To netip.AddrPort
	// Rate is how many datagrams per second all the sockets send together,
	// in bursts of 50.
	Rate int
	// Count is how many datagrams to send at the most.
	Count int
	// For, when not 0, is how long to send at the most.
	For time.Duration
	// Next returns each datagram's payload; it may reuse one buffer.
	Next func() []byte
}

// Send sends f's datagrams and returns how many it sent. It refuses a
// destination that Allowed refuses, and a Flood without a positive rate
// and count, before it sends anything.
func (f Flood) Send() (int, error) {
	switch {
	case !Allowed(f.To.Addr()):
		return 0, fmt.Errorf("flood: destination %v is neither loopback nor fd00::/8", f.To)
	case f.Rate <= 0:
		return 0, fmt.Errorf("flood: rate %d is not positive", f.Rate)
	case f.Count <= 0:
		return 0, fmt.Errorf("flood: count %d is not positive", f.Count)
	case f.For < 0:
		return 0, fmt.Errorf("flood: duration %v is negative", f.For)
	case len(f.From) == 0:
		return 0, errors.New("flood: no socket to send from")
	case f.Next == nil:
		return 0, errors.New("flood: no payload (Next is nil)")
	}
	tick := time.Duration(float64(time.Second) * burst / float64(f.Rate))
	start := time.Now()
	at := start
	sent := 0
	for sent < f.Count && (f.For == 0 || time.Since(start) < f.For) {
		for i := 0; i < burst && sent < f.Count; i++ {
			if _, err := f.From[sent%len(f.From)].WriteToUDPAddrPort(f.Next(), f.To); err != nil {
				return sent, fmt.Errorf("flood to %v: %w", f.To, err)
			}
			sent++
		}
		at = at.Add(tick)
		time.Sleep(time.Until(at))
	}
	return sent, nil
}

// Pace sends n datagrams from conn to dst at about rate per second, in
// bursts of 50, then stops; next gives each datagram's payload. It refuses a
// destination Allowed refuses.
func Pace(conn *net.UDPConn, dst netip.AddrPort, rate, n int, next func() []byte) error {
	_, err := Flood{From: []*net.UDPConn{conn}, To: dst, Rate: rate, Count: n, Next: next}.Send()
	return err
}
