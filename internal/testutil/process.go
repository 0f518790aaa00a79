package testutil

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
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
