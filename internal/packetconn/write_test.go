//go:build linux

package packetconn

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn/learntest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// Server IDs, and the client's ID, of the datagrams written.
var (
	idA    = learn.ServerID{0xaa, 0xaa, 0xaa, 0x01}
	idB    = learn.ServerID{0xbb, 0xbb, 0xbb, 0x02}
	client = []byte{1, 2, 3, 4, 5, 6, 7, 8}
)

// Long header packet types, as QUIC v1 numbers them.
const (
	typeInitial   = 0
	typeHandshake = 2
)

// handshakeTo is a Handshake packet from the server's ID id.
func handshakeTo(id learn.ServerID) []byte {
	return quicclasstest.AppendLongPacket(nil, quicclass.Version1, typeHandshake, client[:4], id[:], nil, 100)
}

// cmsg is a control message of level and type with data, as the kernel
// lays it out.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

// cmsgTOS is the control message of an ECN-marked datagram (ECT(0)).
func cmsgTOS() []byte { return cmsg(unix.IPPROTO_IP, unix.IP_TOS, []byte{2, 0, 0, 0}) }

// segmentMsg is the UDP_SEGMENT message of a GSO batch of size-byte
// segments, as quic-go writes it.
func segmentMsg(size uint16) []byte {
	return cmsg(unix.IPPROTO_UDP, unix.UDP_SEGMENT, binary.NativeEndian.AppendUint16(nil, size))
}

// newWriter wraps sock with a learner teaching a new sink.
func newWriter(t testing.TB, sock *net.UDPConn) (*Conn, *learntest.Sink) {
	t.Helper()
	sink, l := learntest.NewLearner(t)
	c, err := New(sock)
	if err != nil {
		t.Fatal(err)
	}
	c.SetLearner(l)
	return c, sink
}

// writeMethods are every way to write a datagram through a Conn; connected
// ones write on a connected socket, to its address.
var writeMethods = []struct {
	name      string
	connected bool
	write     func(c *Conn, b []byte, to netip.AddrPort) error
}{
	{"Write", true, func(c *Conn, b []byte, _ netip.AddrPort) error {
		_, err := c.Write(b)
		return err
	}},
	{"WriteTo", false, func(c *Conn, b []byte, to netip.AddrPort) error {
		_, err := c.WriteTo(b, net.UDPAddrFromAddrPort(to))
		return err
	}},
	{"WriteToUDP", false, func(c *Conn, b []byte, to netip.AddrPort) error {
		_, err := c.WriteToUDP(b, net.UDPAddrFromAddrPort(to))
		return err
	}},
	{"WriteToUDPAddrPort", false, func(c *Conn, b []byte, to netip.AddrPort) error {
		_, err := c.WriteToUDPAddrPort(b, to)
		return err
	}},
	{"WriteMsgUDP", false, func(c *Conn, b []byte, to netip.AddrPort) error {
		_, _, err := c.WriteMsgUDP(b, nil, net.UDPAddrFromAddrPort(to))
		return err
	}},
	{"WriteMsgUDP connected", true, func(c *Conn, b []byte, _ netip.AddrPort) error {
		_, _, err := c.WriteMsgUDP(b, nil, nil)
		return err
	}},
	{"WriteMsgUDPAddrPort", false, func(c *Conn, b []byte, to netip.AddrPort) error {
		_, _, err := c.WriteMsgUDPAddrPort(b, nil, to)
		return err
	}},
}

// TestEveryWriteTeaches: each write method teaches the learner the ID and
// the peer of a datagram, then sends it; and the list above holds every
// write method of *net.UDPConn, so that none writes around the learner.
func TestEveryWriteTeaches(t *testing.T) {
	tested := map[string]bool{}
	for _, m := range writeMethods {
		tested[strings.Fields(m.name)[0]] = true
	}
	ty := reflect.TypeFor[*net.UDPConn]()
	for i := range ty.NumMethod() {
		if name := ty.Method(i).Name; strings.HasPrefix(name, "Write") && !tested[name] {
			t.Errorf("*net.UDPConn has %s, which no test shows teaching", name)
		}
	}
	for _, m := range writeMethods {
		t.Run(m.name, func(t *testing.T) {
			rx := testutil.Listen(t, "udp4", "127.0.0.1:0")
			to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
			var sock *net.UDPConn
			if m.connected {
				var err error
				sock, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sock.Close() })
			} else {
				sock = testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
			}
			c, sink := newWriter(t, sock)
			want := handshakeTo(idA)
			if err := m.write(c, want, to); err != nil {
				t.Fatal(err)
			}
			if ids, peers := sink.Times(idA, to.Addr()); ids != 1 || peers != 1 {
				t.Fatalf("taught the ID %d times and the peer %d times, want once each", ids, peers)
			}
			rx.SetReadDeadline(time.Now().Add(2 * time.Second))
			got := make([]byte, 1500)
			n, err := rx.Read(got)
			if err != nil || !bytes.Equal(got[:n], want) {
				t.Fatalf("received %d bytes (%v), want the datagram written", n, err)
			}
		})
	}
}

// TestConnLearner: Unwrap returns the socket; with no learner a Conn writes
// and teaches nothing.
func TestConnLearner(t *testing.T) {
	sock := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	sink, l := learntest.NewLearner(t)
	c, err := New(sock)
	if err != nil {
		t.Fatal(err)
	}
	if c.Unwrap() != net.PacketConn(sock) || c.Learner() != nil {
		t.Fatal("Unwrap is not the socket, or a learner is set")
	}
	to := sock.LocalAddr().(*net.UDPAddr).AddrPort()
	if _, err := c.WriteToUDPAddrPort(handshakeTo(idA), to); err != nil {
		t.Fatal(err)
	}
	c.SetLearner(l)
	if c.Learner() != l {
		t.Fatal("Learner is not the one set")
	}
	if _, err := c.WriteToUDPAddrPort(handshakeTo(idB), to); err != nil {
		t.Fatal(err)
	}
	if ids := sink.IDs(); len(ids) != 1 || ids[0].ID != idB {
		t.Fatalf("taught %v, want only the ID written with the learner set", ids)
	}
}

// TestConnWritesAllocateNothingMore: a write through a Conn allocates what
// the socket's own write does, no more.
func TestConnWritesAllocateNothingMore(t *testing.T) {
	rx := testutil.Listen(t, "udp4", "127.0.0.1:0")
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	go func() { // drain, so that the writes never wait
		b := make([]byte, 1500)
		for {
			if _, err := rx.Read(b); err != nil {
				return
			}
		}
	}()
	sock := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	c, _ := newWriter(t, sock)
	b := quicclasstest.ShortHeader(1200)
	oob := cmsgTOS()
	udpTo := net.UDPAddrFromAddrPort(to)
	c.WriteMsgUDP(b, oob, udpTo)
	plain := testing.AllocsPerRun(200, func() { sock.WriteMsgUDP(b, oob, udpTo) })
	wrapped := testing.AllocsPerRun(200, func() { c.WriteMsgUDP(b, oob, udpTo) })
	if wrapped > plain {
		t.Fatalf("WriteMsgUDP allocates %.1f times through the Conn, %.1f on the socket", wrapped, plain)
	}
}
