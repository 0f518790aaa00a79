package testutil

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
)

// Required reports whether tests that need privileges or tools must run:
// in CI (CI=true) or when RAKELIMIT_REQUIRE_BPF=1, a missing privilege or
// tool fails a test instead of skipping it.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("RAKELIMIT_REQUIRE_BPF") == "1"
}

// SkipOrFail skips t, or fails it when Required.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf(format, args...)
		return
	}
	t.Skipf(format, args...)
}

// RequireBPF skips t, or fails it when Required, if err, what loading a BPF
// program returned, says that this process may not load BPF here (EPERM)
// or that the kernel lacks what the program needs. Any other error, and
// nil, it leaves to the caller.
func RequireBPF(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, syscall.EPERM) || errors.Is(err, ebpf.ErrNotSupported) {
		SkipOrFail(t, "cannot load BPF here: %v", err)
	}
}

// RequireRoot skips t, or fails it when Required, unless the process runs
// as root: tests that load BPF in Caddy, or drop privileges, need it.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root (CAP_BPF, CAP_PERFMON, and privileges to drop)")
	}
}
