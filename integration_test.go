//go:build linux

package rakelimit

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/cilium/ebpf"
	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// These tests run a real Caddy in this process, with HTTP/3 on, and talk to
// it with quic-go's HTTP/3 client and with gtlsclient (ngtcp2). Floods come
// from other loopback addresses, bounded in rate and duration. They need
// root (CAP_BPF); with CI=true a missing privilege fails them.

func requireBPF(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
}

// freePort returns a port free for both TCP and UDP on loopback.
func freePort(t *testing.T) int {
	t.Helper()
	return testutil.FreePort(t)
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
	// globalOptions are more global options, written as they are.
	globalOptions string
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
	%s
}
`, admin, c.storage, freePort(c.t), c.port, log, c.globalOptions)
}

// waitReady retries a request until the site answers over HTTP/3: Caddy
// issues the tls internal certificate in the background after a load.
func (c *testCaddy) waitReady() {
	c.t.Helper()
	testutil.WaitHTTP3(c.t, legitSrc, fmt.Sprintf("https://127.0.0.1:%d/", c.port))
}

// waitTLS retries a request over TLS on TCP until https://localhost:port
// answers: Caddy issues the tls internal certificate in the background.
func (c *testCaddy) waitTLS() {
	c.t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // the trust chain is not under test
	defer client.CloseIdleConnections()
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var resp *http.Response
		if resp, err = client.Get(fmt.Sprintf("https://localhost:%d/", c.port)); err == nil {
			resp.Body.Close()
			return
		}
	}
	c.t.Fatalf("https://localhost:%d never answered: %v", c.port, err)
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
func limiterNamed(name string) *engine.Limiter { return limiters.registry.Named(name) }

// limiterStats sums a limiter's passed and dropped datagrams.
func limiterStats(t *testing.T, l *engine.Limiter) (passed, dropped uint64) {
	t.Helper()
	st, err := l.Engine().Stats()
	if err != nil {
		t.Fatal(err)
	}
	for fam := range decide.Families {
		for class := range st.Passed {
			passed += st.Passed[class][fam]
			for _, d := range st.Dropped[class][fam] {
				dropped += d
			}
		}
		passed += st.Negotiation[fam][0] + st.Allowed[fam]
		dropped += st.Negotiation[fam][1]
		for _, d := range st.Invalid[0][fam] {
			dropped += d
		}
	}
	return passed, dropped
}

// h3Get fetches url over HTTP/3 from a socket bound to src, on a new QUIC
// connection, and returns the body and how long it took.
func h3Get(ctx context.Context, src netip.Addr, url string) (string, time.Duration, error) {
	return testutil.HTTP3Get(ctx, src, url)
}

// quicFlood sends QUIC Initial-sized datagrams (testutil.Initials) from src
// to dst at rate packets per second for d. It returns the number sent.
func quicFlood(t *testing.T, src netip.Addr, dst netip.AddrPort, rate int, d time.Duration) int {
	t.Helper()
	return testutil.FloodInitials(t, src, dst, rate, d)
}

// socketDrops reads the kernel's drop counter of the UDP socket on port:
// packets a socket filter refused, or a full receive queue.
func socketDrops(t *testing.T, port int) uint64 {
	t.Helper()
	n, err := backlog.SocketDrops(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// udpInDatagrams reads the kernel's count of UDP datagrams delivered to
// IPv4 sockets, which includes those a socket filter let through; the
// kernel counts a datagram when the reader takes it off the queue.
func udpInDatagrams(t *testing.T) uint64 {
	t.Helper()
	c, err := backlog.ReadUDPCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c.InDatagrams
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
	_, dropped0 := limiterStats(t, lim)

	var sent int
	done := make(chan struct{})
	go func() { sent = quicFlood(t, floodSrc, dst, rate, seconds*time.Second); close(done) }()
	var lat []time.Duration
	failed := 0
	// Requests from legitSrc one after the other until the flood ends,
	// beside gtlsclient's: on a loaded machine a request during the flood
	// takes seconds, and gtlsclient started after the third (as it once
	// was) found the flood over or never ran.
	requests := make(chan struct{})
	go func() {
		defer close(requests)
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
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
		}
	}()
	time.Sleep(500 * time.Millisecond) // the flood under way
	gtlsDuring := true
	select {
	case <-done:
		gtlsDuring = false
	default:
	}
	gtls := gtlsGet(t, c.port)
	<-requests
	if !gtlsDuring {
		t.Fatalf("the flood of %d s ended before gtlsclient started", seconds)
	}
	time.Sleep(200 * time.Millisecond)
	drops := socketDrops(t, c.port) - drops0
	_, dropped := limiterStats(t, lim)
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
		legitSrc, len(lat)-failed, len(lat), testutil.Percentile(lat, 50), testutil.Percentile(lat, 99), testutil.Percentile(quiet, 50))
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
	drops0, in0 := testutil.ReadDrops(t, c.port), udpInDatagrams(t)
	sent := quicFlood(t, floodSrc, dst, rate, seconds*time.Second)
	// The kernel counts a datagram delivered when the reader takes it off
	// the queue; on a loaded machine quic-go is still reading after the
	// flood ends.
	testutil.WaitRead(t, c.port)
	d, in := testutil.ReadDrops(t, c.port), udpInDatagrams(t)-in0
	// No filter dropped anything: what the socket lost, its queue lost
	// (quic-go under the race detector on a busy machine reads slower
	// than 20,000 datagrams a second), so every datagram sent was read or
	// overflowed the queue.
	filtered := d.FilteredSince(drops0)
	overflowed := d.Socket - drops0.Socket - filtered
	if filtered > uint64(sent)/100 || in+overflowed < uint64(sent)*9/10 {
		t.Fatalf("flood of %d without rakelimit: socket's filter dropped %d, its queue %d, %d datagrams delivered; want the flood delivered",
			sent, filtered, overflowed, in)
	}
	t.Logf("without rakelimit: flood of %d, %d datagrams delivered to sockets, %d lost to the full queue, socket filter drops +%d",
		sent, in, overflowed, filtered)
}

// passRate floods dst for d at rate and returns how many packets per second
// the limiter let through, for each of the d/1s seconds.
func passRate(t *testing.T, lim *engine.Limiter, dst netip.AddrPort, rate int, d time.Duration) []float64 {
	t.Helper()
	var out []float64
	done := make(chan struct{})
	// The flood outlasts the last sample by half a second.
	go func() { quicFlood(t, floodSrc, dst, rate, d+time.Second/2); close(done) }()
	defer func() { <-done }()
	// Each rate is over the time that really passed between two reads:
	// on a busy machine (the race detector, parallel packages) a tick may
	// come late, and a count per tick would be off by the delay.
	prev, _ := limiterStats(t, lim)
	prevAt := time.Now()
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	for range int(d / time.Second) {
		<-tk.C
		p, _ := limiterStats(t, lim)
		now := time.Now()
		out = append(out, math.Round(float64(p-prev)/now.Sub(prevAt).Seconds()))
		prev, prevAt = p, now
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
	passed0, dropped0 := limiterStats(t, lim)
	if err := c.load(strings.Replace(fmt.Sprintf(siteWithLimit, 600), "window 1s", "window 2s", 1)); err != nil {
		t.Fatal(err)
	}
	if limiterNamed(DefaultName) != lim || len(listenersOf(lim)) != 1 {
		t.Fatalf("the reload replaced the limiter or attached again (%d sockets)", len(listenersOf(lim)))
	}
	if lim.Setting().Config.Limiter.Limit != 600 || lim.Setting().Config.Limiter.Window != 2*time.Second {
		t.Fatalf("limiter settings after reload: %+v", lim.Setting().Config.Limiter)
	}
	passed1, dropped1 := limiterStats(t, lim)
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
	drops1 := testutil.ReadDrops(t, c.port)
	sent := quicFlood(t, floodSrc, dst, 5000, time.Second)
	if d := testutil.ReadDrops(t, c.port).FilteredSince(drops1); d > uint64(sent)/100 {
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
	if limiterNamed(DefaultName) != lim || lim.Setting().Config.Limiter.Limit != 200 {
		t.Fatalf("after a failed provisioning the limiter is %+v", lim.Setting().Config.Limiter)
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
	if limiterNamed(DefaultName) != lim || lim.Setting().Config.Limiter.Limit != 200 {
		t.Fatalf("after a failed start the limiter is %+v", lim.Setting().Config.Limiter)
	}
	// And a good reload still works.
	if err := c.load(fmt.Sprintf(siteWithLimit, 300)); err != nil || lim.Setting().Config.Limiter.Limit != 300 {
		t.Fatalf("good reload: %v, limit %d", err, lim.Setting().Config.Limiter.Limit)
	}
}

// bpfObjects counts the BPF programs named rakelimit and the maps of the
// rakelimit object that this process holds, once the count has settled: the
// kernel frees a closed socket's filter after an RCU grace period. Only this
// process's objects count: other packages' tests, run beside these by `go
// test ./...`, and other processes on the machine load programs of the same
// name, and a count over the whole kernel moved with them.
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

