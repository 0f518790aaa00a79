package testutil

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Caddy says how to run Caddy as a process of its own: its binary, the user
// and capabilities it runs with, its environment, its configuration, where
// its log goes and what shows that it is ready. The benchmark (lab/bench)
// runs a caddy built from ./cmd/caddy; the tests of cmd/caddy run their own
// test binary, which plays Caddy.
type Caddy struct {
	// Bin is the caddy binary.
	Bin string
	// Prefix is a command that runs Bin, such as setpriv with the user,
	// groups and capabilities Caddy gets (file capabilities are set on
	// Bin itself).
	Prefix []string
	// Env is Caddy's whole environment: nothing is inherited.
	Env []string
	// Config is the configuration file `caddy run` loads: a Caddyfile, or
	// JSON when its name ends in .json.
	Config string
	// LogFile, when set, receives Caddy's standard output and error;
	// without it they are kept in memory. Output returns them either way.
	LogFile string
	// Admin, when not 0, is the port of Caddy's admin endpoint on
	// 127.0.0.1: Start waits until it answers.
	Admin int
	// URL, when set, is a page of Caddy's that Start waits for until it
	// answers over HTTP/3 from a socket bound to Src: with tls internal,
	// Caddy issues its certificate after it starts.
	URL string
	Src netip.Addr
	// Ready, when set, is the last thing Start waits for: until it
	// returns nil (each attempt within 2 s).
	Ready func(ctx context.Context) error
	// Wait bounds the wait for all three; 0 means 30 s.
	Wait time.Duration
}

// Command returns the command that runs Caddy with args (Prefix, Bin and
// args, in Env), for what runs to its end: `caddy validate`, a refusal to
// start, `caddy rakelimit status`.
func (c Caddy) Command(ctx context.Context, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), c.Prefix...), c.Bin), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = c.Env
	return cmd
}

// ConfigArgs are the arguments that load Config: --config and, for a
// Caddyfile, --adapter caddyfile.
func (c Caddy) ConfigArgs() []string {
	if strings.HasSuffix(c.Config, ".json") {
		return []string{"--config", c.Config}
	}
	return []string{"--config", c.Config, "--adapter", "caddyfile"}
}

// CaddyProcess is a Caddy that Start started: a Process in a group of its
// own, which the context Start got kills.
type CaddyProcess struct {
	*Process
	out     *SyncBuffer // without a log file
	logFile string
}

// Output is what Caddy has written to its standard output and error so far.
func (p *CaddyProcess) Output() string {
	if p.out != nil {
		return p.out.String()
	}
	b, err := os.ReadFile(p.logFile)
	if err != nil {
		return fmt.Sprintf("(reading Caddy's log: %v)", err)
	}
	return string(b)
}

// Start runs `caddy run` with c's configuration, killed when ctx ends, and
// waits until it is ready: the admin endpoint answers, then the URL, then
// Ready, as c asks (with none of them, it returns once Caddy has started).
// A Caddy that exits first, or is not ready within Wait, is stopped, and the
// error says why, with the telling line of its log (ErrorLine).
func (c Caddy) Start(ctx context.Context) (*CaddyProcess, error) {
	p := &CaddyProcess{logFile: c.LogFile}
	var out io.Writer
	if c.LogFile != "" {
		f, err := os.Create(c.LogFile)
		if err != nil {
			return nil, fmt.Errorf("creating caddy's log: %w", err)
		}
		defer f.Close() // the child has its own descriptor
		out = f
	} else {
		p.out = &SyncBuffer{}
		out = p.out
	}
	argv := append(append(append([]string(nil), c.Prefix...), c.Bin, "run"), c.ConfigArgs()...)
	proc, err := StartProcess(ctx, argv, c.Env, out)
	if err != nil {
		return nil, err
	}
	p.Process = proc
	if err := c.waitReady(ctx, p); err != nil {
		p.Stop(5 * time.Second)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return p, nil
}

// waitReady waits for p as c says.
func (c Caddy) waitReady(ctx context.Context, p *CaddyProcess) error {
	timeout := c.Wait
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if p.Exited() {
			return fmt.Errorf("caddy exited: %s", ErrorLine([]byte(p.Output())))
		}
		if last = c.ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %w (log: %s)", timeout, last, ErrorLine([]byte(p.Output())))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ready makes one attempt at each of c's readiness checks.
func (c Caddy) ready(ctx context.Context) error {
	if c.Admin != 0 {
		if _, err := AdminRequest(ctx, c.Admin, "/config/"); err != nil {
			return fmt.Errorf("admin endpoint: %w", err)
		}
	}
	attempt := func(check func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return check(ctx)
	}
	if c.URL != "" {
		if err := attempt(func(ctx context.Context) error { _, _, err := HTTP3Get(ctx, c.Src, c.URL); return err }); err != nil {
			return fmt.Errorf("HTTP/3 request: %w", err)
		}
	}
	if c.Ready != nil {
		return attempt(c.Ready)
	}
	return nil
}

// StartCaddy starts c for t (Start) and fails t when Caddy does not get
// ready. When t ends, Caddy is killed, and its output logged if t failed.
func StartCaddy(t testing.TB, c Caddy) *CaddyProcess {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := c.Start(ctx)
	if err != nil {
		cancel()
		t.Fatalf("starting caddy: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		<-p.Done()
		if t.Failed() {
			t.Logf("caddy's output:\n%s", p.Output())
		}
	})
	return p
}

// ErrorLine returns the last line of out that mentions an error, else its
// last line; of a JSON log line, its message and error.
func ErrorLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.ToLower(lines[i]); strings.Contains(l, "error") {
			return logMessage(strings.TrimSpace(lines[i]))
		}
	}
	return logMessage(LastLine(out))
}

// logMessage extracts msg and error from a JSON log line.
func logMessage(line string) string {
	var entry struct {
		Msg   string `json:"msg"`
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(line), &entry) != nil || entry.Msg == "" {
		return line
	}
	if entry.Error != "" {
		return entry.Msg + ": " + entry.Error
	}
	return entry.Msg
}

// LastLine returns the last line of out, or "(no output)".
func LastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return l
	}
	return "(no output)"
}

// SyncBuffer is a bytes.Buffer that a process writes while a test reads.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
