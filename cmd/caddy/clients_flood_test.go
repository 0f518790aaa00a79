//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go/quicvarint"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// Caddy asks for a Retry (quic-go's Transport.VerifySourceAddress) once
// more than 1,000 connection attempts a second come in: a token bucket of
// 1,000, refilled at 1,000 a second, from which each Initial without a
// token takes one. A flood keeps the bucket near empty only while quic-go
// keeps up with it, making a connection for each token it grants, which
// Caddy does not always do (a race-instrumented one hardly ever, hence
// clientsCaddy; a plain one falls behind while Chromium starts on the
// other core): tokens gather meanwhile, and a client's Initial takes one.
// So the retry cases empty the bucket with a burst of 1,500 Initials, keep
// it near empty with a flood of 1,250 a second, and empty it again right
// before the client's first Initial: the client reaches Caddy through a
// relay (retryRelay) that holds the first Initial without a token of each
// client, sends Initials until Caddy answers one with a Retry (the bucket
// empty), waits until its Retries stop (quic-go sends them from a queue of
// 8 and drops an Initial it has no room for, a client's too), sends 8
// more, which take what tokens gathered meanwhile, then the client's.
// Every flood comes from loopback addresses (IPv4), each far under the
// filter's limits; the relay is on ::1, so that Caddy sees the client's
// datagrams come over IPv6 and the verified IPv6 datagrams are the
// client's. Caddy sees the relay's address, not the client's: the Retry's
// token and the Initial that carries it come from there.
const (
	retryDrain     = 1500
	retryFloodRate = 1250
	// baitChunk Initials are sent at a time until one is retried,
	// baitMax in all at the most.
	baitChunk = 16
	baitMax   = 1600
	// baitLast are sent just before the client's Initial.
	baitLast      = 8
	retryAttempts = 8
	// floodFor bounds every flood of these tests.
	floodFor = 30 * time.Second
)

// flood is a flood of Initials from the sockets from to s, at rate in
// bursts of burst (0: testutil.Flood's), after a first burst of drain
// Initials at 20,000 a second (none if 0).
type flood struct {
	from               []*net.UDPConn
	rate, burst, drain int
}

// spread is a flood from 256 loopback addresses (spreadSenders) in the
// clients' namespace.
func (s *clientSite) spread(t *testing.T, rate, burst, drain int) flood {
	f := flood{rate: rate, burst: burst, drain: drain}
	s.clients.Do(t, func() { f.from = spreadSenders(t) })
	return f
}

// during runs fn while f floods s, and stops it when fn returns (floodFor
// at the most); it returns how many Initials were sent.
func (f flood) during(t *testing.T, s *clientSite, fn func()) (sent int) {
	t.Helper()
	to := testutil.LoopbackFor(floodSrc, uint16(s.port))
	g := testutil.NewInitials(uint64(f.rate))
	if f.drain > 0 {
		if _, err := (testutil.Flood{From: f.from, To: to, Rate: 20_000, Count: f.drain, Next: g.Next}).Send(); err != nil {
			t.Fatalf("flood: %v", err)
		}
	}
	stop, done := make(chan struct{}), make(chan int, 1)
	go func() {
		n, err := testutil.Flood{From: f.from, To: to, Rate: f.rate, Burst: f.burst,
			Count: f.rate * int(floodFor/time.Second), For: floodFor, Next: g.Next, Stop: stop}.Send()
		if err != nil {
			t.Errorf("flood: %v", err)
		}
		done <- n
	}()
	// Stopped and waited for even when fn fails t: its sockets close
	// when t ends.
	defer func() {
		close(stop)
		sent = f.drain + <-done
		t.Logf("a flood of %d Initials at %d/s ran meanwhile", sent, f.rate)
	}()
	time.Sleep(100 * time.Millisecond)
	fn()
	return // sent is set once the flood has stopped
}

// baiter sends Initials to Caddy from sockets of its own, and notices the
// Retries Caddy answers them with.
type baiter struct {
	from    []*net.UDPConn
	to      netip.AddrPort
	g       *testutil.Initials
	retried chan struct{}
	sent    int
}

