//go:build unix

package rakelimit

import (
	"net"

	"golang.org/x/sys/unix"
)

// sameSocketFile reports whether the file descriptor fd (a socket Caddy was
// handed, network fdgram) is conn's socket: the same device and inode.
func sameSocketFile(fd int, conn *net.UDPConn) bool {
	var want, got unix.Stat_t
	if unix.Fstat(fd, &want) != nil {
		return false
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return false
	}
	var statErr error
	if err := rc.Control(func(cfd uintptr) { statErr = unix.Fstat(int(cfd), &got) }); err != nil || statErr != nil {
		return false
	}
	return want.Dev == got.Dev && want.Ino == got.Ino
}
