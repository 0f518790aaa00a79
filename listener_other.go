//go:build !linux

package rakelimit

import (
	"errors"
	"net"

	"github.com/caddyserver/caddy/v2"
)

type state struct{}

// Provision refuses to run: BPF socket filters exist on Linux only, and a
// listener must never be served unprotected while the config says otherwise.
func (r *RakeLimit) Provision(caddy.Context) error {
	return errors.New("rakelimit requires Linux: it protects listeners with a BPF socket filter")
}

// Cleanup does nothing.
func (r *RakeLimit) Cleanup() error { return nil }

// WrapPacketConn is never reached: Provision fails.
func (r *RakeLimit) WrapPacketConn(pc net.PacketConn) net.PacketConn { return pc }
