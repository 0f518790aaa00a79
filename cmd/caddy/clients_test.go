//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// These tests run real HTTP/3 clients against Caddy with rakelimit, in the
// bpf and the userspace modes, to show that the filter breaks none of what
// a client does: quic-go's http3 client (in this process), ngtcp2's
// gtlsclient (Debian's ngtcp2-client) and headless Chromium (Debian's
// chromium). Each case asserts the client's success (the page's marker, its
// status) and, where it is cheap, that the filter counted datagrams of the
// client's family as verified against what the server sent (any kind:
// caddy_rakelimit_verified_packets_total summed over how). A missing client
// skips its cases, or fails them in CI (testutil.SkipOrFail).
//
// Caddy and every client run in a network namespace the test makes, with
// its loopback only (the handshakes at 30% loss: two, joined by a veth
// pair): Chromium, even headless, resolves names and probes the network on
// its own, and there that goes nowhere.

// pageMarker is in the page every client fetches: a body without it is not
// the page.
const pageMarker = "rakelimit-real-client-page"

// pageHTML is the page Caddy serves (file_server), small and complete, so
// that Chromium's DOM holds the marker once it loaded.
const pageHTML = `<!doctype html><html><head><title>rakelimit</title></head><body><p id="marker">` + pageMarker + `</p></body></html>
`

// clientSite is a Caddy of a test's own, in a network namespace, serving
// pageHTML over HTTPS and HTTP/3 (tls internal, Caddy's local CA) behind
// rakelimit in one mode (or, in modeWithout, without it), with an access
// log and its admin endpoint on a Unix socket.
type clientSite struct {
	mode string
	port int
	// bin is the Caddy binary it runs.
	bin string
	// ns is Caddy's network namespace, clients the clients'.
	ns, clients *testutil.NetNS
	// admin is the admin endpoint's socket.
	admin string
	// data is Caddy's XDG_DATA_HOME: its local CA's certificates.
	data string
	// accessLog is the site's access log (JSON lines).
	accessLog string
	// proc is Caddy's process.
	proc *testutil.CaddyProcess
}

// startClientSite starts bin as a clientSite in mode, in namespace ns,
// ready once a quic-go request from src, in namespace clients, got an
// answer from host (an address of ns).
func startClientSite(t *testing.T, bin, mode string, ns, clients *testutil.NetNS, src netip.Addr, host string) *clientSite {
	t.Helper()
	dir := t.TempDir()
	s := &clientSite{mode: mode, port: testutil.FreePort(t), bin: bin, ns: ns, clients: clients,
		admin: filepath.Join(dir, "admin.sock"), data: filepath.Join(dir, "data"), accessLog: filepath.Join(dir, "access.log")}
	www := filepath.Join(dir, "www")
	if err := os.Mkdir(www, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte(pageHTML), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fmt.Sprintf(`{
	admin unix/%s
	skip_install_trust
	local_certs
	http_port %d
	https_port %d
}
localhost:%d, 127.0.0.1:%d, [::1]:%d, %s {
	tls internal
	%s
	log {
		output file %s
		format json
	}
	root * %s
	file_server
}
`, s.admin, testutil.FreePort(t), s.port, s.port, s.port, s.port, net.JoinHostPort(host, fmt.Sprint(s.port)), rakelimitBlock(mode), s.accessLog, www))
	c := asCaddy(bin, s.prefix(ns), []string{"XDG_DATA_HOME=" + s.data, "XDG_CONFIG_HOME=" + filepath.Join(dir, "config")})
	c.Config = cfg
	url := s.url(host)
	c.Ready = func(ctx context.Context) error {
		if _, err := s.adminGet(ctx, "/config/"); err != nil {
			return fmt.Errorf("admin endpoint: %w", err)
		}
		var err error
		clients.Do(t, func() { _, _, err = testutil.HTTP3Get(ctx, src, url) })
		return err
	}
	s.proc = testutil.StartCaddy(t, c)
	if mode != modeWithout {
		s.checkMode(t)
	}
	return s
}

// modeWithout is the mode of a clientSite without rakelimit: Caddy as it
// is, for comparison. It has none of the filter's metrics.
const modeWithout = "without rakelimit"

