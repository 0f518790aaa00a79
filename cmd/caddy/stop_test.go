//go:build linux

package main

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// stopBound is how long Caddy may take to exit after SIGTERM. The goal is
// 1 s; the bound is generous because it catches a hang, not a figure, on a
// machine that other jobs share.
//
// What it guards is the module's own share of the stop under a flood: the
// engine's goroutines (the pre-filter's update loop among them, which a
// flood keeps busy), the limiter's close and the pre-filter's detach. The
// stops of about 5 s the benchmark saw after floods are not the module's:
// Caddy's default grace period is eternal, and its HTTP/3 server waits for
// every connection to close. Caddy listens for 0.5-RTT, so quic-go hands a
// connection to the HTTP/3 server before the client's handshake completes;
// a client that gives up its handshake while its packets (long headers, of
// the limited opening class) are lost, dropped with the flood's or in an
// overflowing receive queue, leaves a connection that lives until quic-go's
// handshake timeout, 5 s (the idle timeout, 30 s, if it completed). In the
// benchmark: the new-connection client's requests that timed out, a
// goroutine dump with http3.(*Server).Shutdown waiting on one or two
// connections in AcceptStream, and the server sending to those client
// ports. Caddy's grace_period bounds it; this test has no such client.
const stopBound = 3 * time.Second

// floodSpread sends Initials to dst from 256 loopback addresses over 64
// /24s (127.84.x.1 to 127.84.x.4), in turn, at rate for d.
func floodSpread(t *testing.T, dst netip.AddrPort, rate int, d time.Duration) int {
	t.Helper()
	g := testutil.NewInitials(uint64(rate))
	n, err := testutil.Flood{From: spreadSenders(t), To: dst, Rate: rate, Count: int(float64(rate) * d.Seconds()), For: d, Next: g.Next}.Send()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// spreadSenders are sockets on 256 loopback addresses over 64 /24s
// (127.84.x.1 to 127.84.x.4), closed when t ends.
func spreadSenders(t *testing.T) []*net.UDPConn {
	t.Helper()
	var from []*net.UDPConn
	for x := range 64 {
		for h := 1; h <= 4; h++ {
			from = append(from, testutil.Sender(t, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 84, byte(x), byte(h)}), 0)))
		}
	}
	return from
}

// TestStopsAfterFlood runs Caddy, floods it with Initials from many
// sources, and times its exit after SIGTERM once the flood is over: within
// stopBound in every mode. On a hang it dumps Caddy's goroutines (SIGQUIT)
// into the log.
func TestStopsAfterFlood(t *testing.T) {
	testutil.RequireRoot(t)
	for _, mode := range []string{"userspace", "bpf"} {
		t.Run(mode, func(t *testing.T) {
			port := testutil.FreePort(t)
			cfg := writeConfig(t, processCaddyfile(t, port, "", "rakelimit {\n\t\tmode "+mode+"\n\t}"))
			p := testutil.StartCaddy(t, testCaddy(t, nil, nil, cfg, port))
			sent := floodSpread(t, testutil.LoopbackFor(floodSrc, uint16(port)), 50_000, 1500*time.Millisecond)
			start := time.Now()
			if err := p.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
				t.Logf("%s mode: Caddy exited %v after SIGTERM, after a flood of %d Initials", mode,
					time.Since(start).Round(time.Millisecond), sent)
			case <-time.After(stopBound):
				_ = p.Signal(syscall.SIGQUIT)
				<-p.Done()
				t.Errorf("%s mode: Caddy still ran %v after SIGTERM, after a flood of %d Initials; its goroutines:\n%s",
					mode, stopBound, sent, goroutines(p.Output()))
			}
		})
	}
}

// goroutines is the goroutine dump at the end of a Caddy's output, with the
// runtime's own goroutines left out.
func goroutines(out string) string {
	i := strings.Index(out, "goroutine ")
	if i < 0 {
		return out[max(0, len(out)-4000):]
	}
	var b bytes.Buffer
	for g := range strings.SplitSeq(out[i:], "\n\n") {
		if strings.Contains(g, "runtime.gopark") && strings.Contains(g, "runtime/proc.go") &&
			!strings.Contains(g, "rakelimit") && !strings.Contains(g, "quic-go") && !strings.Contains(g, "caddy") {
			continue
		}
		b.WriteString(g)
		b.WriteString("\n\n")
	}
	return b.String()
}
