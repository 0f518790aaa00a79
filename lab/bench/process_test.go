//go:build linux

package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	return !strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "Z")
}

// startTree starts a shell that starts a grandchild (its pid written to a
// file) and waits; script runs first in the shell.
func startTree(t *testing.T, ctx context.Context, script string) (*process, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	p, err := startProcess(ctx, []string{"/bin/sh", "-c", script + "; sleep 30 & echo $! > " + pidFile + "; wait"}, os.Environ(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(b), "\n") {
			child, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			return p, child
		}
	}
	t.Fatal("the shell never started its child")
	return nil, 0
}

func waitGone(pid int) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !alive(pid) {
			return true
		}
	}
	return false
}

// TestProcessKilledOnCancel: cancelling the context kills the process and
// everything in its group, and reaps it.
func TestProcessKilledOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p, child := startTree(t, ctx, "true")
	if !alive(p.pid()) || !alive(child) {
		t.Fatal("process tree not running")
	}
	cancel()
	select {
	case <-p.done:
	case <-time.After(2 * time.Second):
		t.Fatal("process not reaped 2s after the cancel")
	}
	if !p.exited() || !waitGone(p.pid()) || !waitGone(child) {
		t.Fatalf("after cancel: leader alive %v, grandchild alive %v", alive(p.pid()), alive(child))
	}
}

// TestProcessStop: stop sends SIGTERM and reports a clean exit; a process
// that ignores SIGTERM is killed, with its group, once the grace is over.
func TestProcessStop(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		graceful bool
	}{
		{"exits on SIGTERM", "trap 'exit 0' TERM", true},
		{"ignores SIGTERM", "trap '' TERM", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, child := startTree(t, context.Background(), tt.script)
			const grace = 300 * time.Millisecond
			d, graceful := p.stop(grace)
			if graceful != tt.graceful {
				t.Fatalf("graceful = %v after %v, want %v", graceful, d, tt.graceful)
			}
			if !graceful && d < grace {
				t.Errorf("killed after %v, before the grace of %v", d, grace)
			}
			if !p.exited() || !waitGone(child) {
				t.Fatalf("after stop: exited %v, grandchild alive %v", p.exited(), alive(child))
			}
			// Stopping again is harmless.
			if d, ok := p.stop(grace); !ok || d != 0 {
				t.Errorf("second stop: %v, %v", d, ok)
			}
		})
	}
}

func TestStartProcessError(t *testing.T) {
	_, err := startProcess(context.Background(), []string{"/nonexistent/caddy", "run"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "starting /nonexistent/caddy") {
		t.Fatalf("err = %v", err)
	}
}

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
			_, err := startCaddy(context.Background(), bin, dir, s, builtinVariants()[1], "t", 300*time.Millisecond)
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %v\nwant one line containing %q", err, tt.want)
			}
			if b, err := os.ReadFile(pidFile); err == nil {
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				if pid == 0 || !waitGone(pid) {
					t.Errorf("the fake caddy (pid %d) is still running", pid)
				}
			}
		})
	}
}
