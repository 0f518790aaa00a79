package testutil

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// FreePort returns a port that is free for both TCP and UDP on every
// address, as a Caddy site needs for HTTPS and HTTP/3.
func FreePort(t testing.TB) int {
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
	t.Fatal("no port free for both TCP and UDP")
	return 0
}

// HTTP3Get fetches url over HTTP/3 from a socket bound to src, on a new
// QUIC connection, and returns the body and how long it took. It does not
// check the server's certificate (tests use Caddy's tls internal) and sends
// localhost as the server name.
func HTTP3Get(ctx context.Context, src netip.Addr, url string) (string, time.Duration, error) {
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		return "", 0, fmt.Errorf("binding the client to %v: %w", src, err)
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

// WaitHTTP3 retries a request from src until url answers over HTTP/3, for
// 15 seconds at the most: Caddy issues its tls internal certificate in the
// background after it starts.
func WaitHTTP3(t testing.TB, src netip.Addr, url string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _, err = HTTP3Get(ctx, src, url)
		cancel()
		if err == nil {
			return
		}
	}
	t.Fatalf("%s never answered over HTTP/3: %v", url, err)
}

// Metric returns the value of the sample of name whose labels include all of
// want (label="value" pairs), from a Prometheus text exposition; it fails t
// when there is none.
func Metric(t testing.TB, exposition, name string, want ...string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(exposition, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(line, w)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("parsing %q: %v", line, err)
		}
		return v
	}
	t.Fatalf("no sample %s %v in:\n%s", name, want, exposition)
	return 0
}

// AdminGet fetches path from Caddy's admin endpoint on localhost:port and
// returns the status code and the body; it fails t when there is no answer.
func AdminGet(t testing.TB, port int, path string) (int, string) {
	t.Helper()
	status, body, err := adminGet(context.Background(), "localhost", port, path)
	if err != nil {
		t.Fatal(err)
	}
	return status, string(body)
}

// AdminRequest fetches path from Caddy's admin endpoint on 127.0.0.1:port,
// within ctx and 5 s, and returns the body; another status than 200 is an
// error.
func AdminRequest(ctx context.Context, port int, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	status, body, err := adminGet(ctx, "127.0.0.1", port, path)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s: %s", path, status, http.StatusText(status), bytes.TrimSpace(body))
	}
	return body, nil
}

// adminGet fetches path from the admin endpoint on host:port.
func adminGet(ctx context.Context, host string, port int, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d%s", host, port, path), nil)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: reading the body: %w", path, err)
	}
	return resp.StatusCode, b, nil
}
