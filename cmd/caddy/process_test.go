//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace/prefilter"
)

// These tests need Caddy as a process of its own: its log from start-up, or
// its privileges. This package's test binary plays Caddy (main), with the
// arguments it was given, when RAKELIMIT_AS_CADDY=1, with hideUDP
// registered, a module for these tests only; testutil.Caddy runs it. They
// run as root, and run Caddy as root or, with setpriv and setcap, as nobody
// with the capabilities under test; floods come from loopback addresses
// only, bounded in rate and time.

// The sources of the tests' traffic: legitimate requests, and floods.
var (
	legitSrc = netip.MustParseAddr("127.0.0.5")
	floodSrc = netip.MustParseAddr("127.0.0.6")
)

// TestMain runs Caddy when RAKELIMIT_AS_CADDY=1, the tests otherwise.
func TestMain(m *testing.M) {
	caddy.RegisterModule(hideUDP{})
	if os.Getenv("RAKELIMIT_AS_CADDY") == "1" {
		os.Args[0] = "caddy"
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hideUDP is a packet conn wrapper for tests only: it hides the socket
// behind a plain net.PacketConn, which is what makes quic-go give up its
// optimizations. It shows that the fast-path check below can fail.
type hideUDP struct{}

// CaddyModule returns the module's information.
func (hideUDP) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.packetconns.test_hide_udp", New: func() caddy.Module { return new(hideUDP) }}
}

// WrapPacketConn hides pc's type.
func (hideUDP) WrapPacketConn(pc net.PacketConn) net.PacketConn { return struct{ net.PacketConn }{pc} }

// UnmarshalCaddyfile reads the directive, which has no options.
func (*hideUDP) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

// asCaddy is bin, this test binary or a copy of it, as Caddy: run through
// prefix (such as setpriv), with env added to this process's environment.
func asCaddy(bin string, prefix, env []string) testutil.Caddy {
	return testutil.Caddy{Bin: bin, Prefix: prefix, Env: append(append(os.Environ(), "RAKELIMIT_AS_CADDY=1"), env...)}
}

// testCaddy is this test binary as a Caddy of the test's own, with data and
// config directories of its own, configured by the Caddyfile cfg, ready
// once https://127.0.0.1:port/ answers over HTTP/3: asCaddy with prefix and
// env.
func testCaddy(t *testing.T, prefix, env []string, cfg string, port int) testutil.Caddy {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := asCaddy(self, prefix, append(env, "XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir()))
	c.Config, c.URL, c.Src = cfg, fmt.Sprintf("https://127.0.0.1:%d/", port), legitSrc
	return c
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
`, testutil.FreePort(t), port, globals, port, port, site)
}

// TestQUICKeepsFastPath runs Caddy with quic-go's log at info level and
// checks that quic-go got the UDP socket itself: it logs "Disabling
// optimizations" when a wrapper hides it, as the control shows.
func TestQUICKeepsFastPath(t *testing.T) {
	testutil.RequireRoot(t)
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
			port := testutil.FreePort(t)
			cfg := writeConfig(t, processCaddyfile(t, port,
				"servers {\n\t\tpacket_conn_wrappers {\n\t\t\t"+tt.wrappers+"\n\t\t}\n\t}", ""))
			p := testutil.StartCaddy(t, testCaddy(t, nil, []string{"QUIC_GO_LOG_LEVEL=info"}, cfg, port))
			p.Kill()
			<-p.Done()
			log := p.Output()
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
// CAP_BPF, in mode bpf: both must fail, naming the capability and how to
// grant it, rather than serve the listener unprotected.
func TestRefusesWithoutCapBPF(t *testing.T) {
	testutil.RequireRoot(t)
	if v, _ := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled"); strings.TrimSpace(string(v)) == "0" {
		t.Skip("kernel.unprivileged_bpf_disabled=0: any process may load socket filters here")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed: %v", err)
	}
	port := testutil.FreePort(t)
	cfg := writeConfig(t, processCaddyfile(t, port, "", "rakelimit 1000 {\n\t\tmode bpf\n\t}"))
	drop := []string{setpriv, "--bounding-set=-bpf,-sys_admin", "--inh-caps=-bpf,-sys_admin"}
	for _, verb := range []string{"validate", "run"} {
		t.Run(verb, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c := testCaddy(t, drop, nil, cfg, port)
			out, err := c.Command(ctx, append([]string{verb}, c.ConfigArgs()...)...).CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("caddy %s without CAP_BPF: err %v, context %v:\n%s", verb, err, ctx.Err(), out)
			}
			for _, want := range []string{"lacks CAP_BPF", "setcap cap_bpf,cap_perfmon,cap_net_bind_service+p",
				"AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_BIND_SERVICE"} {
				if !bytes.Contains(out, []byte(want)) {
					t.Errorf("caddy %s output lacks %q:\n%s", verb, want, out)
				}
			}
		})
	}
}

// unprivilegedDir makes a directory that nobody may use, with a copy of
// this test binary and data and config directories that nobody owns, and
// removes it when the test ends.
func unprivilegedDir(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, bin = testutil.CopyTestBinary(t, "caddy")
	for _, sub := range []string{"data", "config"} {
		p := filepath.Join(dir, sub)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, testutil.Nobody, testutil.Nobody); err != nil {
			t.Fatal(err)
		}
	}
	return dir, bin
}

// TestLeastPrivilege runs Caddy as an unprivileged user holding exactly the
// capabilities the README documents, granted as the README says: file
// capabilities set with setcap, permitted only (+p) or effective too
// (+ep), and ambient capabilities as systemd's AmbientCapabilities and
// CapabilityBoundingSet give them. Caddy loads the filter, attaches it and
// limits a flood, and so does a reload that loads a second filter. With
// +p, no thread of Caddy has CAP_BPF or CAP_PERFMON effective once it has
// started, nor after the reload, and every one still holds them
// permitted; effective at start, they stay effective in every thread. With
// CAP_BPF alone or with none, in mode bpf it refuses to start with a
// one-line error naming what is missing, and with the log at DEBUG the
// verifier's log is there; in mode auto (the default) it warns once,
// saying why and what to grant, and limits in userspace; so it does in
// mode userspace, which never tries BPF, and as root without CAP_BPF,
// CAP_PERFMON and CAP_SYS_ADMIN.
func TestLeastPrivilege(t *testing.T) {
	testutil.RequireRoot(t)
	tools := privilegeTools(t)
	unprivilegedBPF, _ := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
	asNobody := []string{tools["setpriv"], fmt.Sprintf("--reuid=%d", testutil.Nobody), fmt.Sprintf("--regid=%d", testutil.Nobody), "--clear-groups"}
	const documented = "cap_bpf,cap_perfmon,cap_net_bind_service"
	ambient := "-all,+bpf,+perfmon,+net_bind_service"
	dropRoot := []string{"--bounding-set=-bpf,-perfmon,-sys_admin", "--inh-caps=-bpf,-perfmon,-sys_admin"}
	tests := []struct {
		name string
		// fileCaps are set on the binary with setcap; prefix adds to
		// asNobody, or runs as root when root is set.
		fileCaps string
		prefix   []string
		root     bool
		// mode is the directive's mode option, if any.
		mode string
		// refused lists what the error must say; nil: Caddy must run
		// and limit in the mode runs.
		refused []string
		runs    string
		// effective: in the kernel, CAP_BPF and CAP_PERFMON stay in
		// every thread's effective set (they were there at start);
		// otherwise no thread has them there once Caddy has started.
		effective bool
	}{
		{"setcap " + documented + "+p", documented + "+p", nil, false, "", nil, engine.ModeBPF, false},
		{"setcap " + documented + "+ep", documented + "+ep", nil, false, "", nil, engine.ModeBPF, true},
		{"ambient capabilities as systemd sets them", "",
			[]string{"--inh-caps=" + ambient, "--ambient-caps=" + ambient, "--bounding-set=" + ambient}, false, "", nil, engine.ModeBPF, true},
		{"CAP_BPF without CAP_PERFMON, mode bpf", "cap_bpf,cap_net_bind_service+p", nil, false, engine.ModeBPF,
			[]string{"lacks CAP_PERFMON", "setcap " + documented + "+p"}, "", false},
		{"no capability, mode bpf", "", nil, false, engine.ModeBPF, []string{"lacks CAP_BPF and CAP_PERFMON"}, "", false},
		{"CAP_BPF without CAP_PERFMON, mode auto", "cap_bpf,cap_net_bind_service+p", nil, false, "", nil, engine.ModeUserspace, false},
		{"no capability, mode auto", "", nil, false, "", nil, engine.ModeUserspace, false},
		{"no capability, mode userspace", "", nil, false, engine.ModeUserspace, nil, engine.ModeUserspace, false},
		{"root without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN", "", dropRoot, true, "", nil, engine.ModeUserspace, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.refused != nil && strings.TrimSpace(string(unprivilegedBPF)) == "0" {
				t.Skip("kernel.unprivileged_bpf_disabled=0: any process may load socket filters here")
			}
			dir, bin := unprivilegedDir(t)
			if tt.fileCaps != "" {
				if out, err := exec.Command(tools["setcap"], tt.fileCaps, bin).CombinedOutput(); err != nil {
					t.Fatalf("setcap %s: %v: %s", tt.fileCaps, err, out)
				}
			}
			port, admin := testutil.FreePort(t), testutil.FreePort(t)
			cfg := filepath.Join(dir, "Caddyfile")
			// With the admin endpoint, for the metrics, and the log at DEBUG.
			directive := "rakelimit 100"
			if tt.mode != "" {
				directive = "rakelimit 100 {\n\t\tmode " + tt.mode + "\n\t}"
			}
			config := strings.Replace(processCaddyfile(t, port, "debug", directive), "admin off",
				fmt.Sprintf("admin localhost:%d", admin), 1)
			if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			prefix := append(slices.Clone(asNobody), tt.prefix...)
			if tt.root {
				prefix = append([]string{tools["setpriv"]}, tt.prefix...)
			}
			c := asCaddy(bin, prefix, []string{"XDG_DATA_HOME=" + filepath.Join(dir, "data"),
				"XDG_CONFIG_HOME=" + filepath.Join(dir, "config"), "HOME=" + filepath.Join(dir, "data")})
			c.Config, c.URL, c.Src = cfg, fmt.Sprintf("https://127.0.0.1:%d/", port), legitSrc
			if tt.refused != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				out, err := c.Command(ctx, append([]string{"run"}, c.ConfigArgs()...)...).CombinedOutput()
				if err == nil || ctx.Err() != nil {
					t.Fatalf("caddy ran: %v, %v:\n%s", err, ctx.Err(), out)
				}
				checkRefusal(t, string(out), tt.refused)
				return
			}
			caddyProc := testutil.StartCaddy(t, c)
			if !strings.Contains(caddyProc.Output(), "protecting listener") {
				t.Fatal("rakelimit did not attach")
			}
			// Userspace: one warning, when the configuration asked for
			// auto, that says why and what to grant.
			warned := strings.Count(caddyProc.Output(), "rakelimit filters in userspace")
			if want := tt.runs == engine.ModeUserspace && tt.mode != engine.ModeUserspace; warned != map[bool]int{true: 1}[want] ||
				want && !strings.Contains(caddyProc.Output(), "grant CAP_BPF and CAP_PERFMON") {
				t.Errorf("%d warnings about userspace, want %v", warned, want)
			}
			// Its filter's count of drops, from its metrics; in
			// userspace, what it did not pass once Caddy has read
			// every queued datagram: its kernel pre-filter's drops
			// are counted only in the socket's drop counter, with
			// receive-queue overflows that only a system-wide
			// counter (which other tests move) tells apart.
			passed := func() uint64 {
				_, m := testutil.AdminGet(t, admin, "/metrics")
				return uint64(sumMetric(m, "caddy_rakelimit_packets_total", `class="opening"`, `family="ipv4"`, `verdict="passed"`) +
					sumMetric(m, "caddy_rakelimit_packets_total", `class="opening"`, `family="ipv4"`, `verdict="limited"`))
			}
			dropped := func() uint64 {
				_, m := testutil.AdminGet(t, admin, "/metrics")
				return uint64(testutil.Metric(t, m, "caddy_rakelimit_packets_total", `class="opening"`, `verdict="dropped"`, `level="0"`, `family="ipv4"`))
			}
			_, m := testutil.AdminGet(t, admin, "/metrics")
			if got := testutil.Metric(t, m, "caddy_rakelimit_mode", `mode="`+tt.runs+`"`); got != 1 {
				t.Errorf("caddy_rakelimit_mode{mode=%q} = %v, want 1", tt.runs, got)
			}
			const limit = 100
			dropped0, passed0 := dropped(), passed()
			sent := testutil.FloodInitials(t, floodSrc, testutil.LoopbackFor(floodSrc, uint16(port)), 30*limit, time.Second)
			d := dropped() - dropped0
			if tt.runs == engine.ModeUserspace {
				testutil.WaitRead(t, port)
				d = uint64(sent) - min(uint64(sent), passed()-passed0)
			}
			if !testutil.Held(sent, d, limit) {
				t.Fatalf("a flood of %d at 30x the limit: the filter dropped %d", sent, d)
			}
			t.Logf("%s mode, as uid %d (root %v): flood of %d at 30x the limit, %d dropped", tt.runs, testutil.Nobody, tt.root, sent, d)
			if tt.runs == engine.ModeUserspace {
				checkPrefilter(t, admin, port)
				return
			}
			const held = 1<<unix.CAP_BPF | 1<<unix.CAP_PERFMON
			checkThreadCaps(t, caddyProc.Pid(), held, tt.effective, "at start")
			loadSecondFilter(t, admin, config)
			checkThreadCaps(t, caddyProc.Pid(), held, tt.effective, "after a reload that loaded a filter")
		})
	}
}

// privilegeTools finds setpriv and setcap, by name.
func privilegeTools(t *testing.T) map[string]string {
	t.Helper()
	tools := map[string]string{}
	for _, tool := range []string{"setpriv", "setcap"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			p, err = exec.LookPath("/usr/sbin/" + tool)
		}
		if err != nil {
			t.Fatalf("%s is needed (make deps installs it): %v", tool, err)
		}
		tools[tool] = p
	}
	return tools
}

// checkThreadCaps fails t unless every thread of process pid holds the
// capabilities held in its permitted set, and in its effective set all of
// them (effective) or none; when says when, for the errors.
func checkThreadCaps(t *testing.T, pid int, held uint64, effective bool, when string) {
	t.Helper()
	want := uint64(0)
	if effective {
		want = held
	}
	threads := testutil.ThreadCaps(t, pid)
	for tid, c := range threads {
		if c.Permitted&held != held {
			t.Errorf("%s, thread %d of Caddy holds %#x of %#x permitted (CapPrm %#x)", when, tid, c.Permitted&held, held, c.Permitted)
		}
		if got := c.Effective & held; got != want {
			t.Errorf("%s, thread %d of Caddy has %#x of %#x effective, want %#x (CapEff %#x)", when, tid, got, held, want, c.Effective)
		}
	}
	t.Logf("%s: %d threads of Caddy checked, each to have %#x of capabilities %#x effective", when, len(threads), want, held)
}

// loadSecondFilter reloads Caddy, whose configuration is the Caddyfile
// config and whose admin endpoint is on port admin, with one more site, on
// a port of its own, limited by a limiter of its own in mode bpf: the
// reload loads a second filter, and fails unless it can.
func loadSecondFilter(t *testing.T, admin int, config string) {
	t.Helper()
	second := fmt.Sprintf("127.0.0.1:%d {\n\ttls internal\n\trakelimit 100 {\n\t\tname second\n\t\tmode bpf\n\t}\n\trespond \"hello\"\n}\n",
		testutil.FreePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/load", admin),
		strings.NewReader(config+second))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("reloading Caddy: %v", err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("a reload that loads a second filter: %s: %s", resp.Status, b)
	}
	_, m := testutil.AdminGet(t, admin, "/metrics")
	if got := testutil.Metric(t, m, "caddy_rakelimit_mode", `limiter="second"`, `mode="bpf"`); got != 1 {
		t.Fatalf(`after the reload, caddy_rakelimit_mode{limiter="second", mode="bpf"} = %v, want 1`, got)
	}
}

// sumMetric sums the samples of name whose labels include every one of want.
func sumMetric(exposition, name string, want ...string) float64 {
	total := 0.0
	for line := range strings.SplitSeq(exposition, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(line, w)
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); ok && err == nil {
			total += v
		}
	}
	return total
}

// checkPrefilter checks, in the userspace mode, the kernel pre-filter that
// needs no capability: it is on the socket, and it drops a flood of invalid
// datagrams in the kernel, all but the one in 2^prefilter.DefaultSampleShift
// it samples: n is large enough that the sample, which the estimate in the
// metrics comes from, is not empty (about 20 expected).
func checkPrefilter(t *testing.T, admin, port int) {
	t.Helper()
	_, m := testutil.AdminGet(t, admin, "/metrics")
	if got := testutil.Metric(t, m, "caddy_rakelimit_prefilter", `what="sockets"`); got < 1 {
		t.Fatalf("the pre-filter is on %v sockets, want 1:\n%s", got, m)
	}
	d0 := testutil.ReadDrops(t, port)
	junk := testutil.Sender(t, netip.AddrPortFrom(floodSrc, 0))
	const n = 20 << prefilter.DefaultSampleShift
	if err := testutil.Pace(junk, testutil.LoopbackFor(floodSrc, uint16(port)), 20_000, n,
		func() []byte { return []byte{0x00, 0x01, 0x02} }); err != nil {
		t.Fatal(err)
	}
	testutil.WaitRead(t, port)
	// The socket's own drop counter: the pre-filter's drops, and its own
	// queue's overflows, which a Caddy that reads while it is sent has
	// none of.
	if d := testutil.ReadDrops(t, port).Socket - d0.Socket; d < n*9/10 {
		t.Errorf("the kernel dropped %d of %d invalid datagrams, want 90%% at least", d, n)
	}
	_, m = testutil.AdminGet(t, admin, "/metrics")
	if est := testutil.Metric(t, m, "caddy_rakelimit_prefilter_dropped_estimated_total", `class="invalid"`, `reason="fixed_bit"`); est == 0 {
		t.Error("no estimated kernel drop of invalid datagrams in the metrics")
	}
}

// checkRefusal checks Caddy's output when it refused to start: the error
// is one short line saying each of want, without the BPF library's MEMLOCK
// hint; the verifier's log is only at DEBUG, in a line of its own.
func checkRefusal(t *testing.T, out string, want []string) {
	t.Helper()
	var errMsg string
	verifierLog := false
	for _, line := range strings.Split(out, "\n") {
		var rec map[string]any
		if strings.HasPrefix(line, "Error: ") {
			errMsg = strings.TrimPrefix(line, "Error: ")
		} else if json.Unmarshal([]byte(line), &rec) == nil {
			msg, _ := rec["msg"].(string)
			switch {
			case rec["level"] == "error" && strings.Contains(msg, "rakelimit"):
				errMsg = msg
			case rec["level"] == "debug" && msg == "the kernel verifier's log":
				verifierLog = true
			}
		}
	}
	if errMsg == "" {
		t.Fatalf("no error in:\n%s", out)
	}
	if len(errMsg) > 1000 || strings.Contains(errMsg, "\n") || strings.Contains(errMsg, "MEMLOCK") {
		t.Errorf("error of %d bytes, not one short line: %s", len(errMsg), errMsg)
	}
	for _, w := range want {
		if !strings.Contains(errMsg, w) {
			t.Errorf("error lacks %q: %s", w, errMsg)
		}
	}
	if strings.Contains(want[0], "lacks CAP_PERFMON") && !verifierLog {
		t.Errorf("no DEBUG line with the verifier's log")
	}
	t.Logf("%s", errMsg)
}

// TestMakeCommands checks the README's two commands, `make run` and `make
// test`, as make would run them: as root they never call sudo (a machine
// where one is root may have none); as a user they build with Go as that
// user and run only Caddy, the tests and apt-get through sudo. `make run`
// says that it is building.
func TestMakeCommands(t *testing.T) {
	testutil.RequireRoot(t) // root, to run make as another user
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Fatalf("make is needed: %v", err)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed: %v", err)
	}
	dir, _ := unprivilegedDir(t)
	b, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		prefix []string
		// want are lines that must be printed; none of the lines
		// outside sudo may start with sudo, and as root none may
		// contain it.
		want []string
	}{
		{"root", nil, []string{
			"go build -v -o caddy ./cmd/caddy",
			"./caddy run --config testdata/Caddyfile",
			"go test -race ./...",
			"cd lab && go test -race $(go list ./... | grep -v /sim$)",
		}},
		{"user with sudo", []string{setpriv, fmt.Sprintf("--reuid=%d", testutil.Nobody), fmt.Sprintf("--regid=%d", testutil.Nobody), "--clear-groups"}, []string{
			"go build -v -o caddy ./cmd/caddy",
			"sudo --preserve-env=CI,RAKELIMIT_REQUIRE_BPF ./caddy run --config testdata/Caddyfile",
			"go test -race -exec 'sudo --preserve-env=CI,RAKELIMIT_REQUIRE_BPF' ./...",
			"cd lab && go test -race -exec 'sudo --preserve-env=CI,RAKELIMIT_REQUIRE_BPF' $(go list ./... | grep -v /sim$)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv := append(slices.Clone(tt.prefix), mk, "--no-print-directory", "-n", "run", "test")
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin") // no sudo, no Go
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("make -n: %v\n%s", err, out)
			}
			lines := strings.Split(string(out), "\n")
			for _, w := range tt.want {
				if !slices.Contains(lines, w) {
					t.Errorf("make -n run test lacks the line %q:\n%s", w, out)
				}
			}
			if !strings.Contains(string(out), "echo \"building ./caddy") {
				t.Errorf("make run does not say that it is building:\n%s", out)
			}
			if tt.prefix == nil && strings.Contains(string(out), "sudo") {
				t.Errorf("as root, make calls sudo:\n%s", out)
			}
		})
	}
}
