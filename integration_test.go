//go:build linux

package rakelimit

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/cilium/ebpf"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// These tests run a real Caddy in this process, with HTTP/3 on, and talk to
// it with quic-go's HTTP/3 client and with gtlsclient (ngtcp2). Floods come
// from other loopback addresses, bounded in rate and duration. They need
// root (CAP_BPF); with CI=true a missing privilege fails them.

func requireBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" || os.Getenv("RAKELIMIT_REQUIRE_BPF") == "1" {
		t.Fatal("integration tests need root (CAP_BPF)")
	}
	t.Skip("integration tests need root (CAP_BPF)")
}

// freePort returns a port free for both TCP and UDP on loopback.
func freePort(t *testing.T) int {
	t.Helper()
	for range 50 {
		u, err := net.ListenUDP("udp", &net.UDPAddr{})
		if err != nil {
			t.Fatal(err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// testCaddy is the in-process Caddy of one test.
type testCaddy struct {
	t       *testing.T
	storage string
	port    int // https port of the first site
	// admin is the admin endpoint's port, 0 for none.
	admin int
	// logFile receives Caddy's log as JSON lines when set.
	logFile string
}

// globals are the global options of every test config: nothing written
// outside the test's directory, and by default no admin endpoint and no log.
func (c *testCaddy) globals() string {
	admin, log := "admin off", "output discard"
	if c.admin != 0 {
		admin = fmt.Sprintf("admin localhost:%d", c.admin)
	}
	if c.logFile != "" {
		log = fmt.Sprintf("output file %s\n\t\tformat json", c.logFile)
	}
	return fmt.Sprintf(`{
	%s
	persist_config off
	skip_install_trust
	local_certs
	storage file_system %s
	http_port %d
	https_port %d
	log {
		%s
	}
}
`, admin, c.storage, freePort(c.t), c.port, log)
}

// waitReady retries a request until the site answers over HTTP/3: Caddy
// issues the tls internal certificate in the background after a load.
func (c *testCaddy) waitReady() {
	c.t.Helper()
	url := fmt.Sprintf("https://127.0.0.1:%d/", c.port)
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _, err = h3Get(ctx, legitSrc, url)
		cancel()
		if err == nil {
			return
		}
	}
	c.t.Fatalf("%s never answered over HTTP/3: %v", url, err)
}

// startCaddy loads sites (a Caddyfile without global options, where {port}
// is the https port) and stops Caddy when the test ends.
func startCaddy(t *testing.T, sites string) *testCaddy {
	t.Helper()
	return startCaddyWith(t, &testCaddy{}, sites)
}

// startCaddyWith is startCaddy with the admin endpoint or the log file of c.
func startCaddyWith(t *testing.T, c *testCaddy, sites string) *testCaddy {
	t.Helper()
	requireBPF(t)
	c.t, c.storage, c.port = t, t.TempDir(), freePort(t)
	if err := c.load(sites); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() { caddy.Stop() })
	if strings.Contains(sites, "127.0.0.1:{port}") {
		c.waitReady()
	}
	return c
}

// load adapts and loads a new configuration, as `caddy reload` does.
func (c *testCaddy) load(sites string) error {
	cfg := c.globals() + strings.ReplaceAll(sites, "{port}", strconv.Itoa(c.port))
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		return fmt.Errorf("adapting: %w", err)
	}
	return caddy.Load(js, true)
}

// limiterNamed returns the live limiter called name, or nil.
func limiterNamed(name string) *limiter {
	var found *limiter
	limiters.pool.Range(func(k, v any) bool {
		if k == name {
			found = v.(*limiter)
		}
		return true
	})
	return found
}

func (l *limiter) stats(t *testing.T) (passed, dropped uint64) {
	t.Helper()
	st, err := l.filter.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for fam := range st.Passed {
		passed += st.Passed[fam]
		for _, d := range st.Dropped[fam] {
			dropped += d
		}
	}
	return passed, dropped
}

// h3Get fetches url over HTTP/3 from a socket bound to src, on a new QUIC
// connection, and returns the body and how long it took.
func h3Get(ctx context.Context, src netip.Addr, url string) (string, time.Duration, error) {
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		return "", 0, err
	}
	defer udp.Close()
	qt := &quic.Transport{Conn: udp}
	defer qt.Close()
	rt := &http3.Transport{
		// tls internal: the trust chain is not under test. The name is
		// sent as SNI; without it Caddy picks the certificate by the
		// local address, which a socket hidden from quic-go lacks.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
		Dial: func(ctx context.Context, addr string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			a, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				return nil, err
			}
			return qt.DialEarly(ctx, a, tlsCfg, cfg)
		},
	}
	defer rt.Close()
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return "", time.Since(start), err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return string(body), time.Since(start), err
}

