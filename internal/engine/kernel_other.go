//go:build !linux

package engine

import (
	"errors"
	"runtime"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
)

// OpenKernel fails: BPF socket filters exist on Linux only.
func OpenKernel(decide.Config, Options) (Engine, error) {
	return nil, errors.New("the BPF socket filter needs Linux, and this is " + runtime.GOOS)
}

// VerifierLog is empty: there is no verifier.
func VerifierLog(error) []string { return nil }

// KernelGrant says what gives a process the kernel filter.
const KernelGrant = "run on Linux to filter in the kernel"
