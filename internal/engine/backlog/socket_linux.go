//go:build linux

package backlog

import (
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ReadSockets sums the receive queues of conns: the bytes queued, the
// queues' capacity and the datagrams the kernel dropped (SO_MEMINFO). A
// socket filter's drops count among the latter: the caller subtracts its
// own.
func ReadSockets(conns []*net.UDPConn) (queued, capacity, drops uint64, err error) {
	for _, c := range conns {
		var m [unix.SK_MEMINFO_VARS]uint32
		rc, err := c.SyscallConn()
		if err != nil {
			return 0, 0, 0, fmt.Errorf("reading the receive queue: %w", err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			size := uint32(unsafe.Sizeof(m))
			_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
				uintptr(unsafe.Pointer(&m[0])), uintptr(unsafe.Pointer(&size)), 0)
			if e != 0 {
				serr = e
			}
		}); err != nil {
			continue // closed since: the caller forgets it
		}
		if serr != nil {
			return 0, 0, 0, fmt.Errorf("reading the receive queue (SO_MEMINFO): %w", serr)
		}
		queued += uint64(m[unix.SK_MEMINFO_RMEM_ALLOC])
		capacity += uint64(m[unix.SK_MEMINFO_RCVBUF])
		drops += uint64(m[unix.SK_MEMINFO_DROPS])
	}
	return queued, capacity, drops, nil
}
