//go:build !linux

package rakelimit

import (
	"errors"
	"runtime"
)

// loadKernel fails: BPF socket filters exist on Linux only.
func loadKernel(settings) (engine, error) {
	return nil, errors.New("the BPF socket filter needs Linux, and this is " + runtime.GOOS)
}

// verifierLog is empty: there is no verifier.
func verifierLog(error) []string { return nil }

// kernelGrant says what gives a process the kernel filter.
const kernelGrant = "run on Linux to filter in the kernel"