// quicFlood sends QUIC Initial-sized datagrams (1200 bytes with a long
// header, version 1 and random connection IDs and payload, which quic-go must
// try to decrypt) from src to dst at rate packets per second for d. It
// returns the number sent.
func quicFlood(t *testing.T, src netip.Addr, dst netip.AddrPort, rate int, d time.Duration) int {
	t.Helper()
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rng := rand.New(rand.NewPCG(uint64(rate), uint64(d)))
	pkt := make([]byte, 1200)
	const burst = 50
	tick := time.Duration(float64(time.Second) * burst / float64(rate))
	sent := 0
	for end, next := time.Now().Add(d), time.Now(); time.Now().Before(end); {
		for range burst {
			for i := range pkt {
				pkt[i] = byte(rng.Uint32())
			}
			pkt[0] = 0xc0 | pkt[0]&0x0f          // long header, Initial
			copy(pkt[1:], []byte{0, 0, 0, 1, 8}) // version 1, 8-byte DCID
			if _, err := conn.WriteToUDPAddrPort(pkt, dst); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		next = next.Add(tick)
		time.Sleep(time.Until(next))
	}
	return sent
}

// socketDrops reads the kernel's drop counter of the UDP socket on port:
// packets a socket filter refused, or a full receive queue.
func socketDrops(t *testing.T, port int) uint64 {
	t.Helper()
	var total uint64
	for _, file := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 13 || !strings.HasSuffix(fields[1], fmt.Sprintf(":%04X", port)) {
				continue
			}
			n, err := strconv.ParseUint(fields[len(fields)-1], 10, 64)
			if err == nil {
				total += n
			}
		}
		f.Close()
	}
	return total
}

// udpInDatagrams reads the kernel's count of UDP datagrams delivered to
// sockets, which includes those a socket filter let through.
func udpInDatagrams(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.HasPrefix(lines[i], "Udp: ") && strings.HasPrefix(lines[i+1], "Udp: ") {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j, n := range names {
				if n == "InDatagrams" {
					v, _ := strconv.ParseUint(vals[j], 10, 64)
					return v
				}
			}
		}
	}
	t.Fatal("no Udp InDatagrams in /proc/net/snmp")
	return 0
}

const siteWithLimit = `127.0.0.1:{port}, localhost:{port} {
	tls internal
	rakelimit {
		limit %d
		window 1s
	}
	respond "hello over {http.request.proto}"
}
`

var (
	legitSrc = netip.MustParseAddr("127.0.0.5")
	floodSrc = netip.MustParseAddr("127.0.0.6")
)

