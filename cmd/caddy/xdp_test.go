//go:build linux

package main

import (
	"bufio"
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// The XDP tests run Caddy in a network namespace joined to the clients' by
// a veth pair, whose server end runs the XDP program natively (veth has
// native XDP): the legit client at xdpClient, the flood from xdpFloodSources
// addresses in another /48, so that no limit the flood meets holds the
// client.
const (
	xdpLink         = "rkxdp"
	xdpFloodSources = 16
	// The flood: bounded in rate and time.
	xdpFloodRate = 20_000
	xdpFloodFor  = 3 * time.Second
	// xdpRequests are the legit client's requests during the flood.
	xdpRequests = 10
)

var (
	xdpServer = netip.MustParseAddr("fd00:78:64::1")
	xdpClient = netip.MustParseAddr("fd00:78:64::2")
)

// xdpFloodSource is the flood's i-th source address.
func xdpFloodSource(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x78, 0, 0x99, 15: byte(1 + i)})
}

// xdpNamespaces makes Caddy's namespace and the clients', joined by the
// veth pair, the flood's sources on the clients' end.
func xdpNamespaces(t *testing.T) (srv, cli *testutil.NetNS) {
	t.Helper()
	srv, cli = testutil.NewNetNS(t), testutil.NewNetNS(t)
	clientAddrs := []string{xdpClient.String() + "/64"}
	for i := range xdpFloodSources {
		clientAddrs = append(clientAddrs, xdpFloodSource(i).String()+"/128")
	}
	srv.Link(t, cli, xdpLink, []string{xdpServer.String() + "/64"}, clientAddrs)
	return srv, cli
}

// xdpProgram is the id of the XDP program ip link shows on the veth's
// server end, or "" for none.
func xdpProgram(t testing.TB, srv *testutil.NetNS) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", srv.Name(), "-d", "link", "show", "dev", xdpLink).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show %s: %v: %s", xdpLink, err, out)
	}
	f := strings.Fields(string(out))
	for i := range f {
		if strings.HasPrefix(f[i], "prog/xdp") && i+2 < len(f) && f[i+1] == "id" {
			return f[i+2]
		}
	}
	return ""
}

// waitNoXDP waits up to 5 s for the veth's server end to have no XDP
// program, and fails t with what leaves it there.
func waitNoXDP(t *testing.T, srv *testutil.NetNS, after string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		id := xdpProgram(t, srv)
		if id == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, the veth still runs XDP program %s", after, id)
		}
	}
}

// adminDo sends a request with body to Caddy's admin endpoint.
func (s *clientSite) adminDo(t *testing.T, method, path, body string) {
	t.Helper()
	client := http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.admin)
	}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s: %s", method, path, resp.Status, b)
	}
}

// view is the admin view of the site's one limiter.
func (s *clientSite) view(t *testing.T) report.Limiter {
	t.Helper()
	body, err := s.adminGet(context.Background(), "/rakelimit/")
	if err != nil {
		t.Fatal(err)
	}
	var v report.View
	if err := json.Unmarshal([]byte(body), &v); err != nil || len(v.Limiters) != 1 {
		t.Fatalf("the admin view %s: %v, want one limiter", body, err)
	}
	return v.Limiters[0]
}

// socketDrops is the drop counter of Caddy's UDP socket on its port, in
// its namespace (/proc/net/udp6's last column).
func (s *clientSite) socketDrops(t *testing.T) uint64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", s.ns.Name(), "cat", "/proc/net/udp6").Output()
	if err != nil {
		t.Fatalf("reading /proc/net/udp6 in Caddy's namespace: %v", err)
	}
	port := fmt.Sprintf(":%04X", s.port)
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	var drops uint64
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 2 && strings.HasSuffix(f[1], port) {
			n, err := strconv.ParseUint(f[len(f)-1], 10, 64)
			if err != nil {
				t.Fatalf("parsing %q: %v", sc.Text(), err)
			}
			drops += n
		}
	}
	return drops
}

// dropped sums the datagrams the limiter dropped, invalid ones included.
func dropped(t *testing.T, metrics string) float64 {
	t.Helper()
	return sumMetric(metrics, "caddy_rakelimit_packets_total", `verdict="dropped"`) +
		sumMetric(metrics, "caddy_rakelimit_packets_total", `verdict="invalid"`)
}

