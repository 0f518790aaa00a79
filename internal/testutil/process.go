package testutil

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("parsing CapEff %q: %v", v, err)
			}
			return caps
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return 0
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