// percentile returns the p-th percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// TestIntegrationFlood: while a flood of QUIC Initial-sized packets from one
// address hits the HTTP/3 port, requests from another address succeed, and
// the flood is dropped in the kernel: the socket's drop counter and the
// filter's counters rise by about offered - limit. gtlsclient (ngtcp2), a
// client we did not write, gets its page too.
func TestIntegrationFlood(t *testing.T) {
	const limit, rate, seconds = 1000, 20000, 3
	c := startCaddy(t, fmt.Sprintf(siteWithLimit, limit))
	url := fmt.Sprintf("https://127.0.0.1:%d/", c.port)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	ctx := context.Background()

	var quiet []time.Duration
	for range 5 {
		body, d, err := h3Get(ctx, legitSrc, url)
		if err != nil || body != "hello over HTTP/3.0" {
			t.Fatalf("request before the flood: %q, %v", body, err)
		}
		quiet = append(quiet, d)
	}
	lim := limiterNamed(DefaultName)
	if lim == nil {
		t.Fatal("no limiter loaded")
	}
	drops0 := socketDrops(t, c.port)
	_, dropped0 := lim.stats(t)

	var sent int
	done := make(chan struct{})
	go func() { sent = quicFlood(t, floodSrc, dst, rate, seconds*time.Second); close(done) }()
	var lat []time.Duration
	failed := 0
	gtls := ""
	for i := 0; ; i++ {
		select {
		case <-done:
		default:
			if i == 3 {
				gtls = gtlsGet(t, c.port)
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			body, d, err := h3Get(rctx, legitSrc, url)
			cancel()
			if err != nil || body != "hello over HTTP/3.0" {
				failed++
				t.Errorf("request %d during the flood: %q, %v", i, body, err)
			}
			lat = append(lat, d)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		break
	}
	time.Sleep(200 * time.Millisecond)
	drops := socketDrops(t, c.port) - drops0
	_, dropped := lim.stats(t)
	dropped -= dropped0
	// At most a burst (limit x window), the noise margin and one window
	// at the limit per second get through.
	maxPass := uint64(limit * (seconds + 2))
	if dropped+maxPass < uint64(sent) || drops < dropped {
		t.Errorf("flood of %d: filter dropped %d, socket drop counter rose %d; want both >= %d",
			sent, dropped, drops, uint64(sent)-maxPass)
	}
	if !strings.Contains(gtls, "hello over HTTP/3.0") {
		t.Errorf("gtlsclient during the flood got %q", gtls)
	}
	t.Logf("flood: %d packets at %d pps for %d s from %v; filter dropped %d (%.1f%%), socket drops +%d",
		sent, rate, seconds, floodSrc, dropped, 100*float64(dropped)/float64(sent), drops)
	t.Logf("legit from %v: %d of %d requests ok during the flood; latency p50 %v p99 %v (quiet: p50 %v)",
		legitSrc, len(lat)-failed, len(lat), percentile(lat, 0.5), percentile(lat, 0.99), percentile(quiet, 0.5))
}

// gtlsGet fetches the page with ngtcp2's gtlsclient and returns what it
// downloaded.
func gtlsGet(t *testing.T, port int) string {
	t.Helper()
	bin, err := exec.LookPath("gtlsclient")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("gtlsclient (Debian package ngtcp2-client) is missing: %v", err)
		}
		t.Logf("skipping the gtlsclient check: %v", err)
		return "hello over HTTP/3.0"
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// By name: gtlsclient puts an IP literal in the SNI, which the
	// handshake refuses.
	out, err := exec.CommandContext(ctx, bin, "-q", "--exit-on-all-streams-close", "--download="+dir,
		"localhost", strconv.Itoa(port), fmt.Sprintf("https://localhost:%d/", port)).CombinedOutput()
	if err != nil {
		t.Errorf("gtlsclient: %v: %s", err, out)
	}
	body, _ := os.ReadFile(dir + "/index.html")
	return string(body)
}

// TestIntegrationWithoutDirective is the control: without rakelimit the same
// flood reaches userspace (quic-go reads it), nothing drops it in the kernel.
func TestIntegrationWithoutDirective(t *testing.T) {
	const rate, seconds = 20000, 2
	c := startCaddy(t, `127.0.0.1:{port}, localhost:{port} {
	tls internal
	respond "hello"
}
`)
	if _, _, err := h3Get(context.Background(), legitSrc, fmt.Sprintf("https://127.0.0.1:%d/", c.port)); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	drops0, in0 := socketDrops(t, c.port), udpInDatagrams(t)
	sent := quicFlood(t, floodSrc, dst, rate, seconds*time.Second)
	time.Sleep(200 * time.Millisecond)
	drops, in := socketDrops(t, c.port)-drops0, udpInDatagrams(t)-in0
	if drops > uint64(sent)/100 || in < uint64(sent)*9/10 {
		t.Fatalf("flood of %d without rakelimit: socket dropped %d, %d datagrams delivered; want the flood delivered", sent, drops, in)
	}
	t.Logf("without rakelimit: flood of %d, %d datagrams delivered to sockets, socket drops +%d", sent, in, drops)
}

// passRate floods dst for d at rate and returns how many packets per second
// the limiter let through, for each of the d/1s seconds.
func passRate(t *testing.T, lim *limiter, dst netip.AddrPort, rate int, d time.Duration) []float64 {
	t.Helper()
	var out []float64
	done := make(chan struct{})
	// The flood outlasts the last sample by half a second.
	go func() { quicFlood(t, floodSrc, dst, rate, d+time.Second/2); close(done) }()
	defer func() { <-done }()
	prev, _ := lim.stats(t)
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	for range int(d / time.Second) {
		<-tk.C
		p, _ := lim.stats(t)
		out = append(out, float64(p-prev))
		prev = p
	}
	return out
}

func near(got, want, tol float64) bool { return got >= want*(1-tol) && got <= want*(1+tol) }

// TestReloadChangesLimit: a reload with a new limit and window governs the
// running socket within a second, without a new attach and with the counts
// kept.
func TestReloadChangesLimit(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(siteWithLimit, 200))
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	lim := limiterNamed(DefaultName)
	before := passRate(t, lim, dst, 4000, 3*time.Second)
	passed0, dropped0 := lim.stats(t)
	if err := c.load(strings.Replace(fmt.Sprintf(siteWithLimit, 600), "window 1s", "window 2s", 1)); err != nil {
		t.Fatal(err)
	}
	if limiterNamed(DefaultName) != lim || len(lim.conns) != 1 {
		t.Fatalf("the reload replaced the limiter or attached again (%d sockets)", len(lim.conns))
	}
	if lim.set.Limiter.Limit != 600 || lim.set.Limiter.Window != 2*time.Second {
		t.Fatalf("limiter settings after reload: %+v", lim.set.Limiter)
	}
	passed1, dropped1 := lim.stats(t)
	if passed1 < passed0 || dropped1 < dropped0 {
		t.Fatal("the reload reset the counters")
	}
	// Flood for 5 s: the burst of the new, longer window lands in the
	// first seconds; from then on the new limit holds.
	after := passRate(t, lim, dst, 4000, 5*time.Second)
	if len(before) < 3 || len(after) < 5 || !near(before[2], 200, 0.1) || !near(after[4], 600, 0.1) {
		t.Fatalf("passed per second at limit 200: %v; after reloading to 600: %v", before, after)
	}
	t.Logf("passed per second at limit 200: %v; after reloading to 600 with a 2s window: %v", before, after)
}

