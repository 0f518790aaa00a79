//go:build linux

package engine

import (
	"errors"
	"fmt"
	"net"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
)

// kernelEngine is the BPF socket filter.
type kernelEngine struct{ *kernel.Program }

// OpenKernel loads the BPF socket filter for c.
func OpenKernel(c decide.Config, o Options) (Engine, error) {
	f, err := kernel.Load(c, o.HashKey)
	if err != nil {
		return nil, err
	}
	return kernelEngine{f}, nil
}

// Kernel returns the BPF filter e runs on, if it is one (mode bpf or xdp).
func Kernel(e Engine) (*kernel.Program, bool) {
	switch k := e.(type) {
	case kernelEngine:
		return k.Program, true
	case *xdpEngine:
		return k.Program, true
	}
	return nil, false
}

func (kernelEngine) Mode() string { return ModeBPF }

func (k kernelEngine) Events() (EventReader, error) { return k.Program.Events() }

// Protect attaches the filter to the socket; read, the conn quic-go reads
// through, passes every datagram, since the kernel has decided them.
func (k kernelEngine) Protect(conn *net.UDPConn, _ ReadConn) error {
	return k.Attach(conn)
}

// Unprotect detaches whatever socket filter the socket has.
func (kernelEngine) Unprotect(conn *net.UDPConn) (bool, error) {
	if err := kernel.Detach(conn); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// VerifierLog is the kernel verifier's log of a failed load, which the
// one-line error leaves out.
func VerifierLog(err error) []string {
	var le *kernel.LoadError
	if errors.As(err, &le) {
		return le.VerifierLog
	}
	return nil
}

// KernelGrant says what gives a process the kernel filter.
var KernelGrant = fmt.Sprintf("grant CAP_BPF and CAP_PERFMON (setcap cap_bpf,cap_perfmon,cap_net_bind_service+p on the binary, "+
	"AmbientCapabilities under systemd, --cap-add BPF --cap-add PERFMON in Docker; see Privileges in the README) %s",
	"to filter in the kernel")