// rakelimitBlock is the site's rakelimit directive in mode; for
// modeWithout, a comment.
func rakelimitBlock(mode string) string {
	if mode == modeWithout {
		return "# without rakelimit"
	}
	return fmt.Sprintf("rakelimit {\n\t\tmode %s\n\t}", mode)
}

// prefix runs a command in namespace ns.
func (s *clientSite) prefix(ns *testutil.NetNS) []string {
	return []string{"ip", "netns", "exec", ns.Name()}
}

// adminGet fetches path from Caddy's admin endpoint; another status than
// 200 is an error.
func (s *clientSite) adminGet(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.admin)
	}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost"+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return string(b), nil
}

// metrics is a scrape of Caddy's metrics.
func (s *clientSite) metrics(t *testing.T) string {
	t.Helper()
	m, err := s.adminGet(context.Background(), "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// checkMode fails t unless the limiter runs in s.mode.
func (s *clientSite) checkMode(t *testing.T) {
	t.Helper()
	if got := testutil.Metric(t, s.metrics(t), "caddy_rakelimit_mode", `mode="`+s.mode+`"`); got != 1 {
		t.Fatalf("caddy_rakelimit_mode{mode=%q} = %v, want 1", s.mode, got)
	}
}

// verified is the count of datagrams of family ("ipv4" or "ipv6") that
// the filter verified against what the server sent, by any kind.
func (s *clientSite) verified(t *testing.T, family string) float64 {
	t.Helper()
	return sumMetric(s.metrics(t), "caddy_rakelimit_verified_packets_total", `family="`+family+`"`)
}

// refused is the count of datagrams of family ("ipv4" or "ipv6") the
// filter refused: dropped at a level or invalid (a limited one passes).
func (s *clientSite) refused(t *testing.T, family string) float64 {
	t.Helper()
	m := s.metrics(t)
	return sumMetric(m, "caddy_rakelimit_packets_total", `family="`+family+`"`, `verdict="dropped"`) +
		sumMetric(m, "caddy_rakelimit_packets_total", `family="`+family+`"`, `verdict="invalid"`)
}

// expectVerified runs fn, then checks that the filter verified datagrams
// of family meanwhile: the client's, when nothing else of that family
// reaches Caddy.
func (s *clientSite) expectVerified(t *testing.T, family string, fn func()) {
	t.Helper()
	before := s.verified(t, family)
	fn()
	if t.Failed() {
		return
	}
	after := s.verified(t, family)
	if after <= before {
		t.Errorf("the filter verified no %s datagram while the client ran (%v before, %v after)", family, before, after)
	}
	t.Logf("%s mode: %v %s datagrams verified while the client ran", s.mode, after-before, family)
}

// url is the page's address at host (an address, or localhost).
func (s *clientSite) url(host string) string {
	return "https://" + net.JoinHostPort(host, fmt.Sprint(s.port)) + "/"
}

// udp opens a UDP socket on src (port 0: any) in the clients' namespace,
// closed when t ends.
func (s *clientSite) udp(t testing.TB, src netip.Addr) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	s.clients.Do(t, func() { c = testutil.Sender(t, netip.AddrPortFrom(src, 0)) })
	return c
}

// h3Requests counts the access log's HTTP/3 requests answered 200 whose
// User-Agent contains agent.
func (s *clientSite) h3Requests(t *testing.T, agent string) int {
	t.Helper()
	b, err := os.ReadFile(s.accessLog)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	n := 0
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		var e struct {
			Request struct {
				Proto   string              `json:"proto"`
				Headers map[string][]string `json:"headers"`
			} `json:"request"`
			Status int `json:"status"`
		}
		if json.Unmarshal(line, &e) != nil || e.Request.Proto != "HTTP/3.0" || e.Status != http.StatusOK {
			continue
		}
		if strings.Contains(strings.Join(e.Request.Headers["User-Agent"], " "), agent) {
			n++
		}
	}
	return n
}

