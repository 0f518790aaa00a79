package testutil

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startTree starts a shell that starts a grandchild (its pid written to a
// file) and waits; script runs first in the shell.
func startTree(t *testing.T, ctx context.Context, script string) (*Process, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	p, err := StartProcess(ctx, []string{"/bin/sh", "-c", script + "; sleep 30 & echo $! > " + pidFile + "; wait"}, os.Environ(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
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

// TestProcessKilledOnCancel: cancelling the context kills the process and
// everything in its group, and reaps it.
func TestProcessKilledOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p, child := startTree(t, ctx, "true")
	if !alive(p.Pid()) || !alive(child) {
		t.Fatal("process tree not running")
	}
	cancel()
	select {
	case <-p.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("process not reaped 2s after the cancel")
	}
	if !p.Exited() || !WaitGone(p.Pid(), 2*time.Second) || !WaitGone(child, 2*time.Second) {
		t.Fatalf("after cancel: leader alive %v, grandchild alive %v", alive(p.Pid()), alive(child))
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
			d, graceful := p.Stop(grace)
			if graceful != tt.graceful {
				t.Fatalf("graceful = %v after %v, want %v", graceful, d, tt.graceful)
			}
			if !graceful && d < grace {
				t.Errorf("killed after %v, before the grace of %v", d, grace)
			}
			if !p.Exited() || !WaitGone(child, 2*time.Second) {
				t.Fatalf("after stop: exited %v, grandchild alive %v", p.Exited(), alive(child))
			}
			// Stopping again is harmless.
			if d, ok := p.Stop(grace); !ok || d != 0 {
				t.Errorf("second stop: %v, %v", d, ok)
			}
		})
	}
}

func TestStartProcessError(t *testing.T) {
	_, err := StartProcess(context.Background(), []string{"/nonexistent/caddy", "run"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "starting /nonexistent/caddy") {
		t.Fatalf("err = %v", err)
	}
}
