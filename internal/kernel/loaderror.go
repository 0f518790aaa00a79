//go:build linux

package kernel

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// LoadError is the kernel's refusal to load the filter. Its message is one
// line that names the cause and what to do; the verifier's log, which can
// run to thousands of lines, is kept apart for the caller to log at DEBUG.
type LoadError struct {
	msg string
	// VerifierLog is the kernel verifier's log, when it produced one.
	VerifierLog []string
	err         error
}

// Error returns the one-line explanation.
func (e *LoadError) Error() string { return e.msg }

// Unwrap returns the kernel's error number (or the library's error when
// there is none), so that errors.Is(err, unix.EPERM) holds.
func (e *LoadError) Unwrap() error { return e.err }

// explainLoad turns the kernel's refusal into a one-line error that says
// what to do. It leaves out the BPF library's RLIMIT_MEMLOCK hint: from
// Linux 5.11 BPF memory is charged to the memory cgroup, not to MEMLOCK, and
// the filter needs a later kernel (MinKernel).
func explainLoad(err error) error {
	return explain(err, missingCapabilities())
}

// explain is explainLoad for a process that lacks the capabilities missing.
func explain(err error, missing []string) error {
	e := &LoadError{err: err}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		e.VerifierLog = ve.Log
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		e.err = errno
	}
	const what = "loading the rakelimit BPF socket filter"
	switch {
	case len(missing) > 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)):
		e.msg = fmt.Sprintf("%s: %v: the process lacks %s (it needs CAP_BPF and CAP_PERFMON); grant them with "+
			"`setcap cap_bpf,cap_perfmon,cap_net_bind_service+p %s` or, under systemd, "+
			"AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_BIND_SERVICE (see Privileges in the README)",
			what, e.err, strings.Join(missing, " and "), executable())
	case ve != nil:
		e.msg = fmt.Sprintf("%s: the verifier of Linux %s rejected it (%v): %s (the whole log is at DEBUG level; "+
			"the filter needs Linux %s or later)", what, kernelRelease(), e.err, lastLine(ve.Log), MinKernel)
	case errors.Is(err, unix.EPERM):
		e.msg = fmt.Sprintf("%s: %v although the process has CAP_BPF and CAP_PERFMON: a seccomp filter, a security "+
			"module or kernel lockdown forbids it (kernel.unprivileged_bpf_disabled is %s)",
			what, e.err, sysctl("kernel/unprivileged_bpf_disabled"))
	default:
		// Only EPERM carries the library's MEMLOCK hint.
		e.msg = fmt.Sprintf("%s on Linux %s: %v (the filter needs Linux %s or later)", what, kernelRelease(), err, MinKernel)
	}
	return e
}

// MinKernel is the oldest Linux release the filter was loaded and tested
// on (`make test-kernels`: Debian's 6.1, 6.12 and 7.3 pass; 5.10 lacks the
// BPF atomic instructions of 5.12; 5.12 to 6.0 were not tested).
const MinKernel = "6.1"

// kernelRelease is the running kernel's release, as uname -r prints it.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "(unknown release)"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// missingCapabilities names the capabilities the process lacks to load the
// filter: CAP_BPF and CAP_PERFMON, both implied by CAP_SYS_ADMIN.
func missingCapabilities() []string {
	if hasCapability(unix.CAP_SYS_ADMIN) {
		return nil
	}
	var out []string
	for _, c := range []struct {
		bit  int
		name string
	}{{unix.CAP_BPF, "CAP_BPF"}, {unix.CAP_PERFMON, "CAP_PERFMON"}} {
		if !hasCapability(c.bit) {
			out = append(out, c.name)
		}
	}
	return out
}

// hasCapability reports whether the process holds the capability c: in
// its permitted set, from which it is raised while it is needed
// (withCapabilities); true when it cannot tell (the kernel then says).
func hasCapability(c int) bool {
	tc, err := readThreadCaps()
	if err != nil {
		return true
	}
	return tc.permitted()&(1<<c) != 0
}

// executable is the path of the running binary, for the setcap hint.
func executable() string {
	p, err := os.Executable()
	if err != nil {
		return "/path/to/caddy"
	}
	return p
}

// lastLine is the verifier's conclusion: the last line of its log that is
// not the statistics summary.
func lastLine(log []string) string {
	for i := len(log) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(log[i]); l != "" && !strings.HasPrefix(l, "processed ") &&
			!strings.HasPrefix(l, "verification time") && !strings.HasPrefix(l, "stack depth") {
			return l
		}
	}
	return "no log"
}

func sysctl(name string) string {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
