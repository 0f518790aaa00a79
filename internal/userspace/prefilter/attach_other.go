//go:build !linux

package prefilter

import (
	"errors"
	"syscall"

	"golang.org/x/net/bpf"
)

// errUnsupported: classic socket filters are attached on Linux only.
var errUnsupported = errors.New("attaching the pre-filter: classic socket filters need Linux")

// Attach fails: the pre-filter needs Linux.
func Attach(syscall.Conn, []bpf.RawInstruction) error { return errUnsupported }

// Detach does nothing.
func Detach(syscall.Conn) error { return nil }