// spkiList is Chromium's --ignore-certificate-errors-spki-list for Caddy's
// local CA: the base64 SHA-256 of the SubjectPublicKeyInfo of its root and
// intermediate certificates. Chromium refuses QUIC to an unknown root
// without it.
func (s *clientSite) spkiList(t *testing.T) string {
	t.Helper()
	var hashes []string
	for _, name := range []string{"root.crt", "intermediate.crt"} {
		b, err := os.ReadFile(filepath.Join(s.data, "caddy", "pki", "authorities", "local", name))
		if err != nil {
			t.Fatalf("Caddy's local CA: %v", err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			t.Fatalf("Caddy's local CA: no PEM block in %s", name)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("Caddy's local CA: %s: %v", name, err)
		}
		sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
		hashes = append(hashes, base64.StdEncoding.EncodeToString(sum[:]))
	}
	return strings.Join(hashes, ",")
}

// TestClients runs each real client's cases against one Caddy per mode:
// a handshake and a request; 0-RTT resumption; a new source port
// mid-connection (NAT rebinding); a move to a new address mid-connection;
// then, as they flood, a handshake after a Retry, and Chromium under a
// flood from one address and under one from 256 (in turns with a Caddy
// without rakelimit, for comparison); last, against a Caddy of their own
// behind a lossy link, 50 handshakes at 30% loss.
func TestClients(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		name string
		run  func(t *testing.T, s *clientSite)
	}{
		{"handshake/quic-go", handshakeQUICGo},
		{"handshake/ngtcp2", handshakeNgtcp2},
		{"handshake/chromium", handshakeChromium},
		{"0-RTT/quic-go", zeroRTTQUICGo},
		{"0-RTT/ngtcp2", zeroRTTNgtcp2},
		{"rebinding/quic-go", rebindingQUICGo},
		{"rebinding/ngtcp2", rebindingNgtcp2},
		{"migration/quic-go", migrationQUICGo},
		{"migration/ngtcp2 new port", migrationNgtcp2},
		// The floods come last: the filter forgets them within its
		// window, but nothing need wait for it.
		{"retry/quic-go", retryQUICGo},
		{"retry/ngtcp2", retryNgtcp2},
		{"retry/chromium", retryChromium},
		{"flood/chromium", floodChromium},
		{"flood/chromium 256 sources", floodChromiumSpread},
	}
	bin := clientsCaddy(t)
	for _, mode := range []string{engine.ModeBPF, engine.ModeUserspace} {
		t.Run(mode, func(t *testing.T) {
			t.Run("site", func(t *testing.T) {
				ns := testutil.NewNetNS(t)
				s := startClientSite(t, bin, mode, ns, ns, legitSrc, "127.0.0.1")
				for _, c := range cases {
					t.Run(c.name, func(t *testing.T) { c.run(t, s) })
				}
				s.checkMode(t)
			})
			t.Run("handshakeloss", func(t *testing.T) { handshakeLoss(t, bin, mode) })
		})
	}
}

// clientsCaddy is the Caddy the clients talk to: this test binary, which
// plays Caddy, or, when it is built with the race detector, a Caddy built
// from ./cmd/caddy without it (the race detector has the in-process
// tests). A race-instrumented Caddy handles Initials several times slower:
// the retry and flood cases, which a plain Caddy keeps up with, overwhelm
// it, with rakelimit or without it.
func clientsCaddy(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		return self
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "caddy")
	cmd := exec.Command(goBin, "build", "-o", bin, ".")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		testutil.SkipOrFail(t, "building Caddy without the race detector: %v\n%s", err, out)
	}
	t.Logf("built Caddy without the race detector in %v", time.Since(start).Round(time.Second))
	return bin
}

// clientTimeout bounds each client's run: generous, for a loaded machine
// and a race-instrumented Caddy; a verdict never depends on it.
const clientTimeout = 60 * time.Second

// The quic-go client's sources, one per case.
var (
	handshakeSrc  = netip.MustParseAddr("127.0.0.21")
	zeroRTTSrc    = netip.MustParseAddr("127.0.0.22")
	rebindingSrc  = netip.MustParseAddr("127.0.0.23")
	migrationFrom = netip.MustParseAddr("127.0.0.2")
	migrationTo   = netip.MustParseAddr("127.0.0.3")
)

// h3Client is quic-go's HTTP/3 client on a quic.Transport of the test's
// own; it counts the QUIC connections it dials, so that a test can tell
// that requests stayed on one connection.
type h3Client struct {
	rt    *http3.Transport
	dials atomic.Int32
	conn  atomic.Pointer[quic.Conn]
	// dialTo, when valid, is where it dials instead of the URL's host.
	dialTo netip.AddrPort
}

