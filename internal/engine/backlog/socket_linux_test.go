//go:build linux

package backlog

import (
	"net"
	"testing"
)

// TestReadSockets: a socket nobody reads fills its queue with what is sent
// to it, then drops; ReadSockets sees both, and a controller fed from it
// lowers the total.
func TestReadSockets(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := rx.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	q0, capacity, d0, err := ReadSockets([]*net.UDPConn{rx})
	if err != nil || q0 != 0 || capacity == 0 {
		t.Fatalf("an idle socket: queued %d of %d, %v", q0, capacity, err)
	}
	c := NewController(DefaultLaw, Unlimited)
	c.Step(Sample{At: 1})
	payload := make([]byte, 1200)
	// 64 KiB of receive buffer holds a few dozen 1,200-byte datagrams
	// (each is charged its whole buffer): 2,000 overflow it whatever the
	// machine's speed, and the loopback send is bounded.
	const sent = 2000
	for range sent {
		if _, err := tx.Write(payload); err != nil {
			t.Fatal(err)
		}
	}
	q1, capacity, d1, err := ReadSockets([]*net.UDPConn{rx})
	if err != nil {
		t.Fatal(err)
	}
	if q1 == 0 || d1-d0 == 0 || q1 > capacity+capacity/2 {
		t.Fatalf("after %d datagrams: queued %d of %d, drops +%d", sent, q1, capacity, d1-d0)
	}
	got, changed := c.Step(Sample{At: 1 + Period, Queued: q1, Capacity: capacity, Overflows: d1 - d0, Passed: sent})
	if !changed || got == Unlimited {
		t.Fatalf("the controller kept the total at %d with the queue full", got)
	}
	rx.Close()
	if _, _, _, err := ReadSockets([]*net.UDPConn{rx}); err != nil {
		t.Fatalf("a closed socket: %v, want it skipped", err)
	}
}
