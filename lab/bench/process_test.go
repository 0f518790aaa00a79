//go:build linux

package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestStartCaddyFailures: a Caddy that exits or never answers is a one-line
// error naming the variant and the reason, and leaves no process behind.
func TestStartCaddyFailures(t *testing.T) {
	tests := []struct {
		name, script, want string
	}{
		{"exits", "echo 'Error: loading initial config: listen udp :8443: bind: address already in use' >&2; exit 1",
			"caddy (variant rakelimit) failed to start: caddy exited: Error: loading initial config: listen udp :8443: bind: address already in use"},
		{"never ready", "echo $$ > " + "PIDFILE; exec sleep 30",
			"caddy (variant rakelimit) failed to start: not ready after 300ms: admin endpoint:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			pidFile := filepath.Join(dir, "pid")
			bin := filepath.Join(dir, "caddy")
			script := "#!/bin/sh\n" + strings.ReplaceAll(tt.script, "PIDFILE", pidFile) + "\n"
			if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			port, _ := freePort()
			admin, _ := freePort(port)
			s := site{port: port, adminPort: admin}
			_, err := startCaddy(context.Background(), bin, dir, s, builtinVariants()[1], "t", "", 300*time.Millisecond)
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %v\nwant one line containing %q", err, tt.want)
			}
			if b, err := os.ReadFile(pidFile); err == nil {
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				if pid == 0 || !testutil.WaitGone(pid, 2*time.Second) {
					t.Errorf("the fake caddy (pid %d) is still running", pid)
				}
			}
		})
	}
}