// newH3Client makes a client that dials over tr (with DialEarly, for
// 0-RTT), sends localhost as the server name, does not check the
// certificate (tls internal) and keeps its session tickets in sessions
// (nil: none). qc may be nil. It is closed when t ends.
func newH3Client(t testing.TB, tr *quic.Transport, sessions tls.ClientSessionCache, qc *quic.Config) *h3Client {
	c := &h3Client{}
	c.rt = &http3.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "localhost", ClientSessionCache: sessions},
		QUICConfig:      qc,
		Dial: func(ctx context.Context, addr string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			a, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				return nil, err
			}
			if c.dialTo.IsValid() {
				a = net.UDPAddrFromAddrPort(c.dialTo)
			}
			c.dials.Add(1)
			conn, err := tr.DialEarly(ctx, a, tlsCfg, cfg)
			if err == nil {
				c.conn.Store(conn)
			}
			return conn, err
		},
	}
	t.Cleanup(func() { c.rt.Close() })
	return c
}

// get fetches url with method (GET, or http3.MethodGet0RTT) within
// timeout and fails unless the answer is 200 with the page.
func (c *h3Client) get(method, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("%s %s: reading the body: %w", method, url, err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s %s: status %s", method, url, resp.Status)
	case !strings.Contains(string(body), pageMarker):
		return fmt.Errorf("%s %s: not the page: %q", method, url, body)
	}
	return nil
}

// quicTransport is a quic.Transport on conn, closed when t ends.
func quicTransport(t testing.TB, conn net.PacketConn) *quic.Transport {
	tr := &quic.Transport{Conn: conn}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func handshakeQUICGo(t *testing.T, s *clientSite) {
	s.expectVerified(t, "ipv4", func() {
		c := newH3Client(t, quicTransport(t, s.udp(t, handshakeSrc)), nil, nil)
		if err := c.get(http.MethodGet, s.url("127.0.0.1"), clientTimeout); err != nil {
			t.Fatal(err)
		}
		c.rt.Close()
	})
}

// zeroRTTQUICGo gets the page on one connection, keeping the session
// ticket, then again on a new connection in 0-RTT, which must have been
// used.
func zeroRTTQUICGo(t *testing.T, s *clientSite) {
	sessions := &ticketCache{ClientSessionCache: tls.NewLRUClientSessionCache(4), put: make(chan struct{}, 8)}
	s.expectVerified(t, "ipv4", func() {
		first := newH3Client(t, quicTransport(t, s.udp(t, zeroRTTSrc)), sessions, nil)
		if err := first.get(http.MethodGet, s.url("127.0.0.1"), clientTimeout); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sessions.put:
		case <-time.After(clientTimeout):
			t.Fatal("no session ticket from Caddy")
		}
		first.rt.Close()
		second := newH3Client(t, quicTransport(t, s.udp(t, zeroRTTSrc)), sessions, nil)
		if err := second.get(http3.MethodGet0RTT, s.url("127.0.0.1"), clientTimeout); err != nil {
			t.Fatal(err)
		}
		if conn := second.conn.Load(); !conn.ConnectionState().Used0RTT {
			t.Fatal("the second connection did not use 0-RTT")
		}
		second.rt.Close()
	})
}

// ticketCache is a session cache that signals each ticket stored.
type ticketCache struct {
	tls.ClientSessionCache
	put chan struct{}
}

// Put stores cs and signals it.
func (c *ticketCache) Put(key string, cs *tls.ClientSessionState) {
	c.ClientSessionCache.Put(key, cs)
	if cs != nil {
		select {
		case c.put <- struct{}{}:
		default:
		}
	}
}

// requestsEachSide is how many requests the migration cases make before
// and after the move.
const requestsEachSide = 5

