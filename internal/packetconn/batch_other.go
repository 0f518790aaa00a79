//go:build !linux

package packetconn

import (
	"net"

	"golang.org/x/net/ipv4"
)

// Flags moveMessage would set on a datagram it had to cut; it never runs
// here, where a batch holds one datagram.
const (
	msgTrunc  = 0
	msgCtrunc = 0
)

// newBatchReader returns nil: without recvmmsg a batch is one datagram,
// read by readBatch with the socket's own ReadMsgUDPAddrPort (x/net's
// ReadBatch is not implemented on Windows).
func newBatchReader(*net.UDPConn) *ipv4.PacketConn { return nil }

// readBatch reads one datagram into ms[0], unfiltered, as x/net's ReadBatch
// does outside Linux. flags are ignored: quic-go passes none.
func (c *Conn) readBatch(ms []ipv4.Message, _ int) (int, error) {
	m := &ms[0]
	var b []byte
	if len(m.Buffers) > 0 {
		b = m.Buffers[0]
	}
	n, oobn, flags, src, err := c.UDPConn.ReadMsgUDPAddrPort(b, m.OOB)
	if err != nil && n == 0 {
		return 0, err
	}
	m.N, m.NN, m.Flags, m.Addr = n, oobn, flags, net.UDPAddrFromAddrPort(src)
	return 1, err
}