// TestTwoServers: two listeners with limiters of different names and limits
// keep their own.
func TestTwoServers(t *testing.T) {
	c := startCaddy(t, "")
	other := freePort(t)
	sites := fmt.Sprintf(`127.0.0.1:{port}, localhost:{port} {
	tls internal
	rakelimit {
		name a
		limit 100
	}
	respond "a"
}
127.0.0.1:%d {
	tls internal
	rakelimit {
		name b
		limit 300
	}
	respond "b"
}
`, other)
	if err := c.load(sites); err != nil {
		t.Fatal(err)
	}
	a, b := limiterNamed("a"), limiterNamed("b")
	if a == nil || b == nil {
		t.Fatal("limiters a and b not loaded")
	}
	var ra, rb []float64
	var wg sync.WaitGroup
	wg.Go(func() {
		ra = passRate(t, a, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port)), 3000, 3*time.Second)
	})
	wg.Go(func() {
		rb = passRate(t, b, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(other)), 3000, 3*time.Second)
	})
	wg.Wait()
	if len(ra) < 3 || len(rb) < 3 || !near(ra[2], 100, 0.15) || !near(rb[2], 300, 0.15) {
		t.Fatalf("passed per second: a (limit 100) %v, b (limit 300) %v", ra, rb)
	}
	t.Logf("passed per second: a (limit 100) %v, b (limit 300) %v", ra, rb)
}

// TestReloadRemovesDirective: reloading without rakelimit detaches the
// filter from the socket, which Caddy keeps: the flood then reaches
// userspace again.
func TestReloadRemovesDirective(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(siteWithLimit, 100))
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	drops0 := socketDrops(t, c.port)
	quicFlood(t, floodSrc, dst, 5000, time.Second)
	if socketDrops(t, c.port) == drops0 {
		t.Fatal("the filter dropped nothing")
	}
	if err := c.load("127.0.0.1:{port}, localhost:{port} {\n\ttls internal\n\trespond \"hello\"\n}\n"); err != nil {
		t.Fatal(err)
	}
	if limiterNamed(DefaultName) != nil {
		t.Fatal("limiter still registered after its removal")
	}
	drops1 := socketDrops(t, c.port)
	sent := quicFlood(t, floodSrc, dst, 5000, time.Second)
	if d := socketDrops(t, c.port) - drops1; d > uint64(sent)/100 {
		t.Fatalf("after removing rakelimit the socket still dropped %d of %d", d, sent)
	}
}

// TestFailedReloadKeepsSettings: a reload that fails, in provisioning or in
// starting, leaves the running limiter with its settings.
func TestFailedReloadKeepsSettings(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(siteWithLimit, 200))
	lim := limiterNamed(DefaultName)
	// Two sites of one config disagree on the limiter's settings.
	conflict := fmt.Sprintf(siteWithLimit, 300) + strings.Replace(fmt.Sprintf(siteWithLimit, 400),
		"127.0.0.1:{port}, localhost:{port}", "[::1]:{port}", 1)
	err := c.load(conflict)
	if err == nil || !strings.Contains(err.Error(), "different settings") {
		t.Fatalf("conflicting reload: err = %v", err)
	}
	if limiterNamed(DefaultName) != lim || lim.set.Limiter.Limit != 200 {
		t.Fatalf("after a failed provisioning the limiter is %+v", lim.set.Limiter)
	}
	// A new listener on a taken port fails at start, after the rakelimit
	// app may already have applied the new limit.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	bad := fmt.Sprintf(siteWithLimit, 300) + fmt.Sprintf("http://127.0.0.1:%d {\n\trespond \"x\"\n}\n", port)
	if err := c.load(bad); err == nil {
		t.Fatal("reload onto a taken port succeeded")
	}
	if limiterNamed(DefaultName) != lim || lim.set.Limiter.Limit != 200 {
		t.Fatalf("after a failed start the limiter is %+v", lim.set.Limiter)
	}
	// And a good reload still works.
	if err := c.load(fmt.Sprintf(siteWithLimit, 300)); err != nil || lim.set.Limiter.Limit != 300 {
		t.Fatalf("good reload: %v, limit %d", err, lim.set.Limiter.Limit)
	}
}

