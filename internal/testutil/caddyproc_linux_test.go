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

// fakeCaddy writes a shell script that plays Caddy: it writes its pid to
// dir/pid, then runs script.
func fakeCaddy(t *testing.T, dir, script string) string {
	t.Helper()
	bin := filepath.Join(dir, "caddy")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho $$ > "+filepath.Join(dir, "pid")+"\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// fakePid is the pid the fake Caddy in dir wrote, 0 for none.
func fakePid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// TestCaddyStart: Start runs Prefix, Bin, run and the configuration's
// arguments in Env alone, its output in memory or in LogFile, waits for
// Ready, and Stop ends it; StartCaddy's Caddy is gone when its test ends.
func TestCaddyStart(t *testing.T) {
	for _, logFile := range []bool{false, true} {
		t.Run(map[bool]string{false: "output in memory", true: "output in a file"}[logFile], func(t *testing.T) {
			dir := t.TempDir()
			c := Caddy{
				Bin:    fakeCaddy(t, dir, `echo "args: $*; env: $FROM_ENV $FROM_PREFIX home=$HOME"; echo ready > `+filepath.Join(dir, "ready")+`; exec sleep 30`),
				Prefix: []string{"/usr/bin/env", "FROM_PREFIX=prefix"},
				Env:    []string{"PATH=/usr/bin:/bin", "FROM_ENV=env"},
				Config: "/nowhere/Caddyfile",
				Ready: func(context.Context) error {
					_, err := os.Stat(filepath.Join(dir, "ready"))
					return err
				},
			}
			if logFile {
				c.LogFile = filepath.Join(dir, "log")
			}
			p, err := c.Start(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if want := "args: run --config /nowhere/Caddyfile --adapter caddyfile; env: env prefix home=\n"; p.Output() != want {
				t.Errorf("output %q, want %q", p.Output(), want)
			}
			if p.Pid() != fakePid(dir) {
				t.Errorf("pid %d, the script's %d", p.Pid(), fakePid(dir))
			}
			if d, graceful := p.Stop(5 * time.Second); !graceful || !p.Exited() {
				t.Errorf("stop: %v, graceful %v, exited %v", d, graceful, p.Exited())
			}
		})
	}
	dir := t.TempDir()
	t.Run("StartCaddy", func(t *testing.T) {
		p := StartCaddy(t, Caddy{Bin: fakeCaddy(t, dir, "exec sleep 30"), Config: "/nowhere/caddy.json",
			Ready: func(context.Context) error {
				if fakePid(dir) == 0 {
					return os.ErrNotExist
				}
				return nil
			}})
		if p.Exited() {
			t.Fatal("exited at once")
		}
	})
	if pid := fakePid(dir); pid == 0 || !WaitGone(pid, 2*time.Second) {
		t.Errorf("StartCaddy's Caddy (pid %d) outlived its test", pid)
	}
}

// TestCaddyStartFailures: a Caddy that exits, or that is not ready in
// time, is an error saying so with the telling line of its output, and
// leaves no process behind.
func TestCaddyStartFailures(t *testing.T) {
	tests := []struct {
		name, script string
		c            Caddy
		want         string
	}{
		{"exits", "echo 'Error: loading initial config: listen udp :8443: bind: address already in use' >&2; exit 1",
			Caddy{Ready: func(context.Context) error { return os.ErrNotExist }},
			"caddy exited: Error: loading initial config: listen udp :8443: bind: address already in use"},
		{"admin endpoint never up", "echo started; exec sleep 30", Caddy{Admin: FreePort(t), Wait: 300 * time.Millisecond},
			"not ready after 300ms: admin endpoint: "},
		{"never ready", `echo '{"level":"error","msg":"loading","error":"bad port"}'; exec sleep 30`,
			Caddy{Ready: func(context.Context) error { return os.ErrNotExist }, Wait: 300 * time.Millisecond},
			"not ready after 300ms: file does not exist (log: loading: bad port)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			c := tt.c
			c.Bin, c.Config = fakeCaddy(t, dir, tt.script), "/nowhere/Caddyfile"
			_, err := c.Start(context.Background())
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %v\nwant one line starting %q", err, tt.want)
			}
			if pid := fakePid(dir); pid == 0 || !WaitGone(pid, 2*time.Second) {
				t.Errorf("the fake caddy (pid %d) is still running", pid)
			}
		})
	}
}

// TestCaddyCommand: Command runs Prefix, Bin and the arguments in Env;
// ConfigArgs adapts a Caddyfile, not JSON.
func TestCaddyCommand(t *testing.T) {
	c := Caddy{Bin: "/bin/echo", Prefix: []string{"/usr/bin/env", "-i"}, Env: []string{"A=1"}}
	out, err := c.Command(context.Background(), "rakelimit", "status").CombinedOutput()
	if err != nil || string(out) != "rakelimit status\n" {
		t.Errorf("output %q, %v", out, err)
	}
	if cmd := c.Command(context.Background()); strings.Join(cmd.Args, " ") != "/usr/bin/env -i /bin/echo" || strings.Join(cmd.Env, " ") != "A=1" {
		t.Errorf("args %q, env %q", cmd.Args, cmd.Env)
	}
	for cfg, want := range map[string]string{"/x/Caddyfile.v": "--config /x/Caddyfile.v --adapter caddyfile", "/x/caddy.json": "--config /x/caddy.json"} {
		if got := strings.Join(Caddy{Config: cfg}.ConfigArgs(), " "); got != want {
			t.Errorf("ConfigArgs of %s: %q, want %q", cfg, got, want)
		}
	}
}

func TestErrorLine(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"a\nb\n", "b"},
		{"info\nError: loading config: bad\nbye\n", "Error: loading config: bad"},
		{`{"level":"error","msg":"x"}` + "\n{\"level\":\"info\"}\n", "x"},
		{`{"level":"error","msg":"loading","error":"bad port"}`, "loading: bad port"},
		{"", "(no output)"},
	} {
		if got := ErrorLine([]byte(tt.in)); got != tt.want {
			t.Errorf("ErrorLine(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