// countBPFObjects counts the BPF programs named rakelimit that a file
// descriptor of this process holds, and the maps of the rakelimit object
// that a descriptor holds or such a program uses. A socket that holds a
// filter is itself a descriptor, which openFDs counts.
func countBPFObjects(t *testing.T) (progs, maps int) {
	t.Helper()
	ourMaps := map[string]bool{"cells": true, "configs": true, "active_config": true, "counters": true,
		"cpu_state": true, "test_verdict": true}
	progIDs, mapIDs := heldBPFObjects(t)
	for id := range progIDs {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // closed since
		}
		if info, err := p.Info(); err == nil && info.Name == "rakelimit" {
			progs++
			if ids, ok := info.MapIDs(); ok {
				for _, m := range ids {
					mapIDs[m] = true
				}
			}
		}
		p.Close()
	}
	for id := range mapIDs {
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

// heldBPFObjects returns the IDs of the BPF programs and maps that the file
// descriptors of this process refer to, from /proc/self/fdinfo (the
// prog_id and map_id lines the kernel writes for them).
func heldBPFObjects(t *testing.T) (progs map[ebpf.ProgramID]bool, maps map[ebpf.MapID]bool) {
	t.Helper()
	progs, maps = map[ebpf.ProgramID]bool{}, map[ebpf.MapID]bool{}
	ents, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatalf("listing this process's descriptors: %v", err)
	}
	for _, e := range ents {
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue // closed since
		}
		for line := range strings.SplitSeq(string(info), "\n") {
			key, val, ok := strings.Cut(line, ":")
			if !ok || (key != "prog_id" && key != "map_id") {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(val), 10, 32)
			if err != nil {
				t.Fatalf("descriptor %s: %s %q: %v", e.Name(), key, val, err)
			}
			if key == "prog_id" {
				progs[ebpf.ProgramID(id)] = true
			} else {
				maps[ebpf.MapID(id)] = true
			}
		}
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
	if lim == nil || len(listenersOf(lim)) != 1 || progs != progs0+1 {
		t.Fatalf("limiter %v, %d programs loaded (before: %d)", lim, progs, progs0)
	}
	if _, _, err := h3Get(context.Background(), legitSrc, fmt.Sprintf("https://127.0.0.1:%d/", c.port)); err != nil {
		t.Fatal(err)
	}
	_ = c
}