// TestXDPCaddy runs Caddy in mode xdp behind a veth: the XDP program runs
// on the veth (ip link, the admin view and the metrics say so), and a legit
// HTTP/3 client across it keeps getting the page while a flood of Initials
// from another network comes in at 20,000 a second, which the XDP program
// drops, not the socket filter (the socket's drop counter stays far below
// the drops). A reload that changes the limit keeps the program (the same
// id) and the counts; a reload that removes rakelimit takes the program
// away; a Caddy stopped with SIGTERM, and one killed with SIGKILL, leaves no
// program on the veth.
func TestXDPCaddy(t *testing.T) {
	testutil.RequireRoot(t)
	bin := clientsCaddy(t)
	srv, cli := xdpNamespaces(t)
	s := startClientSite(t, bin, engine.ModeXDP, srv, cli, xdpClient, xdpServer.String())
	prog := xdpProgram(t, srv)
	if prog == "" {
		t.Fatal("ip link shows no XDP program on the veth")
	}
	v := s.view(t)
	if len(v.XDP) != 1 || v.XDP[0].Name != xdpLink || v.XDP[0].Attach != report.XDPNative || len(v.XDP[0].Listeners) == 0 {
		t.Fatalf("the admin view's xdp: %+v, want %s native with the listener", v.XDP, xdpLink)
	}
	if got := testutil.Metric(t, s.metrics(t), "caddy_rakelimit_xdp_listeners", `interface="`+xdpLink+`"`, `attach="native"`); got < 1 {
		t.Fatalf("caddy_rakelimit_xdp_listeners{interface=%q} = %v", xdpLink, got)
	}

	t.Run("flood", func(t *testing.T) {
		var from []*net.UDPConn
		cli.Do(t, func() {
			for i := range xdpFloodSources {
				from = append(from, testutil.Sender(t, netip.AddrPortFrom(xdpFloodSource(i), 0)))
			}
		})
		before, dropsBefore := dropped(t, s.metrics(t)), s.socketDrops(t)
		var sent int
		var floodErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			g := testutil.NewInitials(38)
			sent, floodErr = testutil.Flood{From: from, To: netip.AddrPortFrom(xdpServer, uint16(s.port)), Rate: xdpFloodRate,
				Count: int(xdpFloodRate * xdpFloodFor.Seconds()), For: xdpFloodFor, Next: g.Next}.Send()
		})
		ok := 0
		time.Sleep(200 * time.Millisecond) // the flood under way
		for range xdpRequests {
			var err error
			cli.Do(t, func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var body string
				body, _, err = testutil.HTTP3Get(ctx, xdpClient, s.url(xdpServer.String()))
				if err == nil && !strings.Contains(body, pageMarker) {
					err = fmt.Errorf("not the page: %.80q", body)
				}
			})
			if err != nil {
				t.Logf("a request during the flood: %v", err)
				continue
			}
			ok++
			time.Sleep(xdpFloodFor / (2 * xdpRequests))
		}
		wg.Wait()
		if floodErr != nil {
			t.Fatal(floodErr)
		}
		drops := dropped(t, s.metrics(t)) - before
		socket := s.socketDrops(t) - dropsBefore
		t.Logf("mode xdp: %d of %d requests got the page during a flood of %d Initials; the limiter dropped %v, the socket %d",
			ok, xdpRequests, sent, drops, socket)
		if ok != xdpRequests {
			t.Errorf("%d of %d requests got the page during the flood", ok, xdpRequests)
		}
		if drops < float64(sent)/2 {
			t.Errorf("the limiter dropped %v of a flood of %d", drops, sent)
		}
		if float64(socket) > drops/10 {
			t.Errorf("the socket dropped %d datagrams, the limiter %v: the socket filter, not the XDP program, dropped the flood", socket, drops)
		}
	})

	t.Run("reload", func(t *testing.T) {
		before := s.view(t)
		passed := sumMetric(s.metrics(t), "caddy_rakelimit_packets_total", `verdict="passed"`)
		s.adminDo(t, http.MethodPut, "/config/apps/http/servers/srv0/packet_conn_wrappers/0/limit", "2000")
		after := s.view(t)
		if after.Config.Limit != 2000 || before.Config.Limit == 2000 {
			t.Fatalf("the limit went from %d to %d, want 2000", before.Config.Limit, after.Config.Limit)
		}
		if id := xdpProgram(t, srv); id != prog {
			t.Fatalf("the reload replaced XDP program %s with %q", prog, id)
		}
		if got := sumMetric(s.metrics(t), "caddy_rakelimit_packets_total", `verdict="passed"`); got < passed {
			t.Fatalf("the reload lost the counts: %v passed before, %v after", passed, got)
		}
		s.adminDo(t, http.MethodDelete, "/config/apps/http/servers/srv0/packet_conn_wrappers", "")
		waitNoXDP(t, srv, "a reload that removed rakelimit")
	})

	s.proc.Stop(5 * time.Second)
	waitNoXDP(t, srv, "the first Caddy's stop")
	for _, stop := range []struct {
		name string
		sig  syscall.Signal
	}{{"stop", syscall.SIGTERM}, {"crash", syscall.SIGKILL}} {
		t.Run(stop.name, func(t *testing.T) {
			s := startClientSite(t, bin, engine.ModeXDP, srv, cli, xdpClient, xdpServer.String())
			p := s.proc
			if xdpProgram(t, srv) == "" {
				t.Fatal("ip link shows no XDP program on the veth")
			}
			s.checkMode(t)
			if err := p.Signal(stop.sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("Caddy still runs 10 s after %v", stop.sig)
			}
			waitNoXDP(t, srv, fmt.Sprint(stop.sig))
		})
	}
}

