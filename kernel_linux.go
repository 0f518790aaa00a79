//go:build linux

package rakelimit

import (
	"errors"
	"fmt"
	"net"

	"github.com/rakelimit/caddy-rakelimit/bpf"
	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
)

// kernelEngine is the BPF socket filter.
type kernelEngine struct{ *bpf.Filter }

// loadKernel loads the BPF socket filter for s.
func loadKernel(s settings) (engine, error) {
	f, err := bpf.Load(datagram.Config(s))
	if err != nil {
		return nil, err
	}
	return kernelEngine{f}, nil
}

func (kernelEngine) mode() string { return ModeBPF }

func (k kernelEngine) events() (eventReader, error) { return k.Events() }

// protect attaches the filter to the socket and returns the socket itself,
// a *net.UDPConn, so that quic-go keeps its fast path (batched reads, GSO,
// ECN, path MTU discovery).
func (k kernelEngine) protect(conn *net.UDPConn) (net.PacketConn, error) {
	if err := k.Attach(conn); err != nil {
		return nil, err
	}
	return conn, nil
}

// unprotect detaches whatever socket filter the socket has.
func (kernelEngine) unprotect(conn *net.UDPConn) (bool, error) {
	if err := bpf.Detach(conn); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// verifierLog is the kernel verifier's log of a failed load, which the
// one-line error leaves out.
func verifierLog(err error) []string {
	var le *bpf.LoadError
	if errors.As(err, &le) {
		return le.VerifierLog
	}
	return nil
}

// kernelGrant says what gives a process the kernel filter.
var kernelGrant = fmt.Sprintf("grant CAP_BPF and CAP_PERFMON (setcap cap_bpf,cap_perfmon,cap_net_bind_service+ep on the binary, "+
	"AmbientCapabilities under systemd, --cap-add BPF --cap-add PERFMON in Docker; see Privileges in the README) %s",
	"to filter in the kernel")
