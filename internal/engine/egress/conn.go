package egress

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/quic-go/quic-go"
)

// Conn is the packet conn quic-go writes through: the listener's
// *net.UDPConn, with every datagram written shown to a Learner first.
//
// Every write method reports and then writes: WriteMsgUDP (quic-go's, GSO
// batches included), WriteMsgUDPAddrPort, WriteTo, WriteToUDP,
// WriteToUDPAddrPort and Write (to the connected address, if any). All else
// is the embedded socket's, so quic-go keeps its whole fast path: Conn is a
// quic.OOBCapablePacketConn and a net.Conn, so quic-go reads it in batches
// (x/net's recvmmsg through SyscallConn), reads ECN marks and packet info,
// and writes GSO batches, ECN marks and the don't-fragment bit through
// WriteMsgUDP and the socket's options. The raw connection SyscallConn
// returns and File write around the Learner; quic-go uses neither to write.
type Conn struct {
	*net.UDPConn
	learner atomic.Pointer[Learner]
}

// Interface guards: quic-go keeps its fast path only for a conn with these
// (quic-go's sys_conn.go, newConn in sys_conn_oob.go), and Caddy and this
// module find the socket under a wrapper through Unwrap.
var (
	_ quic.OOBCapablePacketConn            = (*Conn)(nil)
	_ net.Conn                             = (*Conn)(nil)
	_ interface{ Unwrap() net.PacketConn } = (*Conn)(nil)
)

// NewConn wraps conn so that every datagram written through it is shown to
// l first. A nil l learns nothing (see SetLearner).
func NewConn(conn *net.UDPConn, l *Learner) (*Conn, error) {
	if conn == nil {
		return nil, errors.New("wrapping a packet conn for the egress learner: no UDP socket")
	}
	c := &Conn{UDPConn: conn}
	c.learner.Store(l)
	return c, nil
}

// Unwrap returns the socket, a *net.UDPConn.
func (c *Conn) Unwrap() net.PacketConn { return c.UDPConn }

// Learner returns the learner in force, or nil.
func (c *Conn) Learner() *Learner { return c.learner.Load() }

// SetLearner puts l in force from the next write on; nil learns nothing.
func (c *Conn) SetLearner(l *Learner) { c.learner.Store(l) }

// learn shows the learner in force the datagrams b about to be written to
// to with the control messages oob.
func (c *Conn) learn(b, oob []byte, to netip.AddrPort) {
	if l := c.learner.Load(); l != nil {
		l.Learn(b, oob, to)
	}
}

// connected returns the address of a connected socket, or the zero
// AddrPort.
func (c *Conn) connected() netip.AddrPort {
	if a, ok := c.UDPConn.RemoteAddr().(*net.UDPAddr); ok {
		return a.AddrPort()
	}
	return netip.AddrPort{}
}

// orConnected returns to, or if it is not valid (a write with no address,
// on a connected socket) the connected address.
func (c *Conn) orConnected(to netip.AddrPort) netip.AddrPort {
	if to.IsValid() {
		return to
	}
	return c.connected()
}

// WriteMsgUDP reports b to the learner, then writes it with its control
// messages, as quic-go does (a GSO batch when oob has UDP_SEGMENT).
func (c *Conn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error) {
	c.learn(b, oob, c.orConnected(addr.AddrPort()))
	return c.UDPConn.WriteMsgUDP(b, oob, addr)
}

// WriteMsgUDPAddrPort reports b to the learner, then writes it with its
// control messages.
func (c *Conn) WriteMsgUDPAddrPort(b, oob []byte, addr netip.AddrPort) (n, oobn int, err error) {
	c.learn(b, oob, c.orConnected(addr))
	return c.UDPConn.WriteMsgUDPAddrPort(b, oob, addr)
}

// WriteTo reports b to the learner, then writes it to addr.
func (c *Conn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if a, ok := addr.(*net.UDPAddr); ok {
		c.learn(b, nil, a.AddrPort())
	}
	return c.UDPConn.WriteTo(b, addr)
}

// WriteToUDP reports b to the learner, then writes it to addr.
func (c *Conn) WriteToUDP(b []byte, addr *net.UDPAddr) (int, error) {
	c.learn(b, nil, addr.AddrPort())
	return c.UDPConn.WriteToUDP(b, addr)
}

// WriteToUDPAddrPort reports b to the learner, then writes it to addr.
func (c *Conn) WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	c.learn(b, nil, addr)
	return c.UDPConn.WriteToUDPAddrPort(b, addr)
}

// Write reports b to the learner, then writes it to the connected address.
func (c *Conn) Write(b []byte) (int, error) {
	c.learn(b, nil, c.connected())
	return c.UDPConn.Write(b)
}
