package packetconn

import (
	"net"
	"net/netip"
)

// The write half of Conn: every write method shows the datagrams to the
// learner in force, then writes them (WriteMsgUDP, quic-go's, GSO batches
// included, WriteMsgUDPAddrPort, WriteTo, WriteToUDP, WriteToUDPAddrPort
// and Write, to the connected address, if any). The raw connection
// SyscallConn returns and File write around the learner; quic-go uses
// neither to write.

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