// rebindingQUICGo moves the client's connection to a new socket on the same
// address (a new source port, as a NAT rebinding does) after a few
// requests; the requests after it continue on the same connection.
func rebindingQUICGo(t *testing.T, s *clientSite) {
	s.expectVerified(t, "ipv4", func() {
		rc := &rebinder{cur: s.udp(t, rebindingSrc)}
		c := newH3Client(t, quicTransport(t, rc), nil, nil)
		for i := range 2 * requestsEachSide {
			if i == requestsEachSide {
				from := rc.LocalAddr()
				rc.rebind(s.udp(t, rebindingSrc))
				t.Logf("rebound from %v to %v", from, rc.LocalAddr())
			}
			if err := c.get(http.MethodGet, s.url("127.0.0.1"), clientTimeout); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		if n := c.dials.Load(); n != 1 {
			t.Fatalf("%d connections dialled, want 1: the connection did not survive the new port", n)
		}
		c.rt.Close()
	})
}

// rebinder is a PacketConn whose socket rebind replaces with another,
// closing the old one, as a NAT that forgot its mapping does: quic-go
// keeps reading and writing through it.
type rebinder struct {
	mu  sync.Mutex
	cur *net.UDPConn
}

// conn is the socket in use.
func (r *rebinder) conn() *net.UDPConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// rebind moves to the socket c and closes the old one.
func (r *rebinder) rebind(c *net.UDPConn) {
	r.mu.Lock()
	old := r.cur
	r.cur = c
	r.mu.Unlock()
	old.Close()
}

// ReadFrom reads from the socket in use; a read that failed because rebind
// closed its socket goes on with the new one.
func (r *rebinder) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		c := r.conn()
		n, a, err := c.ReadFrom(b)
		if err != nil && c != r.conn() {
			continue
		}
		return n, a, err
	}
}

// WriteTo writes through the socket in use; a write that failed because
// rebind closed its socket meanwhile goes again through the new one.
func (r *rebinder) WriteTo(b []byte, a net.Addr) (int, error) {
	for {
		c := r.conn()
		n, err := c.WriteTo(b, a)
		if err != nil && c != r.conn() {
			continue
		}
		return n, err
	}
}

// Close closes the socket in use.
func (r *rebinder) Close() error { return r.conn().Close() }

// LocalAddr is the address of the socket in use.
func (r *rebinder) LocalAddr() net.Addr { return r.conn().LocalAddr() }

// SetDeadline sets the deadlines of the socket in use.
func (r *rebinder) SetDeadline(t time.Time) error { return r.conn().SetDeadline(t) }

