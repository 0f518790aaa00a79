//go:build linux

package kernel

import (
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// capSet is a set of Linux capabilities: bit n is capability n
// (unix.CAP_BPF and so on).
type capSet uint64

// The capabilities each privileged step needs in the effective set of the
// thread that makes its system calls: loading the socket filter and its
// maps (the verifier accepts this program's pointer arithmetic only with
// CAP_PERFMON), loading them with the XDP program (a program type of
// CAP_NET_ADMIN), and attaching the XDP program to an interface. Linux
// 6.18 checks no capability when the XDP program's link is created (its
// load checked CAP_NET_ADMIN; TestLeastPrivilegeXDP passes with nothing
// raised there): CAP_NET_ADMIN is raised for it all the same, for a
// kernel or a security module that checks it.
const (
	loadCaps      capSet = 1<<unix.CAP_BPF | 1<<unix.CAP_PERFMON
	loadXDPCaps   capSet = loadCaps | 1<<unix.CAP_NET_ADMIN
	attachXDPCaps capSet = 1 << unix.CAP_NET_ADMIN
	// sysAdminCap stands, to the kernel, for each of the others.
	sysAdminCap capSet = 1 << unix.CAP_SYS_ADMIN
)

// String names the capabilities of s, joined by "and".
func (s capSet) String() string {
	var names []string
	for c := range 64 {
		if s&(1<<c) == 0 {
			continue
		}
		switch c {
		case unix.CAP_BPF:
			names = append(names, "CAP_BPF")
		case unix.CAP_PERFMON:
			names = append(names, "CAP_PERFMON")
		case unix.CAP_NET_ADMIN:
			names = append(names, "CAP_NET_ADMIN")
		case unix.CAP_SYS_ADMIN:
			names = append(names, "CAP_SYS_ADMIN")
		default:
			names = append(names, fmt.Sprintf("capability %d", c))
		}
	}
	return strings.Join(names, " and ")
}

// threadCaps are the capabilities of the calling thread, as capget returns
// them, with the header that capset takes back.
type threadCaps struct {
	hdr  unix.CapUserHeader
	data [2]unix.CapUserData
}

// readThreadCaps reads the calling thread's capabilities.
func readThreadCaps() (threadCaps, error) {
	tc := threadCaps{hdr: unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}}
	if err := unix.Capget(&tc.hdr, &tc.data[0]); err != nil {
		return threadCaps{}, fmt.Errorf("reading the thread's capabilities: %w", err)
	}
	return tc, nil
}

func (tc threadCaps) effective() capSet {
	return capSet(tc.data[0].Effective) | capSet(tc.data[1].Effective)<<32
}

func (tc threadCaps) permitted() capSet {
	return capSet(tc.data[0].Permitted) | capSet(tc.data[1].Permitted)<<32
}

// withEffective is tc with the effective set s.
func (tc threadCaps) withEffective(s capSet) threadCaps {
	tc.data[0].Effective, tc.data[1].Effective = uint32(s), uint32(s>>32)
	return tc
}

// apply sets the calling thread's capabilities to tc.
func (tc threadCaps) apply() error {
	hdr := tc.hdr
	return unix.Capset(&hdr, &tc.data[0])
}

// toRaise is what a thread with the capabilities tc raises to hold want in
// its effective set: those of want it holds permitted but not effective,
// and CAP_SYS_ADMIN, which stands for all of them to the kernel, when it
// holds it permitted and lacks one of want there.
func (tc threadCaps) toRaise(want capSet) capSet {
	eff, perm := tc.effective(), tc.permitted()
	raise := want & perm &^ eff
	if want&^perm != 0 && perm&sysAdminCap != 0 {
		raise |= sysAdminCap &^ eff
	}
	return raise
}

// withCapabilities runs fn with the capabilities of want that the process
// holds (permitted) raised into the effective set of the thread fn runs
// on, and afterwards gives that thread back the effective set it had, no
// more and no less: a process that holds them permitted alone (setcap
// ...+p) has them effective only while fn runs, and one that has them
// effective already (root, setcap ...+ep, ambient capabilities) keeps
// them. Linux keeps capabilities per thread, so fn runs on the calling
// goroutine locked to its thread (which keeps the rest of the thread's
// state, its network namespace among it), and must make the system calls
// that need them on that goroutine: the BPF library spawns none to load
// or attach. A thread whose capabilities cannot be lowered again stays
// locked to the calling goroutine, so that no other goroutine runs on it,
// and the error says so. Capabilities the process lacks are the kernel's
// to refuse: fn runs without them. A refusal to raise them (a seccomp
// filter on capset) is returned, fn not run.
func withCapabilities(want capSet, fn func() error) error {
	runtime.LockOSThread()
	restored, err := raised(want, fn)
	if restored {
		runtime.UnlockOSThread()
	}
	return err
}

// raised is withCapabilities on the locked thread: whether the thread has
// the capabilities it had before, and fn's error.
func raised(want capSet, fn func() error) (bool, error) {
	before, err := readThreadCaps()
	if err != nil {
		return true, fn()
	}
	raise := before.toRaise(want)
	if raise == 0 {
		return true, fn()
	}
	if err := before.withEffective(before.effective() | raise).apply(); err != nil {
		// A failed capset leaves the thread's capabilities as they were.
		return true, fmt.Errorf("raising %v into the effective set: %w", raise, err)
	}
	err = fn()
	if lerr := before.apply(); lerr != nil {
		lerr = fmt.Errorf("lowering %v from the effective set again: %w", raise, lerr)
		if err != nil {
			lerr = fmt.Errorf("%w; and %w", err, lerr)
		}
		return false, lerr
	}
	return true, err
}
