//go:build linux

package rakelimit

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
)

// Some checks need Caddy as a process of its own: its log from start-up, or
// its privileges. The test binary plays Caddy when RAKELIMIT_AS_CADDY is set.

func init() {
	caddy.RegisterModule(hideUDP{})
	if args := os.Getenv("RAKELIMIT_AS_CADDY"); args != "" {
		os.Args = append([]string{"caddy"}, strings.Fields(args)...)
		caddycmd.Main()
		os.Exit(0)
	}
}

// hideUDP is a packet conn wrapper for tests only: it hides the socket
// behind a plain net.PacketConn, which is what makes quic-go give up its
// optimizations. It shows that the fast-path check below can fail.
type hideUDP struct{}

func (hideUDP) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.packetconns.test_hide_udp", New: func() caddy.Module { return new(hideUDP) }}
}

func (hideUDP) WrapPacketConn(pc net.PacketConn) net.PacketConn { return struct{ net.PacketConn }{pc} }

func (*hideUDP) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

// caddyProcess runs this binary as `caddy args...` with extra environment
// and an optional command prefix (such as setpriv), and returns it.
func caddyProcess(t *testing.T, ctx context.Context, prefix []string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(append(prefix, self), "-test.run=^$")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), "RAKELIMIT_AS_CADDY="+strings.Join(args, " ")), env...)
	cmd.Env = append(cmd.Env, "XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
	return cmd
}

// writeConfig writes a Caddyfile with the given body into a temporary file.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// processCaddyfile is the configuration of a Caddy process: the site on port
// (127.0.0.1 and localhost) with tls internal, extra global options and
// extra site directives.
func processCaddyfile(t *testing.T, port int, globals, site string) string {
	return fmt.Sprintf(`{
	admin off
	skip_install_trust
	local_certs
	http_port %d
	https_port %d
	%s
}
127.0.0.1:%d, localhost:%d {
	tls internal
	%s
	respond "hello"
}
`, freePort(t), port, globals, port, port, site)
}

// TestQUICKeepsFastPath runs Caddy with quic-go's log at info level and
// checks that quic-go got the UDP socket itself: it logs "Disabling
// optimizations" when a wrapper hides it, as the control shows.
func TestQUICKeepsFastPath(t *testing.T) {
	requireBPF(t)
	tests := []struct {
		name     string
		wrappers string
		disabled bool
	}{
		{"rakelimit", "rakelimit 1000", false},
		{"control: a wrapper hiding the socket after rakelimit", "rakelimit 1000\n\t\t\ttest_hide_udp", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			port := freePort(t)
			cfg := writeConfig(t, processCaddyfile(t, port,
				"servers {\n\t\tpacket_conn_wrappers {\n\t\t\t"+tt.wrappers+"\n\t\t}\n\t}", ""))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cmd := caddyProcess(t, ctx, nil, []string{"QUIC_GO_LOG_LEVEL=info"}, "run", "--config", cfg)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			c := &testCaddy{t: t, port: port}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("caddy's log:\n%s", out.String())
				}
			})
			c.waitReady()
			cancel()
			cmd.Wait()
			log := out.String()
			if !strings.Contains(log, "protecting listener") {
				t.Fatalf("rakelimit did not attach:\n%s", log)
			}
			if got := strings.Contains(log, "Disabling optimizations"); got != tt.disabled {
				t.Fatalf("quic-go logged \"Disabling optimizations\": %v, want %v:\n%s", got, tt.disabled, log)
			}
		})
	}
}

// TestRefusesWithoutCapBPF runs caddy validate and caddy run without
// CAP_BPF: both must fail, naming the capability and how to grant it,
// rather than serve the listener unprotected.
func TestRefusesWithoutCapBPF(t *testing.T) {
	requireBPF(t)
	if v, _ := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled"); strings.TrimSpace(string(v)) == "0" {
		t.Skip("kernel.unprivileged_bpf_disabled=0: any process may load socket filters here")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed: %v", err)
	}
	port := freePort(t)
	cfg := writeConfig(t, processCaddyfile(t, port, "", "rakelimit 1000"))
	drop := []string{setpriv, "--bounding-set=-bpf,-sys_admin", "--inh-caps=-bpf,-sys_admin"}
	for _, verb := range []string{"validate", "run"} {
		t.Run(verb, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := caddyProcess(t, ctx, drop, nil, verb, "--config", cfg).CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("caddy %s without CAP_BPF: err %v, context %v:\n%s", verb, err, ctx.Err(), out)
			}
			for _, want := range []string{"CAP_BPF", "setcap cap_bpf+ep", "AmbientCapabilities=CAP_BPF"} {
				if !bytes.Contains(out, []byte(want)) {
					t.Errorf("caddy %s output lacks %q:\n%s", verb, want, out)
				}
			}
		})
	}
}