// floodDropped floods the listener of c with QUIC Initial-sized packets at
// 30 times limit for one second from floodSrc and reports how many it sent
// and how many the filters of this process dropped.
func (c *testCaddy) floodDropped(limit int) (sent int, dropped uint64) {
	c.t.Helper()
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))
	d0, p0 := filterDrops(c.t), passedUserspace(c.t)
	sent = quicFlood(c.t, floodSrc, dst, 30*limit, time.Second)
	return sent, floodHeld(c.t, sent, d0, p0)
}

// floodHeld reports how many of the sent datagrams of a flood the limiters
// kept from quic-go: in bpf mode, their filters' drops since d0; in
// userspace mode, what the limiters did not pass since p0 (read from
// passedUserspace), once quic-go has read everything queued: the kernel
// pre-filter's drops are counted only in the socket's drop counter, beside
// receive-queue overflows that only a system-wide counter tells apart, and
// other tests' overflows move that one.
func floodHeld(t *testing.T, sent int, d0, p0 uint64) uint64 {
	t.Helper()
	if p0 == noUserspace {
		return filterDrops(t) - d0
	}
	waitDecided(t)
	passed := passedUserspace(t) - p0
	return uint64(sent) - min(passed, uint64(sent))
}

// noUserspace is passedUserspace when no limiter runs in userspace mode.
const noUserspace = ^uint64(0)

