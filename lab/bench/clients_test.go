//go:build linux

package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
)

// testServer is an HTTP/3 server on loopback with what Caddy serves in the
// benchmark: the page, the two files, the upload; and a file that stalls.
type testServer struct {
	dst     netip.AddrPort
	backend *uploadBackend
	sizes   transferSizes
}

// testCert returns a self-signed certificate for localhost.
func testCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func startTestServer(t *testing.T, sz transferSizes) *testServer {
	t.Helper()
	cert := testCert(t)
	backend, err := startBackend()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(backend.close)
	bytesOf := func(n int64) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(n))
			w.Write(make([]byte, n))
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, page) })
	mux.HandleFunc("/other", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "not the page") })
	mux.HandleFunc("/files/"+bigFile, bytesOf(sz.Download))
	mux.HandleFunc("/files/"+smallFile, bytesOf(sz.Each))
	mux.Handle("/upload", backend)
	mux.HandleFunc("/files/stall", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		w.Write(make([]byte, 5000))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http3.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go srv.Serve(udp)
	t.Cleanup(func() { srv.Close(); udp.Close() })
	return &testServer{dst: udp.LocalAddr().(*net.UDPAddr).AddrPort(), backend: backend, sizes: sz}
}

func TestNewConnGet(t *testing.T) {
	s := startTestServer(t, sizesFor(0.001))
	ctx := context.Background()
	lat, err := newConnGet(ctx, newConnSrc, s.dst, "/", page)
	if err != nil || lat <= 0 {
		t.Fatalf("newConnGet: %v, %v", lat, err)
	}
	if _, err := newConnGet(ctx, newConnSrc, s.dst, "/other", page); err == nil || !strings.Contains(err.Error(), `body "not the page"`) {
		t.Errorf("wrong body: err = %v", err)
	}
	if _, err := newConnGet(ctx, newConnSrc, s.dst, "/missing", page); err == nil || !strings.Contains(err.Error(), "status 404") {
		t.Errorf("missing page: err = %v", err)
	}
	// Nothing listens: the handshake times out with the request's context.
	dead := netip.AddrPortFrom(s.dst.Addr(), 9)
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := newConnGet(tctx, newConnSrc, dead, "/", page); err == nil || errorClass(err) != "timeout" {
		t.Errorf("no server: err = %v (class %q)", err, errorClass(err))
	}
}

// TestPaced: the client starts rate requests a second whatever the server
// does, counts failures against success, and takes latencies of successes.
func TestPaced(t *testing.T) {
	var calls atomic.Int64
	start := time.Now()
	st := paced(context.Background(), 400*time.Millisecond, 50, 100*time.Millisecond, func(ctx context.Context) (time.Duration, error) {
		n := calls.Add(1)
		if n%4 == 0 { // every fourth hangs until its timeout
			<-ctx.Done()
			return 0, ctx.Err()
		}
		if n%4 == 1 {
			return 0, errors.New("handshake: CRYPTO_ERROR 0x12a on port 51234")
		}
		return time.Duration(n) * time.Millisecond, nil
	})
	elapsed := time.Since(start)
	if st.Attempted != 20 || st.OK != 10 || st.SuccessPct != 50 {
		t.Fatalf("stats %+v, want 20 attempted, 10 ok", st)
	}
	if elapsed > 700*time.Millisecond {
		t.Errorf("paced took %v: hanging requests slowed the schedule", elapsed)
	}
	if st.Errors["timeout"] != 5 || st.Errors["handshake: CRYPTO_ERROR NxNNa on port NNNNN"] != 5 {
		t.Errorf("errors %v", st.Errors)
	}
	// Successes are calls 2, 3, 6, 7, ..., 18, 19 ms: p50 10 ms, p99 19 ms.
	if st.P50Ms == nil || *st.P50Ms != 10 || st.P99Ms == nil || *st.P99Ms != 19 {
		t.Errorf("p50 %v, p99 %v", st.P50Ms, st.P99Ms)
	}
	none := paced(context.Background(), 100*time.Millisecond, 50, time.Second, func(context.Context) (time.Duration, error) {
		return 0, errors.New("refused")
	})
	if none.OK != 0 || none.P50Ms != nil || none.P99Ms != nil || none.Attempted != 5 {
		t.Errorf("all failing: %+v", none)
	}
}

func TestRequestLogCapsErrorKinds(t *testing.T) {
	var l requestLog
	for i := range 20 {
		l.add(0, fmt.Errorf("kind %c", 'a'+i))
	}
	st := l.stats()
	if len(st.Errors) != 9 || st.Errors["other"] != 12 {
		t.Errorf("errors %v: want 8 kinds and other", st.Errors)
	}
}

func TestEstablishedConn(t *testing.T) {
	s := startTestServer(t, sizesFor(0.001))
	h, err := dialH3(context.Background(), establishedSrc, s.dst)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	if got := h.conn.LocalAddr().(*net.UDPAddr).AddrPort().Addr(); got != establishedSrc {
		t.Errorf("connection from %v, want %v", got, establishedSrc)
	}
	for range 3 {
		if _, err := h.get(context.Background(), "/", page, nil); err != nil {
			t.Fatal(err)
		}
	}
}
