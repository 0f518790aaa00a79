//go:build linux

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// moduleRoot finds the directory of this repository's go.mod from dir
// upwards.
func moduleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/rakelimit/caddy-rakelimit\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of github.com/rakelimit/caddy-rakelimit above %s: run from the repository or pass -caddy", dir)
		}
	}
}

// buildCaddy builds ./cmd/caddy into dir and returns the binary's path.
func buildCaddy(ctx context.Context, dir string, progress io.Writer) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("building caddy: %w", err)
	}
	root, err := moduleRoot(wd)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "caddy")
	fmt.Fprintf(progress, "rakebench: building ./cmd/caddy (minutes when the build cache is cold)\n")
	start := time.Now()
	cmd := exec.CommandContext(ctx, goTool(), "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building ./cmd/caddy: %w: %s", err, testutil.LastLine(out))
	}
	fmt.Fprintf(progress, "rakebench: built caddy in %.0f s\n", time.Since(start).Seconds())
	return bin, nil
}

// goTool is the go command: on PATH, else where this machine's Go lives.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// caddyVersion returns the first line of `caddy version`.
func caddyVersion(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := testutil.Caddy{Bin: bin}.Command(ctx, "version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("running %s version: %w: %s", bin, err, testutil.LastLine(out))
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]), nil
}

// site is what every Caddy process of a run serves: the same ports, storage
// and files; only the directive changes.
type site struct {
	port, httpPort, adminPort, backendPort int
	storage, www                           string
}

// caddyfile returns the configuration for a variant's directive: the admin
// endpoint on localhost, nothing installed or persisted outside the run's
// directory, and one site for localhost and 127.0.0.1 with tls internal: a
// small page at /, files under /files/ and /upload proxied to a backend
// that reads the whole body.
func (s site) caddyfile(directive string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	skip_install_trust
	local_certs
	storage file_system %s
	http_port %d
	https_port %d
	auto_https disable_redirects
	log {
		level WARN
	}
}