// passedUserspace sums what the limiters in userspace mode passed, or
// returns noUserspace when none runs in that mode.
func passedUserspace(t *testing.T) uint64 {
	t.Helper()
	n, any := uint64(0), false
	for _, l := range limiters.registry.Limiters() {
		if l.Mode() == engine.ModeUserspace {
			p, _ := limiterStats(t, l)
			n, any = n+p, true
		}
	}
	if !any {
		return noUserspace
	}
	return n
}

// waitDecided waits until quic-go has read every datagram queued on the
// sockets of the limiters in userspace mode: the userspace limiter decides
// a datagram when it is read, not when it arrives.
func waitDecided(t *testing.T) {
	t.Helper()
	for _, l := range limiters.registry.Limiters() {
		if l.Mode() == engine.ModeUserspace {
			for _, conn := range l.Sockets() {
				testutil.WaitEmpty(t, conn)
			}
		}
	}
}

// filterDrops sums the packets that the filters of every loaded limiter
// have dropped, from their own counters: the socket's drop counter also
// counts receive-queue overflows.
func filterDrops(t *testing.T) uint64 {
	t.Helper()
	var n uint64
	for _, l := range limiters.registry.Limiters() {
		_, d := limiterStats(t, l)
		n += d
	}
	return n
}

// held reports whether a flood of sent packets was held to limit: all but
// a burst and a second at the limit, with margin, dropped.
func held(sent int, dropped uint64, limit int) bool { return testutil.Held(sent, dropped, limit) }

// TestReloadOntoRunningListener: Caddy does not call packet conn wrappers
// on a socket it keeps across a reload. A reload that adds rakelimit to a
// running listener, or renames its limiter, must not be accepted while the
// listener stays unprotected: either Caddy refuses it, saying to restart,
// and the configuration in force keeps its protection (or lack of it), or
// the flood at 30 times the limit is dropped. A renamed limiter is not
// reported as removed, and reloading the original file keeps protection.
func TestReloadOntoRunningListener(t *testing.T) {
	const limit = 100
	plain := "127.0.0.1:{port}, localhost:{port} {\n\ttls internal\n\trespond \"hello\"\n}\n"
	named := func(name string) string {
		return strings.Replace(fmt.Sprintf(siteWithLimit, limit), "window 1s", "window 1s\n\t\tname "+name, 1)
	}
	tests := []struct {
		name, first, reload string
		// firstProtected says whether the first configuration has
		// rakelimit on the listener.
		firstProtected bool
	}{
		{"add rakelimit", plain, fmt.Sprintf(siteWithLimit, limit), false},
		{"rename the limiter", named("a"), named("b"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			c := startCaddyWith(t, &testCaddy{logFile: logFile}, tt.first)
			err := c.load(tt.reload)
			sent, dropped := c.floodDropped(limit)
			protected := held(sent, dropped, limit)
			switch {
			case err == nil && !protected:
				t.Fatalf("reload accepted, then a flood of %d at 30x the limit: %d dropped: listener silently unprotected", sent, dropped)
			case err != nil && !strings.Contains(err.Error(), "restart Caddy"):
				t.Fatalf("reload refused without saying to restart: %v", err)
			case err != nil && protected != tt.firstProtected:
				t.Fatalf("reload refused, but the flood's fate changed: %d of %d dropped", dropped, sent)
			}
			t.Logf("reload: %v; flood of %d at 30x the limit: %d dropped", err, sent, dropped)
			if n := len(logLines(t, logFile, "rakelimit removed from the configuration: listener no longer protected")); n > 0 {
				t.Errorf("%d log lines say rakelimit was removed", n)
			}
			if err := c.load(tt.first); err != nil {
				t.Fatalf("reloading the original configuration: %v", err)
			}
			sent, dropped = c.floodDropped(limit)
			if held(sent, dropped, limit) != tt.firstProtected {
				t.Fatalf("after reloading the original configuration (rakelimit: %v): %d of %d dropped", tt.firstProtected, dropped, sent)
			}
		})
	}
}

