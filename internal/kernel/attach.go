//go:build linux

package kernel

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Attach attaches the filter to a socket, replacing any filter it had. The
// kernel keeps the program alive while the socket lives, even after Close.
func (f *Program) Attach(conn syscall.Conn) error {
	if err := link.AttachSocketFilter(conn, f.objs.Rakelimit); err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("attaching the rakelimit socket filter: %w: the socket's option memory is exhausted; "+
				"raise net.core.optmem_max (now %s bytes), e.g. sysctl -w net.core.optmem_max=262144",
				err, sysctl("net/core/optmem_max"))
		}
		return fmt.Errorf("attaching the rakelimit socket filter: %w", err)
	}
	return nil
}

// Detach removes whatever socket filter conn has.
func Detach(conn syscall.Conn) error {
	if err := link.DetachSocketFilter(conn); err != nil {
		return fmt.Errorf("detaching the socket filter: %w", err)
	}
	return nil
}
