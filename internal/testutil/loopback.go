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

// burst is how many datagrams a Flood sends between two pauses unless its
// Burst says otherwise.
const burst = 50

// Flood is a paced, bounded stream of datagrams to one destination.
type Flood struct {
	// From are the sockets to send from, in turn.
	From []*net.UDPConn
	// To is the destination: a loopback address, or fd00::/8.
	To netip.AddrPort
	// Rate is how many datagrams per second all the sockets send together,
	// in bursts of Burst.
	Rate int
	// Burst is how many datagrams are sent between two pauses; 0 means 50.
	// A small burst spreads the datagrams evenly, at more wake-ups.
	Burst int
	// Count is how many datagrams to send at the most.
	Count int
	// For, when not 0, is how long to send at the most.
	For time.Duration
	// Next returns each datagram's payload; it may reuse one buffer.
	Next func() []byte
	// Stamp writes each datagram's send time (see PutStamp) into the last
	// StampSize bytes of a payload of at least StampSize bytes, just before
	// it is sent, so that a Receiver counts it in the second it was sent:
	// on loopback the socket filter runs inside the sender's sendto, so
	// that is the second the filter saw it in, however late the reader
	// gets to it. Only for payloads whose tail the test does not need (a
	// QUIC header is read from the front); Next must not share its buffer
	// with another flood running at the same time.
	Stamp bool
	// Stop, when not nil, ends the flood early once closed: for a flood
	// that must last as long as something else does, however long a
	// loaded machine makes that; Count and For still bound it.
	Stop <-chan struct{}
	// Epoch is the time stamps and Sent.PerSecond count from; the zero
	// time is the flood's start. Floods sent side by side share one, so
	// that their seconds line up.
	Epoch time.Time
}

// Sent is what a Flood sent.
type Sent struct {
	// Total is the number of datagrams sent.
	Total int
	// PerSecond holds the datagrams sent in each second since the epoch:
	// a sender that fell behind on a loaded machine sent fewer in some
	// seconds (and more in a later one, catching up).
	PerSecond []int
}

// SumSent adds what floods sent side by side, second by second (they must
// share an Epoch for their seconds to line up).
func SumSent(sent ...Sent) Sent {
	var out Sent
	for _, s := range sent {
		out.Total += s.Total
		for len(out.PerSecond) < len(s.PerSecond) {
			out.PerSecond = append(out.PerSecond, 0)
		}
		for i, n := range s.PerSecond {
			out.PerSecond[i] += n
		}
	}
	return out
}

// Send sends f's datagrams and returns how many it sent. It refuses a
// destination that Allowed refuses, and a Flood without a positive rate
// and count, before it sends anything.
func (f Flood) Send() (int, error) {
	s, err := f.Run()
	return s.Total, err
}

// Run sends f's datagrams as Send does and returns how many it sent in all
// and in each second.
func (f Flood) Run() (Sent, error) {
	switch {
	case !Allowed(f.To.Addr()):
		return Sent{}, fmt.Errorf("flood: destination %v is neither loopback nor fd00::/8", f.To)
	case f.Rate <= 0:
		return Sent{}, fmt.Errorf("flood: rate %d is not positive", f.Rate)
	case f.Count <= 0:
		return Sent{}, fmt.Errorf("flood: count %d is not positive", f.Count)
	case f.For < 0:
		return Sent{}, fmt.Errorf("flood: duration %v is negative", f.For)
	case len(f.From) == 0:
		return Sent{}, errors.New("flood: no socket to send from")
	case f.Next == nil:
		return Sent{}, errors.New("flood: no payload (Next is nil)")
	}
	size := f.Burst
	if size <= 0 {
		size = burst
	}
	tick := time.Duration(float64(time.Second) * float64(size) / float64(f.Rate))
	start := time.Now()
	epoch := f.Epoch
	if epoch.IsZero() {
		epoch = start
	}
	at := start
	var s Sent
	for s.Total < f.Count && (f.For == 0 || time.Since(start) < f.For) {
		for i := 0; i < size && s.Total < f.Count; i++ {
			b := f.Next()
			since := max(time.Since(epoch), 0)
			if f.Stamp {
				PutStamp(b, since)
			}
			if _, err := f.From[s.Total%len(f.From)].WriteToUDPAddrPort(b, f.To); err != nil {
				return s, fmt.Errorf("flood to %v: %w", f.To, err)
			}
			sec := int(since / time.Second)
			for len(s.PerSecond) <= sec {
				s.PerSecond = append(s.PerSecond, 0)
			}
			s.PerSecond[sec]++
			s.Total++
		}
		at = at.Add(tick)
		select {
		case <-f.Stop: // a nil channel never ends the flood
			return s, nil
		case <-time.After(time.Until(at)):
		}
	}
	return s, nil
}

// Pace sends n datagrams from conn to dst at about rate per second, in
// bursts of 50, then stops; next gives each datagram's payload. It refuses a
// destination Allowed refuses.
func Pace(conn *net.UDPConn, dst netip.AddrPort, rate, n int, next func() []byte) error {
	_, err := Flood{From: []*net.UDPConn{conn}, To: dst, Rate: rate, Count: n, Next: next}.Send()
	return err
}
