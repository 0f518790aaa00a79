package testutil

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Nobody is the user and group ID of the unprivileged user tests run
// processes as.
const Nobody = 65534

// CopyTestBinary copies the running test binary, as name, into a new
// directory that every user may enter (mode 0755), so that a test can run
// it as Nobody; the directory is removed when the test ends.
func CopyTestBinary(t testing.TB, name string) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "rakelimit-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, name)
	if err := copyFile(self, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

// Unprivileged is the environment variable RerunUnprivileged sets (to 1) in
// its children, so that a test can tell that it runs in one.
const Unprivileged = "RAKELIMIT_UNPRIVILEGED"

// RerunUnprivileged runs this test binary again, from a copy every user may
// run (CopyTestBinary, named name), with the tests run matches, twice: as
// Nobody with no capability, and as root without the capabilities drop
// names (as setpriv names them: "bpf", "perfmon", ...). Each child has
// Unprivileged=1 and HOME (its working directory) in the copy's directory.
// It fails t unless each child exits cleanly with each test of want passed.
// The caller makes sure that the process is root, which setpriv needs.
func RerunUnprivileged(t *testing.T, name, run string, drop, want []string) {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("needs setpriv (util-linux, installed by make deps): %v", err)
	}
	dir, bin := CopyTestBinary(t, name)
	var without []string
	for _, c := range drop {
		without = append(without, "-"+c)
	}
	tests := []struct {
		name string
		args []string
	}{
		{"nobody", []string{fmt.Sprintf("--reuid=%d", Nobody), fmt.Sprintf("--regid=%d", Nobody), "--clear-groups",
			"--inh-caps=-all", "--bounding-set=-all"}},
		{"root without " + strings.ToUpper("CAP_"+strings.Join(drop, ", CAP_")), []string{"--inh-caps=" + strings.Join(without, ","),
			"--bounding-set=" + strings.Join(without, ",")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(tt.args, bin, "-test.run="+run, "-test.v", "-test.count=1")
			cmd := exec.Command(setpriv, args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), Unprivileged+"=1", "HOME="+dir)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, Tail(out))
			}
			for _, name := range want {
				if !strings.Contains(string(out), "--- PASS: "+name+" ") {
					t.Errorf("%s did not pass in the child:\n%s", name, Tail(out))
				}
			}
		})
	}
}

// Tail is the end of a child's output, at most 4000 bytes, for error
// messages.
func Tail(out []byte) string {
	const keep = 4000
	if len(out) > keep {
		out = out[len(out)-keep:]
	}
	return string(out)
}

// EffectiveCaps reads this process's effective capabilities (CapEff in
// /proc/self/status): bit n is capability n (unix.CAP_BPF and so on).
func EffectiveCaps(t testing.TB) uint64 {
	t.Helper()
	caps, err := readCaps("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	return caps.Effective
}

// Caps are a thread's capability sets: bit n is capability n.
type Caps struct {
	Effective, Permitted uint64
}

// ThreadCaps reads the capabilities of every thread of the process pid
// (CapEff and CapPrm in /proc/<pid>/task/<tid>/status), by thread ID:
// Linux keeps them per thread. A thread that ends while they are read is
// left out.
func ThreadCaps(t testing.TB, pid int) map[int]Caps {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatalf("listing the threads of process %d: %v", pid, err)
	}
	out := map[int]Caps{}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		caps, err := readCaps(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[tid] = caps
	}
	if len(out) == 0 {
		t.Fatalf("process %d has no thread", pid)
	}
	return out
}

// readCaps reads CapEff and CapPrm from the status file path.
func readCaps(path string) (Caps, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Caps{}, fmt.Errorf("reading capabilities: %w", err)
	}
	var caps Caps
	found := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		for _, f := range []struct {
			name string
			to   *uint64
		}{{"CapEff:", &caps.Effective}, {"CapPrm:", &caps.Permitted}} {
			if v, ok := strings.CutPrefix(line, f.name); ok {
				if *f.to, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil {
					return Caps{}, fmt.Errorf("parsing %s %q in %s: %w", f.name, v, path, err)
				}
				found++
			}
		}
	}
	if found != 2 {
		return Caps{}, fmt.Errorf("no CapEff and CapPrm in %s", path)
	}
	return caps, nil
}

// copyFile copies from into a new file to with mode perm.
func copyFile(from, to string, perm os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("copying %s: %w", from, err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("copying %s: %w", from, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", from, to, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copying %s to %s: %w", from, to, err)
	}
	return nil
}