// newBaiter makes a baiter on 16 loopback addresses of 16 /24s
// (127.85.x.1) in the clients' namespace, to s; it stops when t ends.
func newBaiter(t *testing.T, s *clientSite) *baiter {
	b := &baiter{to: testutil.LoopbackFor(floodSrc, uint16(s.port)), g: testutil.NewInitials(baitChunk), retried: make(chan struct{}, 1)}
	s.clients.Do(t, func() {
		for x := range 16 {
			b.from = append(b.from, testutil.Sender(t, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 85, byte(x), 1}), 0)))
		}
	})
	var wg sync.WaitGroup
	for _, c := range b.from {
		wg.Go(func() {
			buf := make([]byte, 2048)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if isRetry(buf[:n]) {
					select {
					case b.retried <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	t.Cleanup(func() {
		for _, c := range b.from {
			c.Close()
		}
		wg.Wait()
	})
	return b
}

// send sends n Initials at once.
func (b *baiter) send(n int) {
	// An error ends the bait, not the relay: the client's Initial goes
	// on regardless.
	sent, _ := testutil.Flood{From: b.from, To: b.to, Rate: 1_000_000, Count: n, Next: b.g.Next}.Send()
	b.sent += sent
}

// drain sends Initials until Caddy retries one (baitMax at the most), then
// waits until its Retries stop.
func (b *baiter) drain() {
	for {
		select {
		case <-b.retried:
			continue
		default:
		}
		break
	}
	for sent := 0; sent < baitMax; sent += baitChunk {
		b.send(baitChunk)
		select {
		case <-b.retried:
			for quiet := time.NewTimer(3 * time.Millisecond); ; quiet.Reset(3 * time.Millisecond) {
				select {
				case <-b.retried:
					continue
				case <-quiet.C:
				}
				return
			}
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// retryRelay forwards datagrams between clients and Caddy, each client
// through a socket of its own; before the first Initial without a token of
// each client it empties Caddy's bucket (baiter). It counts the Retries it
// forwards.
type retryRelay struct {
	ln      *net.UDPConn
	to      netip.AddrPort
	bait    *baiter
	retries atomic.Int32

	mu     sync.Mutex
	spare  []*net.UDPConn
	ups    map[netip.AddrPort]*net.UDPConn
	baited map[netip.AddrPort]bool
}

// relayClients is how many clients a retryRelay serves: its sockets are
// made up front, in the clients' namespace.
const relayClients = 4 * retryAttempts

// startRetryRelay starts a relay on ::1 in the clients' namespace to s on
// ::1; it stops when t ends.
func startRetryRelay(t *testing.T, s *clientSite) *retryRelay {
	t.Helper()
	r := &retryRelay{to: netip.AddrPortFrom(netip.IPv6Loopback(), uint16(s.port)), bait: newBaiter(t, s),
		ups: map[netip.AddrPort]*net.UDPConn{}, baited: map[netip.AddrPort]bool{}}
	s.clients.Do(t, func() {
		r.ln = testutil.Sender(t, netip.AddrPortFrom(netip.IPv6Loopback(), 0))
		for range relayClients {
			r.spare = append(r.spare, testutil.Sender(t, netip.AddrPortFrom(netip.IPv6Loopback(), 0)))
		}
	})
	var wg sync.WaitGroup
	wg.Go(r.fromClients)
	t.Cleanup(func() {
		r.ln.Close()
		wg.Wait()
		t.Logf("the relay sent %d Initials to empty Caddy's bucket", r.bait.sent)
	})
	return r
}

// addr is where clients send to reach Caddy through r.
func (r *retryRelay) addr() netip.AddrPort { return r.ln.LocalAddr().(*net.UDPAddr).AddrPort() }

// fromClients forwards what clients send, until r.ln is closed. It keeps
// its thread, so that the last bait and the client's Initial leave in
// order.
func (r *retryRelay) fromClients() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 2048)
	for {
		n, client, err := r.ln.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		up := r.upstream(client)
		if up == nil {
			continue
		}
		if initialWithoutToken(buf[:n]) && !r.baited[client] {
			r.baited[client] = true
			r.bait.drain()
			r.bait.send(baitLast)
		}
		_, _ = up.WriteToUDPAddrPort(buf[:n], r.to)
	}
}

// upstream is the socket that carries client's datagrams to Caddy, with a
// goroutine that forwards Caddy's answers; nil once the spares ran out.
func (r *retryRelay) upstream(client netip.AddrPort) *net.UDPConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	if up, ok := r.ups[client]; ok {
		return up
	}
	if len(r.spare) == 0 {
		return nil
	}
	up := r.spare[0]
	r.spare = r.spare[1:]
	r.ups[client] = up
	go func() {
		buf := make([]byte, 2048)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			if isRetry(buf[:n]) {
				r.retries.Add(1)
			}
			_, _ = r.ln.WriteToUDPAddrPort(buf[:n], client)
		}
	}()
	return up
}

// isRetry reports whether b is a Retry of QUIC version 1: a long header
// (0x80, with the fixed bit 0x40) of type Retry (0x30).
func isRetry(b []byte) bool {
	return len(b) >= 5 && b[0]&0xf0 == 0xf0 && string(b[1:5]) == "\x00\x00\x00\x01"
}

// initialWithoutToken reports whether b is an Initial of QUIC version 1
// whose token is empty: a client's Initial before any Retry.
func initialWithoutToken(b []byte) bool {
	if len(b) < 7 || b[0]&0xf0 != 0xc0 || string(b[1:5]) != "\x00\x00\x00\x01" {
		return false
	}
	i := 5
	for range 2 { // the destination and source connection IDs
		if i >= len(b) {
			return false
		}
		i += 1 + int(b[i])
	}
	if i >= len(b) {
		return false
	}
	tokenLen, _, err := quicvarint.Parse(b[i:])
	return err == nil && tokenLen == 0
}

// untilRetried runs attempt, a client reaching Caddy through a retryRelay,
// under the retry flood until one was retried and got the page,
// retryAttempts at the most, and fails t unless one was. An attempt that
// fails is logged, not fatal: right after the bait Caddy may drop an
// Initial itself, with rakelimit or without it (quic-go's Retry queue),
// and Chromium gives up after 4 s; a filter that broke the Retry path
// would fail every retried attempt.
func untilRetried(t *testing.T, s *clientSite, attempt func(r *retryRelay) (retried bool, err error)) {
	t.Helper()
	r := startRetryRelay(t, s)
	s.expectVerified(t, "ipv6", func() {
		s.spread(t, retryFloodRate, 1, retryDrain).during(t, s, func() {
			for i := range retryAttempts {
				before := r.retries.Load()
				retried, err := attempt(r)
				switch {
				case err != nil:
					t.Logf("attempt %d failed (retried %v; Caddy sent it %d Retries): %v", i+1, retried, r.retries.Load()-before, err)
				case retried:
					t.Logf("attempt %d was retried and got the page", i+1)
					return
				default:
					t.Logf("attempt %d got the page without a Retry", i+1)
				}
			}
			t.Fatalf("no attempt of %d was retried and got the page", retryAttempts)
		})
	})
}

// retrySpy is a client's PacketConn that counts the Retries it reads.
type retrySpy struct {
	net.PacketConn
	retries atomic.Int32
}

// ReadFrom reads a datagram and counts it if it is a Retry.
func (r *retrySpy) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := r.PacketConn.ReadFrom(b)
	if err == nil && isRetry(b[:n]) {
		r.retries.Add(1)
	}
	return n, a, err
}

func retryQUICGo(t *testing.T, s *clientSite) {
	untilRetried(t, s, func(r *retryRelay) (bool, error) {
		spy := &retrySpy{PacketConn: s.udp(t, netip.IPv6Loopback())}
		c := newH3Client(t, quicTransport(t, spy), nil, nil)
		c.dialTo = r.addr()
		defer c.rt.Close()
		err := c.get(http.MethodGet, s.url("localhost"), clientTimeout)
		return spy.retries.Load() > 0, err
	})
}

func retryNgtcp2(t *testing.T, s *clientSite) {
	untilRetried(t, s, func(r *retryRelay) (bool, error) {
		run := ngtcp2Get(t, s, "::1", int(r.addr().Port()), clientTimeout, false, "--no-quic-dump", "--no-http-dump")
		retried := strings.Contains(run.Out, "type=Retry")
		if !run.ok() {
			return retried, fmt.Errorf("ngtcp2 did not get the page:\n%s", testutil.Tail([]byte(run.Out)))
		}
		return retried, nil
	})
}

func retryChromium(t *testing.T, s *clientSite) {
	chromiumBin(t)
	untilRetried(t, s, func(r *retryRelay) (bool, error) {
		// After a Retry, the server's transport parameters carry the
		// Retry's source connection ID: Chromium's net log has them.
		netLog, err := chromiumTry(t, s, r.addr())
		return bytes.Contains(netLog, []byte("retry_source_connection_id")), err
	})
}

// floodChromium loads the page in Chromium while Initials flood Caddy from
// one loopback address at 20,000 a second, 20 times the filter's limit:
// the filter must hold the flood, and let Chromium through.
func floodChromium(t *testing.T, s *clientSite) {
	chromiumBin(t)
	const rate = 20_000
	opening := func() float64 {
		m := s.metrics(t)
		return sumMetric(m, "caddy_rakelimit_packets_total", `class="opening"`, `family="ipv4"`, `verdict="passed"`) +
			sumMetric(m, "caddy_rakelimit_packets_total", `class="opening"`, `family="ipv4"`, `verdict="limited"`)
	}
	f := flood{from: []*net.UDPConn{s.udp(t, floodSrc)}, rate: rate}
	var sent int
	passed := opening()
	s.expectVerified(t, "ipv6", func() { sent = f.during(t, s, func() { chromiumLoad(t, s) }) })
	passed = opening() - passed
	if held := float64(sent) - passed; held < float64(sent)/2 {
		t.Errorf("of a flood of %d Initials from one address at 20 times the limit, the filter passed %v", sent, passed)
	}
	t.Logf("the filter passed %v of the flood's %d Initials", passed, sent)
}

// The loads of floodChromiumSpread.
const (
	// spreadLoads is how many times it loads the page through rakelimit,
	// and as many times from Caddy without it.
	spreadLoads = 8
	// spreadSlack is how many more of those loads may fail through
	// rakelimit than without it: at the 3% of loads that fail in both
	// (see floodChromiumSpread), 4 or more of 8 fail once in 20,000 runs
	// (binomial; at 5%, once in 3,000).
	spreadSlack = 3
)

// floodChromiumSpread loads the page in Chromium while Initials flood Caddy
// from 256 loopback addresses over 64 /24s at 20,000 a second: under every
// limit of the filter, whose opening total starts at 20,000 a second and
// rises while the receive queue stays short, so that quic-go gets nearly
// all of the flood, as it does without rakelimit. Past Caddy's 1,000
// handshakes a second the flood takes each token of Caddy's bucket as it
// comes, and quic-go answers the Initials without one with Retries from a
// queue of 8, dropping those it has no room for: the flood got 1,500 to
// 3,300 Retries a second (the median 2,200). Chromium got none in 590
// loads: an Initial of Chromium's was answered when it found a token, and
// dropped otherwise. Chromium sends its ClientHello (two datagrams), again
// after 0.3, 0.9 and 2.1 s, and gives up when nothing has come back in 4 s
// (QUIC_NETWORK_IDLE_TIMEOUT): Caddy answered its first two datagrams in
// about a third of the loads, and none of its Initials in 2 to 3%.
//
// That is quic-go's, with rakelimit or without it. Measured on 2 cores,
// loads taking turns, one Caddy each: 4 of 150 loads failed in the bpf mode
// and 4 of 150 without rakelimit; in another run 2, 0 and 1 of 60 in the
// bpf mode, the userspace mode and without; with the race detector in the
// test binary (Caddy without it: clientsCaddy), 1, 1 and 0 of 30. In every
// failed load Chromium heard nothing from Caddy for 4 s; where it was
// counted (176 loads), the filter dropped none of Chromium's datagrams. A
// total held near Caddy's handshake rate would save those loads (with
// level_limit 3 1000 none of 60 failed, and Caddy answered Chromium's first
// two datagrams in 56), but would starve quiet networks under wider floods
// (a total of 5,000 served a quiet /24's new connections 72%, one of
// 20,000 98%: lab/docs/bench/opening-total), and the adaptive total
// follows the socket's receive queue, which quic-go's Retry queue leaves
// short.
//
// So the case loads the page spreadLoads times through rakelimit and as
// many times from a Caddy without it (modeWithout), in turns, each under
// such a flood, and fails unless the filter dropped none of Chromium's
// datagrams (the only IPv6 ones) and verified some; each load through
// rakelimit got the page or failed as quic-go makes loads fail, Chromium
// hearing nothing from Caddy (its net log), so that a failure after an
// answer (a datagram lost mid-handshake, to the filter or an overflowing
// queue) fails the case; and at most spreadSlack more loads failed through
// rakelimit than without it. In the userspace mode the kernel pre-filter
// sheds long headers at random while the queue overflows, counted by class
// only: Chromium's among them would show as loads that heard nothing.
func floodChromiumSpread(t *testing.T, s *clientSite) {
	chromiumBin(t)
	ns := testutil.NewNetNS(t)
	without := startClientSite(t, s.bin, modeWithout, ns, ns, legitSrc, "127.0.0.1")
	floods := map[*clientSite]flood{s: s.spread(t, 20_000, 0, 0), without: without.spread(t, 20_000, 0, 0)}
	failed := map[*clientSite]int{}
	refused := s.refused(t, "ipv6")
	s.expectVerified(t, "ipv6", func() {
		for i := range spreadLoads {
			// Each goes first every other turn.
			sites := []*clientSite{s, without}
			if i%2 == 1 {
				sites[0], sites[1] = without, s
			}
			for _, site := range sites {
				var netLog []byte
				var err error
				floods[site].during(t, site, func() { netLog, err = chromiumTry(t, site, netip.AddrPort{}) })
				initials, answered, logErr := chromiumAnswer(netLog)
				if err == nil {
					t.Logf("%s, load %d: got the page; Chromium sent %d Initial packets before Caddy's first answer", site.mode, i+1, initials)
					continue
				}
				failed[site]++
				switch {
				case site == s && logErr != nil:
					t.Errorf("%s, load %d: %v; Chromium's net log: %v", site.mode, i+1, err, logErr)
				case site == s && answered:
					t.Errorf("%s, load %d: Chromium failed after Caddy answered it: %v", site.mode, i+1, err)
				case logErr != nil:
					t.Logf("%s, load %d: Chromium failed (its net log: %v): %v", site.mode, i+1, logErr, err)
				default:
					t.Logf("%s, load %d: Caddy answered none of the %d Initial packets Chromium sent: %v", site.mode, i+1, initials, err)
				}
			}
		}
	})
	if n := s.refused(t, "ipv6") - refused; n > 0 {
		t.Errorf("the filter refused %v IPv6 datagrams: Chromium's, the only ones", n)
	}
	t.Logf("Chromium got the page %d times of %d through rakelimit (%s mode), %d times without it",
		spreadLoads-failed[s], spreadLoads, s.mode, spreadLoads-failed[without])
	if failed[s] > failed[without]+spreadSlack {
		t.Errorf("%d loads of %d failed through rakelimit, %d without it: more than %d more",
			failed[s], spreadLoads, failed[without], spreadSlack)
	}
}

// chromiumAnswer reads Chromium's net log: how many Initial packets it
// sent before the first datagram from the server reached it, and whether
// one did.
func chromiumAnswer(netLog []byte) (initials int, answered bool, err error) {
	var l struct {
		Constants struct {
			LogEventTypes map[string]int `json:"logEventTypes"`
		} `json:"constants"`
		Events []struct {
			Type   int `json:"type"`
			Params struct {
				EncryptionLevel string `json:"encryption_level"`
			} `json:"params"`
		} `json:"events"`
	}
	if err := json.Unmarshal(netLog, &l); err != nil {
		return 0, false, err
	}
	sent, okSent := l.Constants.LogEventTypes["QUIC_SESSION_PACKET_SENT"]
	received, okReceived := l.Constants.LogEventTypes["QUIC_SESSION_PACKET_RECEIVED"]
	if !okSent || !okReceived {
		return 0, false, errors.New("no QUIC packet events in its constants")
	}
	for _, e := range l.Events {
		switch {
		case e.Type == received:
			return initials, true, nil
		case e.Type == sent && e.Params.EncryptionLevel == "ENCRYPTION_INITIAL":
			initials++
		}
	}
	return initials, false, nil
}