// TestXDPRefusals: caddy validate and caddy run refuse mode xdp without
// CAP_NET_ADMIN (as root without it), saying what to grant, and with
// xdp_interfaces naming an interface that does not exist, naming it.
func TestXDPRefusals(t *testing.T) {
	testutil.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed: %v", err)
	}
	port := testutil.FreePort(t)
	for _, tt := range []struct {
		name, site string
		prefix     []string
		want       []string
	}{
		{"without CAP_NET_ADMIN", "rakelimit {\n\t\tmode xdp\n\t}",
			[]string{setpriv, "--bounding-set=-net_admin", "--inh-caps=-net_admin"},
			[]string{"the XDP program needs CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON", "lacks CAP_NET_ADMIN",
				"setcap cap_bpf,cap_perfmon,cap_net_admin,cap_net_bind_service+p"}},
		{"an interface that does not exist", "rakelimit {\n\t\tmode xdp\n\t\txdp_interfaces rk-none\n\t}", nil,
			[]string{`xdp_interfaces: no interface "rk-none" on this host`}},
	} {
		cfg := writeConfig(t, processCaddyfile(t, port, "", tt.site))
		for _, verb := range []string{"validate", "run"} {
			t.Run(tt.name+"/"+verb, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c := testCaddy(t, tt.prefix, nil, cfg, port)
				out, err := c.Command(ctx, append([]string{verb}, c.ConfigArgs()...)...).CombinedOutput()
				if err == nil || ctx.Err() != nil {
					t.Fatalf("caddy %s: err %v, context %v:\n%s", verb, err, ctx.Err(), out)
				}
				checkRefusal(t, string(out), tt.want)
			})
		}
	}
}

