package testutil

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
)

// TestRequireBPF: a missing privilege or kernel feature skips, or fails
// where BPF tests are required; nil and other errors are the caller's.
func TestRequireBPF(t *testing.T) {
	eperm := fmt.Errorf("load program: %w", syscall.EPERM)
	tests := []struct {
		name, ci, require string
		err               error
		wantSkip, wantErr bool
	}{
		{"EPERM", "", "", eperm, true, false},
		{"EPERM in CI", "true", "", eperm, false, true},
		{"EPERM, required", "", "1", eperm, false, true},
		{"not supported", "", "", fmt.Errorf("map: %w", ebpf.ErrNotSupported), true, false},
		{"CI=false", "false", "", eperm, true, false},
		{"loaded", "true", "", nil, false, false},
		{"a verifier error is the caller's", "true", "", errors.New("invalid argument"), false, false},
		{"EACCES is not EPERM", "", "", syscall.EACCES, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			t.Setenv("RAKELIMIT_REQUIRE_BPF", tt.require)
			r := &recorder{TB: t}
			RequireBPF(r, tt.err)
			if (r.skips > 0) != tt.wantSkip || (r.errors > 0) != tt.wantErr {
				t.Errorf("RequireBPF(%v): %d skips, %d failures; want skip %v, failure %v", tt.err, r.skips, r.errors, tt.wantSkip, tt.wantErr)
			}
		})
	}
}