// TestTwoNamesOnOneListener: two sites of one listener with limiters of
// different names would share one socket, which one filter protects: the
// configuration is refused at provisioning, naming both limiters and the
// listener, and nothing is loaded.
func TestTwoNamesOnOneListener(t *testing.T) {
	c := startCaddy(t, "")
	named := func(addr, name string) string {
		return strings.Replace(strings.Replace(fmt.Sprintf(siteWithLimit, 100), "window 1s", "window 1s\n\t\tname "+name, 1),
			"127.0.0.1:{port}, localhost:{port}", addr, 1)
	}
	err := c.load(named("127.0.0.1:{port}, localhost:{port}", "a") + named("[::1]:{port}", "b"))
	wantErrContaining(t, err, `rakelimit "a"`, `rakelimit "b"`, fmt.Sprintf(":%d", c.port), "same name")
	if limiterNamed("a") != nil || limiterNamed("b") != nil {
		t.Error("a limiter stayed loaded after the refused configuration")
	}
	t.Logf("refused: %v", err)
}

// TestNoHTTP3Warns: rakelimit on a server that opens no HTTP/3 socket
// protects nothing; provisioning warns, naming the server and why.
func TestNoHTTP3Warns(t *testing.T) {
	const msg = "rakelimit protects nothing on this server: it has no HTTP/3 listener"
	tests := []struct {
		name, globals, sites string
		why                  string // "" for no warning
	}{
		{"http site", "", "http://127.0.0.1:{other} {\n\trakelimit 100\n\trespond \"x\"\n}\n", "HTTP/3 needs TLS"},
		{"protocols h1 h2", "servers {\n\t\tprotocols h1 h2\n\t\tpacket_conn_wrappers {\n\t\t\trakelimit 100\n\t\t}\n\t}",
			"localhost:{port} {\n\ttls internal\n\trespond \"x\"\n}\n", "leave out h3"},
		{"control: HTTPS with HTTP/3", "", fmt.Sprintf(siteWithLimit, 100), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			sites := strings.ReplaceAll(tt.sites, "{other}", strconv.Itoa(freePort(t)))
			c := startCaddyWith(t, &testCaddy{logFile: logFile, globalOptions: tt.globals}, sites)
			if strings.HasPrefix(sites, "localhost:") {
				c.waitTLS() // the certificate is written before the test's directory goes
			}
			lines := logLines(t, logFile, msg)
			switch {
			case tt.why == "" && len(lines) != 0:
				t.Fatalf("warned %v", lines)
			case tt.why == "":
			case len(lines) != 1:
				t.Fatalf("%d warnings %q, want 1", len(lines), msg)
			default:
				why, _ := lines[0]["why"].(string)
				if lines[0]["level"] != "warn" || lines[0]["server"] != "srv0" || !strings.Contains(why, tt.why) {
					t.Fatalf("warning %v, want level warn, server srv0, why containing %q", lines[0], tt.why)
				}
				t.Logf("warning: %v", lines[0])
			}
		})
	}
}

// allowLines writes n allow prefixes, 100 to a line, from 127.1.0.0 up.
func allowLines(n int) string {
	var b strings.Builder
	for i := range n {
		if i%100 == 0 {
			b.WriteString("\n\t\tallow")
		}
		fmt.Fprintf(&b, " 127.1.%d.%d", i/256, i%256)
	}
	return b.String()
}

