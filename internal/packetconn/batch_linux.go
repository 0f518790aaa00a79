package packetconn

import (
	"net"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// Flags moveMessage sets on a datagram it had to cut.
const (
	msgTrunc  = unix.MSG_TRUNC
	msgCtrunc = unix.MSG_CTRUNC
)

// newBatchReader returns the batch reader of conn: x/net's, which reads with
// recvmmsg on the socket, as quic-go's own reader would.
func newBatchReader(conn *net.UDPConn) *ipv4.PacketConn { return ipv4.NewPacketConn(conn) }

// readBatch reads a batch of datagrams from the socket, unfiltered.
func (c *Conn) readBatch(ms []ipv4.Message, flags int) (int, error) {
	return c.batch.ReadBatch(ms, flags)
}
