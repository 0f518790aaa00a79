package prefilter

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Attach puts prog on the socket of conn with SO_ATTACH_FILTER, replacing
// any classic filter there atomically: no capability is needed to filter
// one's own socket.
func Attach(conn syscall.Conn, prog []bpf.RawInstruction) error {
	if len(prog) == 0 || len(prog) > MaxInstructions {
		return fmt.Errorf("attaching the pre-filter: program of %d instructions out of range [1, %d]", len(prog), MaxInstructions)
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("attaching the pre-filter: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog)
	}); err != nil {
		return fmt.Errorf("attaching the pre-filter: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("attaching the pre-filter (SO_ATTACH_FILTER, %d instructions): %w", len(prog), serr)
	}
	return nil
}

// Detach takes the socket's filter away (SO_DETACH_FILTER); a socket
// without one is not an error.
func Detach(conn syscall.Conn) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("detaching the pre-filter: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
	}); err != nil {
		return fmt.Errorf("detaching the pre-filter: %w", err)
	}
	if serr != nil && !errors.Is(serr, unix.ENOENT) {
		return fmt.Errorf("detaching the pre-filter: %w", serr)
	}
	return nil
}
