package learn

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// segmentSize returns the segment size of a GSO batch from its control
// messages oob (the UDP_SEGMENT message quic-go adds when it sends several
// datagrams of one size in one write), or 0 if oob has none. It allocates
// nothing.
func segmentSize(oob []byte) int {
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return 0
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_SEGMENT && len(data) >= 2 {
			return int(binary.NativeEndian.Uint16(data))
		}
		oob = rest
	}
	return 0
}