// SetReadDeadline sets the read deadline of the socket in use.
func (r *rebinder) SetReadDeadline(t time.Time) error { return r.conn().SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline of the socket in use.
func (r *rebinder) SetWriteDeadline(t time.Time) error { return r.conn().SetWriteDeadline(t) }

// migrationQUICGo moves the client's connection from one loopback address
// to another (quic-go's client-side path migration: a new path, probed,
// then switched to) after a few requests; the requests after it continue
// on the same connection.
func migrationQUICGo(t *testing.T, s *clientSite) {
	s.expectVerified(t, "ipv4", func() {
		c := newH3Client(t, quicTransport(t, s.udp(t, migrationFrom)), nil, nil)
		for i := range 2 * requestsEachSide {
			if i == requestsEachSide {
				path, err := c.conn.Load().AddPath(quicTransport(t, s.udp(t, migrationTo)))
				if err != nil {
					t.Fatalf("adding a path from %v: %v", migrationTo, err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
				err = path.Probe(ctx)
				cancel()
				if err != nil {
					t.Fatalf("probing the path from %v: %v", migrationTo, err)
				}
				if err := path.Switch(); err != nil {
					t.Fatalf("switching to the path from %v: %v", migrationTo, err)
				}
				t.Logf("moved from %v to %v", migrationFrom, migrationTo)
			}
			if err := c.get(http.MethodGet, s.url("127.0.0.1"), clientTimeout); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		if n := c.dials.Load(); n != 1 {
			t.Fatalf("%d connections dialled, want 1: the connection did not survive the move", n)
		}
		c.rt.Close()
	})
}

// gtlsclient is ngtcp2's client, or a skip (a failure in CI) without it.
func gtlsclient(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("gtlsclient")
	if err != nil {
		testutil.SkipOrFail(t, "ngtcp2's gtlsclient is needed (make deps installs ngtcp2-client): %v", err)
	}
	return p
}

// ngtcp2Run is one run of gtlsclient.
type ngtcp2Run struct {
	// Out is its output: its debug log, unless quiet.
	Out string
	// Body is the page it downloaded, empty if none.
	Body string
}

// ok reports whether the run got the page.
func (r ngtcp2Run) ok() bool { return strings.Contains(r.Body, pageMarker) }

// ngtcp2Get runs gtlsclient in the clients' namespace to get the page
// (https://localhost:<s.port>/) from host (an address, or localhost) and
// port, with localhost as the server name (an address there is refused),
// and the given options; quiet adds -q. It
// exits when its request is answered; it exits 0 even when its handshake
// times out, so the page it downloaded is what tells.
func ngtcp2Get(t *testing.T, s *clientSite, host string, port int, timeout time.Duration, quiet bool, opts ...string) ngtcp2Run {
	t.Helper()
	dir := t.TempDir()
	argv := append(s.prefix(s.clients), gtlsclient(t), "--exit-on-all-streams-close", "--download="+dir, "--sni=localhost")
	if quiet {
		argv = append(argv, "-q")
	}
	argv = append(append(argv, opts...), host, fmt.Sprint(port), fmt.Sprintf("https://localhost:%d/", s.port))
	var out testutil.SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	p, err := testutil.StartProcess(ctx, argv, append(os.Environ(), "HOME="+dir), &out)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	body, _ := os.ReadFile(filepath.Join(dir, "index.html"))
	return ngtcp2Run{Out: out.String(), Body: string(body)}
}

func handshakeNgtcp2(t *testing.T, s *clientSite) {
	s.expectVerified(t, "ipv4", func() {
		if r := ngtcp2Get(t, s, "localhost", s.port, clientTimeout, true); !r.ok() {
			t.Fatalf("ngtcp2 did not get the page:\n%s", testutil.Tail([]byte(r.Out)))
		}
	})
}

// zeroRTTNgtcp2 gets the page once, keeping the TLS session and the
// transport parameters, then again with them: the second run must send
// 0-RTT packets, and Caddy must not reject them.
func zeroRTTNgtcp2(t *testing.T, s *clientSite) {
	dir := t.TempDir()
	files := []string{"--session-file=" + filepath.Join(dir, "session"), "--tp-file=" + filepath.Join(dir, "tp")}
	s.expectVerified(t, "ipv4", func() {
		if r := ngtcp2Get(t, s, "localhost", s.port, clientTimeout, true, files...); !r.ok() {
			t.Fatalf("ngtcp2's first run did not get the page:\n%s", testutil.Tail([]byte(r.Out)))
		}
		r := ngtcp2Get(t, s, "localhost", s.port, clientTimeout, false, append(files, "--no-quic-dump", "--no-http-dump")...)
		switch {
		case !r.ok():
			t.Fatalf("ngtcp2's resumed run did not get the page:\n%s", testutil.Tail([]byte(r.Out)))
		case !strings.Contains(r.Out, "type=0RTT"):
			t.Fatalf("ngtcp2 sent no 0-RTT packet:\n%s", testutil.Tail([]byte(r.Out)))
		case strings.Contains(r.Out, "Early data was rejected"):
			t.Fatalf("Caddy rejected ngtcp2's 0-RTT:\n%s", testutil.Tail([]byte(r.Out)))
		}
	})
}

// localPorts are the client addresses ngtcp2 logged sending from.
func localPorts(out string) map[string]bool {
	ports := map[string]bool{}
	for line := range strings.SplitSeq(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "Sent packet: local="); ok {
			addr, _, _ := strings.Cut(rest, " ")
			ports[addr] = true
		}
	}
	return ports
}

// ngtcp2Moves runs gtlsclient with a change of its local port 300 ms after
// the handshake and its request 800 ms after it, so that the request goes
// from the new port, and checks that it sent from two ports and got the
// page: with --nat-rebinding without path validation (a NAT rebinding),
// else with it (an active migration to a new port). The answer may come
// to either port: until the server has validated the new path, it answers
// on the old one, and ngtcp2 exits once its request is answered.
func ngtcp2Moves(t *testing.T, s *clientSite, opts ...string) {
	s.expectVerified(t, "ipv4", func() {
		r := ngtcp2Get(t, s, "localhost", s.port, clientTimeout, false,
			append([]string{"--change-local-addr=300ms", "--delay-stream=800ms", "--no-quic-dump", "--no-http-dump"}, opts...)...)
		if !r.ok() {
			t.Fatalf("ngtcp2 did not get the page:\n%s", testutil.Tail([]byte(r.Out)))
		}
		ports := localPorts(r.Out)
		if len(ports) < 2 {
			t.Fatalf("ngtcp2 sent from %v only: it did not move:\n%s", ports, testutil.Tail([]byte(r.Out)))
		}
		t.Logf("ngtcp2 sent from %v", ports)
	})
}

func rebindingNgtcp2(t *testing.T, s *clientSite) { ngtcp2Moves(t, s, "--nat-rebinding") }

func migrationNgtcp2(t *testing.T, s *clientSite) { ngtcp2Moves(t, s) }

// chromiumBin is Chromium, or a skip (a failure in CI) without it.
func chromiumBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("chromium")
	if err != nil {
		testutil.SkipOrFail(t, "chromium is needed (make deps installs it): %v", err)
	}
	return p
}

// chromiumLoad loads the page in headless Chromium in the clients'
// namespace (chromiumTry, directly) and fails t unless it got it.
func chromiumLoad(t *testing.T, s *clientSite) (netLog []byte) {
	t.Helper()
	netLog, err := chromiumTry(t, s, netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	return netLog
}

// chromiumTry loads the page in headless Chromium in the clients'
// namespace, forced onto QUIC, with a profile of its own and its
// background services off, and returns its net log; an error unless the
// DOM it printed holds the page and Caddy logged one more HTTP/3 request
// from Chromium. With via valid, Chromium sends to via instead of Caddy.
func chromiumTry(t *testing.T, s *clientSite, via netip.AddrPort) (netLog []byte, err error) {
	t.Helper()
	bin := chromiumBin(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "netlog.json")
	before := s.h3Requests(t, "HeadlessChrome")
	// No name but localhost resolves: no query leaves Chromium.
	rules := "MAP * ~NOTFOUND, EXCLUDE localhost"
	if via.IsValid() {
		rules = fmt.Sprintf("MAP localhost:%d %s, MAP * ~NOTFOUND", s.port, via)
	}
	// At the lowest priority: Chromium's start keeps both cores busy, and
	// would hold back Caddy and the tests' floods meanwhile.
	argv := append(s.prefix(s.clients), "nice", "-n", "19", bin, "--headless=new", "--no-sandbox", "--disable-gpu",
		"--no-first-run", "--no-default-browser-check", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-default-apps",
		"--host-resolver-rules="+rules,
		"--user-data-dir="+filepath.Join(dir, "profile"),
		fmt.Sprintf("--origin-to-force-quic-on=localhost:%d", s.port),
		"--ignore-certificate-errors-spki-list="+s.spkiList(t),
		"--log-net-log="+logPath,
		"--dump-dom", s.url("localhost"))
	var out testutil.SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	p, err := testutil.StartProcess(ctx, argv, append(os.Environ(), "HOME="+dir), &out)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	netLog, _ = os.ReadFile(logPath)
	if !strings.Contains(out.String(), `<p id="marker">`+pageMarker+`</p>`) {
		return netLog, fmt.Errorf("Chromium's DOM lacks the page (%v):\n%s", p.Err(), chromiumErrors(out.String()))
	}
	if after := s.h3Requests(t, "HeadlessChrome"); after != before+1 {
		return netLog, fmt.Errorf("Caddy logged %d HTTP/3 requests from Chromium, want 1", after-before)
	}
	return netLog, nil
}

// chromiumErrors is Chromium's output without its complaints about D-Bus,
// which a machine without a desktop session lacks.
func chromiumErrors(out string) string {
	var keep []string
	for line := range strings.SplitSeq(out, "\n") {
		if !strings.Contains(line, "dbus") {
			keep = append(keep, line)
		}
	}
	return testutil.Tail([]byte(strings.Join(keep, "\n")))
}

func handshakeChromium(t *testing.T, s *clientSite) {
	// Chromium resolves localhost to ::1.
	s.expectVerified(t, "ipv6", func() { chromiumLoad(t, s) })
}
