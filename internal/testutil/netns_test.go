//go:build linux

package testutil

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestNetNS makes two namespaces joined by a veth pair with fd00::/8
// addresses: a datagram from one reaches a socket in the other over the
// link, and one on a namespace's loopback address its own socket; the test's
// own namespace has neither address; the namespaces are gone when the test
// that made them ends.
func TestNetNS(t *testing.T) {
	RequireRoot(t)
	var names []string
	t.Run("linked", func(t *testing.T) {
		a := NewNetNS(t, "fd00:1::1/128")
		b := NewNetNS(t)
		names = append(names, a.Name(), b.Name())
		a.Link(t, b, "rk0", []string{"fd00:a::1/64"}, []string{"fd00:a::2/64"})
		var from, local, rxLocal, rx *net.UDPConn
		a.Do(t, func() {
			from = Sender(t, netip.MustParseAddrPort("[fd00:a::1]:0"))
			local = Sender(t, netip.MustParseAddrPort("[fd00:1::1]:0"))
			rxLocal = Listen(t, "udp6", "[fd00:1::1]:0")
		})
		b.Do(t, func() { rx = Listen(t, "udp6", "[fd00:a::2]:0") })
		over := netip.AddrPortFrom(netip.MustParseAddr("fd00:a::2"), PortOf(rx))
		// The first datagrams may wait for the link and the neighbour;
		// one that arrives shows the way open.
		buf := make([]byte, 64)
		var got netip.AddrPort
		for deadline := time.Now().Add(5 * time.Second); ; {
			if err := Pace(from, over, 10_000, 1, func() []byte { return []byte("hello") }); err != nil {
				t.Fatal(err)
			}
			rx.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			_, src, err := rx.ReadFromUDPAddrPort(buf)
			if err == nil {
				got = src
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("nothing from fd00:a::1 reached fd00:a::2 over the link: %v", err)
			}
		}
		if got.Addr() != netip.MustParseAddr("fd00:a::1") {
			t.Errorf("datagram from %v, want fd00:a::1", got)
		}
		if err := Pace(local, netip.AddrPortFrom(netip.MustParseAddr("fd00:1::1"), PortOf(rxLocal)), 10_000, 1,
			func() []byte { return []byte("hello") }); err != nil {
			t.Fatal(err)
		}
		rxLocal.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, src, err := rxLocal.ReadFromUDPAddrPort(buf); err != nil || src.Addr() != netip.MustParseAddr("fd00:1::1") {
			t.Errorf("on the namespace's loopback: from %v, %v", src, err)
		}
		for _, addr := range []string{"[fd00:a::1]:0", "[fd00:1::1]:0"} {
			c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
			if err == nil {
				c.Close()
				t.Errorf("the test's own namespace has %s", addr)
			} else if !errors.Is(err, syscall.EADDRNOTAVAIL) {
				t.Errorf("binding %s outside the namespace: %v, want EADDRNOTAVAIL", addr, err)
			}
		}
	})
	for _, name := range names {
		if _, err := os.Stat("/var/run/netns/" + name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still there after its test: %v", name, err)
		}
	}
}

// TestJoinNetNS: a namespace another process made is joined by its name:
// entered, it is that namespace (its address binds), and closing it when
// the test that joined it ends leaves it to its maker.
func TestJoinNetNS(t *testing.T) {
	RequireRoot(t)
	made := NewNetNS(t, "fd00:2::1/128")
	t.Run("joined", func(t *testing.T) {
		joined := JoinNetNS(t, made.Name())
		joined.Do(t, func() { Listen(t, "udp6", "[fd00:2::1]:0") })
	})
	if _, err := os.Stat("/var/run/netns/" + made.Name()); err != nil {
		t.Errorf("namespace %s gone after the test that joined it: %v", made.Name(), err)
	}
}