// TestLeastPrivilegeXDP runs Caddy behind the veth as an unprivileged user
// whose binary holds its capabilities permitted only (setcap ...+p). With
// CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON, in mode xdp, the XDP
// program runs natively on the veth (ip link, the metrics), a client
// across it gets the page, and the socket filter limits a flood to
// loopback; without CAP_NET_ADMIN, mode auto asked to run on the veth
// falls back to the socket filter with one WARN line that says what to
// grant, and the veth has no program. Either way no thread of Caddy has
// CAP_BPF, CAP_PERFMON or CAP_NET_ADMIN effective once it has started, and
// every one still holds them permitted.
func TestLeastPrivilegeXDP(t *testing.T) {
	testutil.RequireRoot(t)
	tools := privilegeTools(t)
	for _, tt := range []struct {
		name, fileCaps string
		held           uint64
		// mode is the directive's mode, runs the mode it must run in.
		mode, runs string
		// warn is what the one WARN line of the fallback says; empty:
		// no fallback.
		warn string
	}{
		{"CAP_NET_ADMIN, mode xdp", "cap_bpf,cap_perfmon,cap_net_admin,cap_net_bind_service+p",
			1<<unix.CAP_BPF | 1<<unix.CAP_PERFMON | 1<<unix.CAP_NET_ADMIN, engine.ModeXDP, engine.ModeXDP, ""},
		{"without CAP_NET_ADMIN, mode auto", "cap_bpf,cap_perfmon,cap_net_bind_service+p",
			1<<unix.CAP_BPF | 1<<unix.CAP_PERFMON, engine.ModeAuto, engine.ModeBPF, "grant CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, cli := xdpNamespaces(t)
			dir, bin := unprivilegedDir(t)
			if out, err := exec.Command(tools["setcap"], tt.fileCaps, bin).CombinedOutput(); err != nil {
				t.Fatalf("setcap %s: %v: %s", tt.fileCaps, err, out)
			}
			const limit = 100
			s := &clientSite{mode: tt.runs, port: testutil.FreePort(t), ns: srv, clients: cli,
				admin: filepath.Join(dir, "data", "admin.sock")}
			cfg := filepath.Join(dir, "Caddyfile")
			config := fmt.Sprintf(`{
	admin unix/%s
	skip_install_trust
	local_certs
	http_port %d
	https_port %d
}
localhost:%d, 127.0.0.1:%d, [%s]:%d {
	tls internal
	rakelimit %d {
		mode %s
		xdp_interfaces %s
	}
	respond "hello"
}
`, s.admin, testutil.FreePort(t), s.port, s.port, s.port, xdpServer, s.port, limit, tt.mode, xdpLink)
			if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			prefix := append(s.prefix(srv), tools["setpriv"], fmt.Sprintf("--reuid=%d", testutil.Nobody),
				fmt.Sprintf("--regid=%d", testutil.Nobody), "--clear-groups")
			c := asCaddy(bin, prefix, []string{"XDG_DATA_HOME=" + filepath.Join(dir, "data"),
				"XDG_CONFIG_HOME=" + filepath.Join(dir, "config"), "HOME=" + filepath.Join(dir, "data")})
			c.Config = cfg
			c.Ready = func(ctx context.Context) error {
				if _, err := s.adminGet(ctx, "/config/"); err != nil {
					return fmt.Errorf("admin endpoint: %w", err)
				}
				var err error
				cli.Do(t, func() {
					var body string
					body, _, err = testutil.HTTP3Get(ctx, xdpClient, s.url(xdpServer.String()))
					if err == nil && body != "hello" {
						err = fmt.Errorf("not the page: %.80q", body)
					}
				})
				return err
			}
			s.proc = testutil.StartCaddy(t, c)
			s.checkMode(t)
			if prog := xdpProgram(t, srv); (prog != "") != (tt.runs == engine.ModeXDP) {
				t.Errorf("in mode %s, ip link shows XDP program %q on the veth", tt.runs, prog)
			}
			if tt.runs == engine.ModeXDP {
				if got := testutil.Metric(t, s.metrics(t), "caddy_rakelimit_xdp_listeners", `interface="`+xdpLink+`"`, `attach="native"`); got < 1 {
					t.Errorf("caddy_rakelimit_xdp_listeners{interface=%q, attach=\"native\"} = %v", xdpLink, got)
				}
			}
			if warned := strings.Count(s.proc.Output(), tt.warn); tt.warn != "" && warned != 1 {
				t.Errorf("%d lines say %q, want 1:\n%s", warned, tt.warn, s.proc.Output())
			}
			dropped := func() float64 {
				return testutil.Metric(t, s.metrics(t), "caddy_rakelimit_packets_total", `class="opening"`, `verdict="dropped"`,
					`level="0"`, `family="ipv4"`)
			}
			before := dropped()
			var sent int
			srv.Do(t, func() {
				sent = testutil.FloodInitials(t, floodSrc, testutil.LoopbackFor(floodSrc, uint16(s.port)), 30*limit, time.Second)
			})
			d := uint64(dropped() - before)
			if !testutil.Held(sent, d, limit) {
				t.Errorf("a flood of %d to loopback at 30x the limit: the filter dropped %d", sent, d)
			}
			t.Logf("mode %s: a flood of %d to loopback at 30x the limit, %d dropped", tt.runs, sent, d)
			checkThreadCaps(t, s.proc.Pid(), tt.held, false, "at start")
		})
	}
}