// bpfObjects counts the kernel's BPF programs named rakelimit and the maps
// of the rakelimit object, once the count has settled: the kernel frees a
// closed socket's filter after an RCU grace period.
func bpfObjects(t *testing.T) (progs, maps int) {
	t.Helper()
	p, m := countBPFObjects(t)
	for range 30 {
		time.Sleep(100 * time.Millisecond)
		p2, m2 := countBPFObjects(t)
		if p2 == p && m2 == m {
			break
		}
		p, m = p2, m2
	}
	return p, m
}

func countBPFObjects(t *testing.T) (progs, maps int) {
	t.Helper()
	ourMaps := map[string]bool{"cells": true, "configs": true, "active_config": true, "counters": true,
		"prng": true, "test_verdict": true}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			break
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && info.Name == "rakelimit" {
			progs++
		}
		p.Close()
	}
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if err != nil {
			break
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		if info, err := m.Info(); err == nil && ourMaps[info.Name] {
			maps++
		}
		m.Close()
	}
	return progs, maps
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestReloadsDoNotLeak: 100 reloads leave the file descriptors and the BPF
// programs and maps as they were, and stopping Caddy releases them all.
func TestReloadsDoNotLeak(t *testing.T) {
	requireBPF(t)
	progs0, maps0 := bpfObjects(t)
	fds0 := openFDs(t)
	c := &testCaddy{t: t, storage: t.TempDir(), port: freePort(t)}
	t.Cleanup(func() { caddy.Stop() })
	if err := c.load(fmt.Sprintf(siteWithLimit, 100)); err != nil {
		t.Fatal(err)
	}
	c.waitReady()
	progs1, maps1 := bpfObjects(t)
	fds1 := openFDs(t)
	for i := range 100 {
		if err := c.load(fmt.Sprintf(siteWithLimit, 100+i%7)); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
	}
	progs2, maps2 := bpfObjects(t)
	fds2 := openFDs(t)
	if progs2 != progs1 || maps2 != maps1 || fds2 > fds1+2 {
		t.Errorf("after 100 reloads: %d programs, %d maps, %d fds; before: %d, %d, %d", progs2, maps2, fds2, progs1, maps1, fds1)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	progs3, maps3 := bpfObjects(t)
	fds3 := openFDs(t)
	if progs3 != progs0 || maps3 != maps0 || fds3 > fds0+2 {
		t.Errorf("after stopping Caddy: %d programs, %d maps, %d fds; before starting: %d, %d, %d",
			progs3, maps3, fds3, progs0, maps0, fds0)
	}
	t.Logf("running: %d programs, %d maps, %d fds; after 100 reloads %d, %d, %d; stopped: %d, %d, %d (baseline %d, %d, %d)",
		progs1, maps1, fds1, progs2, maps2, fds2, progs3, maps3, fds3, progs0, maps0, fds0)
}

// TestSitesShareOneSocket: several sites on one port, each with the
// directive, chain the wrapper after itself: one attach, one filter.
func TestSitesShareOneSocket(t *testing.T) {
	requireBPF(t)
	progs0, _ := bpfObjects(t)
	c := startCaddy(t, fmt.Sprintf(siteWithLimit, 100)+strings.Replace(fmt.Sprintf(siteWithLimit, 100),
		"127.0.0.1:{port}, localhost:{port}", "[::1]:{port}", 1))
	progs, _ := bpfObjects(t)
	lim := limiterNamed(DefaultName)
	if lim == nil || len(lim.conns) != 1 || progs != progs0+1 {
		t.Fatalf("limiter %v, %d programs loaded (before: %d)", lim, progs, progs0)
	}
	if _, _, err := h3Get(context.Background(), legitSrc, fmt.Sprintf("https://127.0.0.1:%d/", c.port)); err != nil {
		t.Fatal(err)
	}
	_ = c
}
