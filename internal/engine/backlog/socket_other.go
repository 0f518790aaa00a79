//go:build !linux

package backlog

import (
	"errors"
	"net"
	"runtime"
)

// ReadSockets fails: the receive queue is read with SO_MEMINFO, a Linux
// socket option. The total then stays where it starts.
func ReadSockets([]*net.UDPConn) (queued, capacity, drops uint64, err error) {
	return 0, 0, 0, errors.New("reading a socket's receive queue needs Linux, and this is " + runtime.GOOS)
}