// TestReloadTooManyAllowPrefixes: a reload from limit 100 to limit 5000 with
// 1,100 allow prefixes, more than the kernel's allowlist holds, is refused
// at provisioning, naming the count and the cap, and changes nothing: the
// kernel still enforces 100 on a flood, the allowlist keeps its 10 entries,
// the admin view and the metrics say 100; a later reload that adds a prefix
// works.
func TestReloadTooManyAllowPrefixes(t *testing.T) {
	const limit = 100
	site := func(limit, prefixes int) string {
		return strings.Replace(fmt.Sprintf(siteWithLimit, limit), "window 1s", "window 1s"+allowLines(prefixes), 1)
	}
	c := startCaddyWith(t, &testCaddy{admin: freePort(t)}, site(limit, 10))
	lim := limiterNamed(DefaultName)
	err := c.load(site(5000, 1100))
	wantErrContaining(t, err, "1100 IPv4 prefixes", "1024")
	if n, err := kernelOf(t, lim).AllowEntries(); err != nil || n != 10 {
		t.Errorf("the kernel's allowlist has %d entries (%v), want the 10 configured", n, err)
	}
	if lim.Setting().Config.Limiter.Limit != limit {
		t.Errorf("the limiter's settings say limit %d", lim.Setting().Config.Limiter.Limit)
	}
	_, m := c.adminGet("/metrics")
	if got := metric(t, m, "caddy_rakelimit_limit_packets_per_second", `class="opening"`, `level="0"`); got != limit {
		t.Errorf("metrics say limit %v", got)
	}
	_, view := c.adminGet("/rakelimit/")
	if !strings.Contains(view, fmt.Sprintf(`"limit":%d,`, limit)) {
		t.Errorf("admin view: %s", view)
	}
	_, dropped0 := limiterStats(t, lim)
	sent, _ := c.floodDropped(limit)
	if _, dropped := limiterStats(t, lim); !held(sent, dropped-dropped0, limit) {
		t.Errorf("a flood of %d at 30x the old limit: the filter dropped %d: the kernel does not enforce %d", sent, dropped-dropped0, limit)
	}
	if err := c.load(site(limit, 11)); err != nil {
		t.Fatalf("reload adding a prefix: %v", err)
	}
	if n, err := kernelOf(t, lim).AllowEntries(); err != nil || n != 11 {
		t.Errorf("after adding a prefix the allowlist has %d entries (%v), want 11", n, err)
	}
	t.Logf("refused: %v", err)
}

// TestReloadSwitchesConfigurationOnce: applying new settings (limit, dry
// run and allowlist together) switches the filter's configuration slot
// once, so that no packet can read a slot that is being rewritten.
func TestReloadSwitchesConfigurationOnce(t *testing.T) {
	requireBPF(t)
	l, err := engine.New("switch-once", decide.Config{Limiter: sketch.Config{Limit: 100, Window: time.Second}}, engine.ModeBPF, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i, s := range []decide.Config{
		{Limiter: sketch.Config{Limit: 600, Window: 2 * time.Second}, DryRun: true,
			Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
		{Limiter: sketch.Config{Limit: 200, Window: time.Second}},
	} {
		before, err := kernelOf(t, l).ActiveSlot()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Put(engine.Setting{Config: s, Logger: zap.NewNop()}); err != nil {
			t.Fatal(err)
		}
		after, err := kernelOf(t, l).ActiveSlot()
		if err != nil {
			t.Fatal(err)
		}
		if after == before {
			t.Fatalf("reload %d: the configuration slot in force is still %d: it switched twice (or not at all)", i, after)
		}
	}
}

// kernelOf returns the limiter's BPF filter; the test fails if it runs in
// userspace.
func kernelOf(t *testing.T, l *engine.Limiter) *kernel.Program {
	t.Helper()
	k, ok := engine.Kernel(l.Engine())
	if !ok {
		t.Fatalf("limiter %q runs in %s mode, not bpf", l.Name(), l.Mode())
	}
	return k
}

// listenersOf returns the open sockets the limiter protects.
func listenersOf(l *engine.Limiter) []string {
	_, addrs := l.Snapshot()
	return addrs
}
