package userspace

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/net/ipv4"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn/learntest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// quicBatches says whether quic-go reads in batches here (its oobConn); on
// Windows it reads one datagram per ReadFrom from any conn.
var quicBatches = runtime.GOOS == "linux" || runtime.GOOS == "darwin" || runtime.GOOS == "freebsd"

// countingConn is a Conn that counts quic-go's calls of ReadBatch.
type countingConn struct {
	*packetconn.Conn
	batches atomic.Int64
}

func (c *countingConn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	c.batches.Add(1)
	return c.Conn.ReadBatch(ms, flags)
}

// exchange dials addr and echoes each payload on a stream of its own.
func exchange(ctx context.Context, addr string, tlsConf *tls.Config, payloads [][]byte) error {
	conn, err := quic.DialAddr(ctx, addr, tlsConf, &quic.Config{})
	if err != nil {
		return fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer conn.CloseWithError(0, "")
	return learntest.Echo(ctx, conn, payloads)
}

// TestQUICGoKeepsFastPath runs a quic-go server in a child process with
// QUIC_GO_LOG_LEVEL=debug, once over a Conn and once, as a control, over a
// plain net.PacketConn. Over the Conn quic-go must not log that it disables
// its optimisations, must build its batched reader (its debug line about
// ECN says so where it has one) and must read through Conn.ReadBatch; over
// the plain conn it must log "Disabling optimizations", which shows the
// check can fail.
func TestQUICGoKeepsFastPath(t *testing.T) {
	if mode := os.Getenv("RAKELIMIT_QUIC_CHILD"); mode != "" {
		quicChild(t, mode)
		return
	}
	tests := []struct {
		mode       string
		want, deny []string
	}{
		{"wrapped", []string{"EXCHANGE-OK"}, []string{"Disabling optimizations", "is not a net.UDPConn"}},
		{"plain", []string{"EXCHANGE-OK", "is not a net.UDPConn. Disabling optimizations"}, nil},
	}
	if quicBatches {
		tests[0].want = append(tests[0].want, "Activating reading of ECN bits")
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestQUICGoKeepsFastPath$", "-test.v")
			cmd.Env = append(os.Environ(), "RAKELIMIT_QUIC_CHILD="+tt.mode, "QUIC_GO_LOG_LEVEL=debug")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, testutil.Tail(out))
			}
			for _, w := range tt.want {
				if !bytes.Contains(out, []byte(w)) {
					t.Errorf("quic-go over the %s conn did not log %q:\n%s", tt.mode, w, testutil.Tail(out))
				}
			}
			for _, d := range tt.deny {
				if bytes.Contains(out, []byte(d)) {
					t.Errorf("quic-go over the %s conn logged %q", tt.mode, d)
				}
			}
			if tt.mode == "wrapped" && quicBatches {
				m := regexp.MustCompile(`READBATCH-CALLS (\d+)`).FindSubmatch(out)
				if m == nil {
					t.Fatalf("child printed no ReadBatch count:\n%s", testutil.Tail(out))
				}
				if n, _ := strconv.Atoi(string(m[1])); n == 0 {
					t.Fatal("quic-go never called Conn.ReadBatch")
				}
				t.Logf("quic-go read through Conn.ReadBatch %s times", m[1])
			}
		})
	}
}

