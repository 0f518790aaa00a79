//go:build linux

package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// clientTLS trusts Caddy's internal CA blindly (the trust chain is not under
// test) and sends localhost as SNI: Caddy picks the certificate by name.
func clientTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, ServerName: "localhost", NextProtos: []string{http3.NextProtoH3}}
}

// h3Conn is one QUIC connection from its own UDP socket, with an HTTP/3
// client on it.
type h3Conn struct {
	udp  *net.UDPConn
	tr   *quic.Transport
	conn *quic.Conn
	cc   *http3.ClientConn
	port int
}

// dialH3 opens a UDP socket on src (a new source port) and a QUIC connection
// from it to dst.
func dialH3(ctx context.Context, src netip.Addr, dst netip.AddrPort) (*h3Conn, error) {
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		return nil, fmt.Errorf("binding %v: %w", src, err)
	}
	return dialH3On(ctx, udp, udp, dst)
}

// dialH3On opens a QUIC connection to dst through pc, which reads and
// writes udp; it closes udp when it fails.
func dialH3On(ctx context.Context, udp *net.UDPConn, pc net.PacketConn, dst netip.AddrPort) (*h3Conn, error) {
	tr := &quic.Transport{Conn: pc}
	conn, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(dst), clientTLS(), &quic.Config{})
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	return &h3Conn{udp: udp, tr: tr, conn: conn, cc: (&http3.Transport{}).NewClientConn(conn), port: int(dst.Port())}, nil
}

func (h *h3Conn) close() {
	h.conn.CloseWithError(0, "")
	h.tr.Close()
	h.udp.Close()
}

// get fetches path and checks the status and, unless want is empty, the
// body. It returns the bytes of the body read.
func (h *h3Conn) get(ctx context.Context, path, want string, progress func(int)) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://localhost:%d%s", h.port, path), nil)
	if err != nil {
		return 0, err
	}
	resp, err := h.cc.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var got int64
	var body strings.Builder
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		got += int64(n)
		if want != "" && body.Len() < len(want)+1 {
			body.Write(buf[:n])
		}
		if progress != nil && n > 0 {
			progress(n)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return got, err
		}
	}
	if resp.StatusCode != http.StatusOK {
		return got, fmt.Errorf("status %s", resp.Status)
	}
	if want != "" && body.String() != want {
		return got, fmt.Errorf("body %.40q, want %q", body.String(), want)
	}
	return got, nil
}

// newConnGet fetches path over a new connection from a new socket on src
// and returns how long the handshake and the request took.
func newConnGet(ctx context.Context, src netip.Addr, dst netip.AddrPort, path, want string) (time.Duration, error) {
	start := time.Now()
	h, err := dialH3(ctx, src, dst)
	if err != nil {
		return time.Since(start), err
	}
	defer h.close()
	_, err = h.get(ctx, path, want, nil)
	return time.Since(start), err
}

// LegitStats is what one client got during a scenario. Latencies are of the
// successful requests; failures count against SuccessPct.
type LegitStats struct {
	Attempted  int            `json:"attempted"`
	OK         int            `json:"ok"`
	SuccessPct float64        `json:"success_pct"`
	P50Ms      *float64       `json:"p50_ms,omitempty"`
	P99Ms      *float64       `json:"p99_ms,omitempty"`
	Errors     map[string]int `json:"errors,omitempty"`
}

// requestLog collects the outcomes of a client's requests.
type requestLog struct {
	mu        sync.Mutex
	attempted int
	lat       []time.Duration
	errs      map[string]int
}

func (l *requestLog) add(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempted++
	if err == nil {
		l.lat = append(l.lat, d)
		return
	}
	if l.errs == nil {
		l.errs = map[string]int{}
	}
	k := errorClass(err)
	if _, ok := l.errs[k]; !ok && len(l.errs) >= 8 {
		k = "other"
	}
	l.errs[k]++
}

func (l *requestLog) stats() LegitStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := LegitStats{Attempted: l.attempted, OK: len(l.lat), Errors: l.errs}
	if l.attempted > 0 {
		s.SuccessPct = 100 * float64(len(l.lat)) / float64(l.attempted)
	}
	if len(l.lat) > 0 {
		s.P50Ms = ptr(ms(testutil.Percentile(l.lat, 50)))
		s.P99Ms = ptr(ms(testutil.Percentile(l.lat, 99)))
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// errorClass shortens an error for counting: the kind of failure, without
// addresses or numbers that make every message different.
func errorClass(err error) string {
	var idle *quic.IdleTimeoutError
	var hs *quic.HandshakeTimeoutError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &hs):
		return "handshake timeout"
	case errors.As(err, &idle):
		return "idle timeout"
	}
	msg := err.Error()
	var b strings.Builder
	for _, r := range msg {
		if r >= '0' && r <= '9' {
			r = 'N'
		}
		b.WriteRune(r)
		if b.Len() >= 60 {
			break
		}
	}
	return b.String()
}

// paced calls do rate times a second for d, each call in its own goroutine
// with its own timeout, whether earlier calls have returned or not (so a
// slow server cannot slow the client down), then waits for the calls in
// flight.
func paced(ctx context.Context, d time.Duration, rate int, timeout time.Duration, do func(context.Context) (time.Duration, error)) LegitStats {
	var log requestLog
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= d {
			break
		}
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			wg.Wait()
			return log.stats()
		case <-t.C:
		}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			lat, err := do(rctx)
			if ctx.Err() == nil {
				log.add(lat, err)
			}
		})
	}
	wg.Wait()
	return log.stats()
}

// gtlsGet fetches / with ngtcp2's gtlsclient, by name (an IP literal in the
// SNI fails the handshake), and checks the page.
func gtlsGet(ctx context.Context, bin, dir string, port int, timeout time.Duration) (time.Duration, error) {
	out, err := os.MkdirTemp(dir, "gtls")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(out)
	logf, err := os.Create(filepath.Join(out, "log"))
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	p, err := testutil.StartProcess(ctx, []string{bin, "-q", "--exit-on-all-streams-close", "--download=" + out,
		"localhost", strconv.Itoa(port), fmt.Sprintf("https://localhost:%d/", port)}, os.Environ(), logf)
	if err != nil {
		return 0, err
	}
	<-p.Done()
	d := time.Since(start)
	if ctx.Err() != nil {
		return d, ctx.Err()
	}
	if err := p.Err(); err != nil {
		log, _ := os.ReadFile(filepath.Join(out, "log"))
		return d, fmt.Errorf("gtlsclient: %w: %s", err, testutil.LastLine(log))
	}
	body, err := os.ReadFile(filepath.Join(out, "index.html"))
	if err != nil || string(body) != page {
		return d, fmt.Errorf("gtlsclient got %.40q (%v), want %q", body, err, page)
	}
	return d, nil
}
