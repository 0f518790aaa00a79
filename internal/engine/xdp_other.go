//go:build !linux

package engine

import (
	"errors"
	"runtime"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
)

// OpenXDP fails: XDP exists on Linux only.
func OpenXDP(decide.Config, Options) (Engine, error) {
	return nil, errors.New("the XDP program needs Linux, and this is " + runtime.GOOS)
}

// XDPGrant says what gives a process the XDP program.
const XDPGrant = "run on Linux to filter at the driver"