// quicChild serves one echo exchange over the conn mode names, on a
// dual-stack wildcard socket like Caddy's, and prints the result.
func quicChild(t *testing.T, mode string) {
	serverTLS, clientTLS := learntest.TLSConfigs(t)
	conn := testutil.Listen(t, "udp", "[::]:0")
	var pc net.PacketConn
	var cc *countingConn
	switch mode {
	case "wrapped":
		cc = &countingConn{Conn: wrap(t, conn, newTestDecider(t, testutil.QUICLimits(1000, 100_000), nil, -1))}
		pc = cc
	case "plain":
		pc = struct{ net.PacketConn }{conn}
	default:
		t.Fatalf("unknown child mode %q", mode)
	}
	learntest.Serve(t, &quic.Transport{Conn: pc}, serverTLS, &quic.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := exchange(ctx, fmt.Sprintf("127.0.0.1:%d", testutil.PortOf(conn)), clientTLS, [][]byte{[]byte("ping")}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("EXCHANGE-OK")
	if cc != nil {
		fmt.Printf("READBATCH-CALLS %d\n", cc.batches.Load())
	}
}

// TestQUICGoUnderFlood: a quic-go server reads a dual-stack socket through a
// Conn while 127.0.0.1 floods it with Initials; a client on ::1 completes
// its handshake and echoes 20 small streams and one of 1 MB, the flood is
// dropped, and quic-go reads through ReadBatch throughout.
func TestQUICGoUnderFlood(t *testing.T) {
	const limit, rate = 200, 5000
	serverTLS, clientTLS := learntest.TLSConfigs(t)
	conn := testutil.Listen(t, "udp", "[::]:0")
	port := testutil.PortOf(conn)
	l := newTestDecider(t, testutil.QUICLimits(limit, 100_000), nil, -1)
	cc := &countingConn{Conn: wrap(t, conn, l)}
	learntest.Serve(t, &quic.Transport{Conn: cc}, serverTLS, &quic.Config{})

	floodS := sender(t, "127.0.0.1:0")
	// The flood lasts until the exchange ends, however long a loaded
	// machine makes it, and floodFor at the most.
	const floodFor = 20 * time.Second
	type result struct {
		sent testutil.Sent
		err  error
	}
	flooded := make(chan result, 1)
	stop := make(chan struct{})
	floodStart := time.Now()
	go func() {
		s, err := testutil.Flood{From: []*net.UDPConn{floodS}, To: loopbackTo("127.0.0.1:0", port), Rate: rate,
			Count: rate * int(floodFor/time.Second), For: floodFor, Stop: stop, Next: testutil.NewInitials(1).Next}.Run()
		flooded <- result{s, err}
	}()
	time.Sleep(500 * time.Millisecond) // the flood is on
	payloads := make([][]byte, 21)
	for i := range 20 {
		payloads[i] = fmt.Appendf(nil, "request %d", i)
	}
	payloads[20] = bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	if err := exchange(ctx, fmt.Sprintf("[::1]:%d", port), clientTLS, payloads); err != nil {
		t.Fatalf("exchange during the flood: %v", err)
	}
	took := time.Since(start)
	select {
	case res := <-flooded:
		if res.err != nil {
			t.Fatal(res.err)
		}
		t.Fatal("the flood ended before the exchange did: it proves nothing")
	default:
	}
	close(stop)
	res := <-flooded
	if res.err != nil {
		t.Fatal(res.err)
	}
	floodSeconds := int(time.Since(floodStart)/time.Second) + 1
	testutil.WaitEmpty(t, conn) // quic-go has read, so the limiter decided, the whole flood
	st, _ := l.Stats()
	v4, v6 := decide.FamilyIndex(sketch.IPv4), decide.FamilyIndex(sketch.IPv6)
	var dropped uint64
	for _, d := range st.Dropped[quicclass.Opening][v4] {
		dropped += d
	}
	passed := st.Passed[quicclass.Opening][v4]
	if dropped < uint64(res.sent.Total/2) || passed > uint64(limit*(floodSeconds+2)) {
		t.Errorf("flood of %d Initials in %d s: %d dropped, %d passed", res.sent.Total, floodSeconds, dropped, passed)
	}
	var clientDrops uint64
	for c := range sketch.NumClasses {
		for _, d := range st.Dropped[c][v6] {
			clientDrops += d
		}
	}
	if clientDrops != 0 || st.Passed[quicclass.Established][v6] < 700 {
		t.Errorf("client on ::1: %d datagrams dropped, %d established passed", clientDrops, st.Passed[quicclass.Established][v6])
	}
	if quicBatches && cc.batches.Load() == 0 {
		t.Error("quic-go never called Conn.ReadBatch")
	}
	t.Logf("exchange took %v; flood: %d passed, %d dropped; client: %d opening, %d established passed; %d ReadBatch calls",
		took, passed, dropped, st.Passed[quicclass.Opening][v6], st.Passed[quicclass.Established][v6], cc.batches.Load())
}
