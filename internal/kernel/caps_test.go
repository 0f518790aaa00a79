//go:build linux

package kernel

import (
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestToRaise: a thread raises the capabilities it needs that it holds
// permitted and lacks effective, never one it lacks permitted, and
// CAP_SYS_ADMIN in place of one it lacks, when it holds that.
func TestToRaise(t *testing.T) {
	const (
		bpf      = capSet(1 << unix.CAP_BPF)
		perfmon  = capSet(1 << unix.CAP_PERFMON)
		netAdmin = capSet(1 << unix.CAP_NET_ADMIN)
		bind     = capSet(1 << unix.CAP_NET_BIND_SERVICE)
		all      = capSet(1<<(unix.CAP_LAST_CAP+1) - 1)
	)
	tests := []struct {
		name                 string
		effective, permitted capSet
		want, raise          capSet
	}{
		{"root, every capability effective", all, all, loadXDPCaps, 0},
		{"setcap +ep", loadCaps | bind, loadCaps | bind, loadCaps, 0},
		{"setcap +p", 0, loadCaps | bind, loadCaps, loadCaps},
		{"setcap +p, the XDP program's load", 0, loadXDPCaps | bind, loadXDPCaps, loadXDPCaps},
		{"setcap +p, its attach", 0, loadXDPCaps, attachXDPCaps, netAdmin},
		{"one effective, one permitted", bpf, loadCaps, loadCaps, perfmon},
		{"CAP_BPF alone, permitted", 0, bpf, loadCaps, bpf},
		{"no capability", 0, 0, loadCaps, 0},
		{"CAP_SYS_ADMIN permitted", 0, sysAdminCap, loadCaps, sysAdminCap},
		{"CAP_SYS_ADMIN effective", sysAdminCap, sysAdminCap, loadCaps, 0},
		{"CAP_SYS_ADMIN permitted, the others too", 0, sysAdminCap | loadCaps, loadCaps, loadCaps},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := threadCaps{}.withEffective(tt.effective)
			tc.data[0].Permitted, tc.data[1].Permitted = uint32(tt.permitted), uint32(tt.permitted>>32)
			if tc.effective() != tt.effective || tc.permitted() != tt.permitted {
				t.Fatalf("the sets read back as %#x and %#x, want %#x and %#x", tc.effective(), tc.permitted(), tt.effective, tt.permitted)
			}
			if got := tc.toRaise(tt.want); got != tt.raise {
				t.Errorf("toRaise(%v) = %v (%#x), want %v (%#x)", tt.want, got, uint64(got), tt.raise, uint64(tt.raise))
			}
		})
	}
}

// TestCapSetString names the capabilities of a set.
func TestCapSetString(t *testing.T) {
	for _, tt := range []struct {
		s    capSet
		want string
	}{
		{0, ""},
		{loadCaps, "CAP_PERFMON and CAP_BPF"},
		{loadXDPCaps | sysAdminCap, "CAP_NET_ADMIN and CAP_SYS_ADMIN and CAP_PERFMON and CAP_BPF"},
		{1 << unix.CAP_NET_BIND_SERVICE, "capability 10"},
	} {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("%#x: %q, want %q", uint64(tt.s), got, tt.want)
		}
	}
}

// TestWithCapabilities runs withCapabilities on a thread of this process
// (root) with the loader's capabilities effective, as root has them, and
// with them permitted alone, as setcap ...+p gives them: fn runs on that
// thread with them effective either way, and the thread has, after it,
// exactly the capabilities it had before.
func TestWithCapabilities(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tt := range []struct {
		name  string
		lower capSet
	}{
		{"effective", 0},
		{"permitted alone", loadXDPCaps},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			start, err := readThreadCaps()
			if err != nil {
				t.Fatal(err)
			}
			if start.effective()&loadXDPCaps != loadXDPCaps {
				t.Fatalf("root has %#x effective, without all of %v", uint64(start.effective()), loadXDPCaps)
			}
			defer func() {
				if err := start.apply(); err != nil {
					panic(fmt.Sprintf("giving the test's thread its capabilities back: %v", err))
				}
			}()
			before := start.withEffective(start.effective() &^ tt.lower)
			if err := before.apply(); err != nil {
				t.Fatal(err)
			}
			var during threadCaps
			tid := unix.Gettid()
			if err := withCapabilities(loadXDPCaps, func() (err error) {
				if got := unix.Gettid(); got != tid {
					return fmt.Errorf("fn ran on thread %d, the caller's is %d", got, tid)
				}
				during, err = readThreadCaps()
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if got := during.effective() & loadXDPCaps; got != loadXDPCaps {
				t.Errorf("fn ran with %v of %v effective", got, loadXDPCaps)
			}
			if got := during.effective() &^ loadXDPCaps; got != before.effective()&^loadXDPCaps {
				t.Errorf("fn ran with %#x effective besides, the thread had %#x", uint64(got), uint64(before.effective()&^loadXDPCaps))
			}
			after, err := readThreadCaps()
			if err != nil {
				t.Fatal(err)
			}
			if after.effective() != before.effective() || after.permitted() != before.permitted() {
				t.Errorf("after fn the thread has %#x effective and %#x permitted, before %#x and %#x",
					uint64(after.effective()), uint64(after.permitted()), uint64(before.effective()), uint64(before.permitted()))
			}
		})
	}
}