127.0.0.1:%d, localhost:%d {
	tls internal
	%s
	handle /upload {
		reverse_proxy 127.0.0.1:%d
	}
	handle_path /files/* {
		root * %s
		file_server
	}
	handle {
		respond "hello"
	}
}
`, s.adminPort, s.storage, s.httpPort, s.port, s.port, s.port, indent(directive, "\t"), s.backendPort, s.www)
}

// indent indents every line but the first of text.
func indent(text, prefix string) string {
	return strings.ReplaceAll(strings.TrimSpace(text), "\n", "\n"+prefix)
}

// page is the small page's body.
const page = "hello"

// caddyProc is one running Caddy.
type caddyProc struct {
	*testutil.CaddyProcess
	site site
}

// caddyEnv keeps Caddy's files in the run's directory.
func caddyEnv(dir string) []string {
	env := []string{"HOME=" + dir, "XDG_DATA_HOME=" + filepath.Join(dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(dir, "config")}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == "PATH" || k == "TMPDIR" {
			env = append(env, kv)
		}
	}
	return env
}

// variantCaddy is Caddy with a variant's configuration (which
// validateVariant writes), its files in the run's directory.
func variantCaddy(bin, dir string, v Variant) testutil.Caddy {
	return testutil.Caddy{Bin: bin, Env: caddyEnv(dir), Config: filepath.Join(dir, "Caddyfile."+v.Name)}
}

// validateVariant runs `caddy validate` on a variant's configuration, which
// provisions every module (and loads BPF programs) without serving.
func validateVariant(ctx context.Context, bin, dir string, s site, v Variant) error {
	c := variantCaddy(bin, dir, v)
	if err := os.WriteFile(c.Config, []byte(s.caddyfile(v.Directive)), 0o600); err != nil {
		return fmt.Errorf("writing the configuration of variant %q: %w", v.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := c.Command(ctx, append([]string{"validate"}, c.ConfigArgs()...)...).CombinedOutput()
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ctx.Err()
	}
	if err == nil {
		return nil
	}
	msg := testutil.ErrorLine(out)
	if strings.Contains(string(out), "CAP_BPF") && os.Geteuid() != 0 {
		return fmt.Errorf("variant %q needs CAP_BPF: run as root: %s", v.Name, msg)
	}
	return fmt.Errorf("variant %q (%q): caddy validate: %s", v.Name, v.Directive, msg)
}

// startCaddy starts Caddy with a variant's configuration (written by
// validateVariant), its log in the run's directory, on the CPUs of the
// taskset -c list cpus (empty: any), and waits up to ready until its admin
// endpoint answers and then its site over HTTP/3. A Caddy that does not get
// there is stopped.
func startCaddy(ctx context.Context, bin, dir string, s site, v Variant, tag, cpus string, ready time.Duration) (*caddyProc, error) {
	c := variantCaddy(bin, dir, v)
	if cpus != "" {
		c.Prefix = []string{"taskset", "-c", cpus}
	}
	c.LogFile, c.Admin, c.Wait = filepath.Join(dir, "caddy-"+tag+".log"), s.adminPort, ready
	dst := s.dst()
	c.Ready = func(ctx context.Context) error {
		if _, err := newConnGet(ctx, probeSrc, dst, "/", page); err != nil {
			return fmt.Errorf("HTTP/3 request: %w", err)
		}
		return nil
	}
	p, err := c.Start(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("caddy (variant %s) failed to start: %w", v.Name, err)
	}
	return &caddyProc{CaddyProcess: p, site: s}, nil
}

// dst is the site's address for IPv4 clients.
func (s site) dst() netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(s.port))
}

// dst is the site's address for IPv4 clients.
func (c *caddyProc) dst() netip.AddrPort { return c.site.dst() }

// admin GETs path from the admin endpoint.
func (c *caddyProc) admin(ctx context.Context, path string) ([]byte, error) {
	return testutil.AdminRequest(ctx, c.site.adminPort, path)
}

// procSample is what /proc says about Caddy at one moment.
type procSample struct {
	at       time.Time
	cpuTicks uint64 // utime + stime of every thread, in clock ticks
	drops    uint64 // drops of the site's UDP sockets
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times on Linux.
const clockTicks = 100

func (c *caddyProc) sample() (procSample, error) {
	s := procSample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Pid()))
	if err != nil {
		return s, fmt.Errorf("reading caddy's CPU time: %w", err)
	}
	if s.cpuTicks, err = parseStatCPU(string(b)); err != nil {
		return s, err
	}
	if s.drops, err = backlog.SocketDrops(c.site.port); err != nil {
		return s, err
	}
	return s, nil
}

// parseStatCPU returns utime + stime from a /proc/PID/stat line.
func parseStatCPU(stat string) (uint64, error) {
	// The command name is in parentheses and may hold spaces.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc/PID/stat %q: no command name", stat)
	}
	f := strings.Fields(stat[i+1:])
	// Fields after the name start at field 3 (state); utime and stime are
	// fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parsing /proc/PID/stat: %d fields", len(f)+2)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parsing /proc/PID/stat times: %w", err)
	}
	return u + s, nil
}

// cpuPercent is the CPU Caddy used between two samples, in percent of one
// core.
func cpuPercent(a, b procSample) float64 {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return 0
	}
	return 100 * float64(b.cpuTicks-a.cpuTicks) / clockTicks / wall
}

// resetPeakRSS resets Caddy's VmHWM to its current RSS.
func (c *caddyProc) resetPeakRSS() error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", c.Pid()), []byte("5"), 0); err != nil {
		return fmt.Errorf("resetting caddy's peak RSS: %w", err)
	}
	return nil
}

// peakRSS returns Caddy's VmHWM in bytes.
func (c *caddyProc) peakRSS() (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Pid()))
	if err != nil {
		return 0, fmt.Errorf("reading caddy's peak RSS: %w", err)
	}
	return parseVmHWM(string(b))
}

func parseVmHWM(status string) (uint64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("parsing VmHWM %q", line)
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmHWM %q: %w", line, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/PID/status")
}
