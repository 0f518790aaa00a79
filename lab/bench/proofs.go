//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/quic-go/quic-go"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
)

// The attacks on proofs. The filter makes an address a proven peer when it
// sends back, in a long header, a server ID the server sent there; an
// address the server answers has credit; a returning user (a proven peer's
// Initials, an answered one's on credit) passes its network's limits and
// goes first at the opening total, within half of it. Three ways to ride on
// that, and one to be hurt by it:
//
//   - Guess: warm a victim's address with real first flights (the server
//     binds their IDs to it), then send long headers to random IDs from
//     it (PacketGuess); each is an attempt at a proof, paced by the
//     filter's proof pacer.
//   - Borrow: have the server answer a victim's address, then make the
//     attacker's own connection send from it (a path probe, probePaths),
//     which quic-go answers with a PATH_CHALLENGE there.
//   - Prove for real: bots that receive at their addresses prove them
//     (proveBots), then flood Initials under every per-address limit.
//   - A returning client inside a /24 flooded from its other addresses.

// Rates and sizes of the attacks on proofs.
const (
	// probeInterval is how often the attacker's connection adds a path
	// from the victim's address and probes it (borrowed-proof).
	probeInterval = 150 * time.Millisecond
	// probeWait is how long each probe waits for a PATH_RESPONSE that the
	// victim's silent socket never lets come.
	probeWait = 100 * time.Millisecond
	// proofSize is the size of a bot's proof: one Handshake datagram.
	proofSize = 100
	// proofSettle is how long the proofs are given to reach the filter
	// before the proofs counter is read again.
	proofSettle = 300 * time.Millisecond
	// proofsKind is the learned counter's kind that counts proofs, and
	// unpacedKind the attempts the proof pacer had no room for.
	proofsKind  = "proofs"
	unpacedKind = "unpaced_attempts"
)

// learnedMetric is the counter of what the limiter learned, by kind.
const learnedMetric = modulePrefix + "learned_total"

// learnedOf returns the value of the learned counter's kind in a scrape or a
// delta, summed over limiters; false when the series is absent.
func learnedOf(series []Series, kind string) (float64, bool) {
	v, ok := 0.0, false
	for _, s := range series {
		if s.Metric == learnedMetric && s.Labels["kind"] == kind {
			v, ok = v+s.Value, true
		}
	}
	return v, ok
}

// provenHows are the verifications of a proven peer's datagrams (short
// headers, Handshakes, Initials with an ID that does not verify them): a
// flood from an address that got proven would show in them.
var provenHows = []string{"short_by_peer", "handshake_from_peer", "opening_from_peer"}

// verifiedOf sums the verified counter's series of the given hows.
func verifiedOf(series []Series, hows ...string) float64 {
	v := 0.0
	for _, s := range series {
		if s.Metric == verifiedMetric && slices.Contains(hows, s.Labels["how"]) {
			v += s.Value
		}
	}
	return v
}

// values lists a scrape's series.
func (c counters) values() []Series {
	out := make([]Series, 0, len(c))
	for _, s := range c {
		out = append(out, s)
	}
	return out
}

// BotsResult is what proving the bots did, before the flood.
type BotsResult struct {
	// Bots counts the bots that opened a connection and sent their
	// proof.
	Bots int `json:"bots"`
	// Proofs is the rise of the module's proofs counter over the proving
	// (nil without the module's counters: plain Caddy).
	Proofs *float64 `json:"proofs,omitempty"`
	// Seconds is how long the proving took.
	Seconds float64 `json:"seconds"`
}

// proofDatagram returns a bot's proof: a version 1 Handshake datagram of
// proofSize bytes whose destination ID is id, the server ID of the bot's
// connection, from a random 8-byte source ID; its Length field covers the
// rest of the datagram, as lengths verification wants.
func proofDatagram(id [quicclass.ServerIDLen]byte, rng *rand.Rand) []byte {
	var scid [attackSCIDLen]byte
	binary.LittleEndian.PutUint64(scid[:], rng.Uint64())
	return quicclasstest.LongPacket(quicclass.Version1, longTypeHandshake, id[:], scid[:], nil, proofSize)
}

// proveBots opens a real HTTP/3 connection to dst from each of hosts (a
// socket bound to it, which receives the server's packets), reads the
// server ID the server chose for it (dialAttacker) and sends, from the same
// socket, one Handshake datagram to that ID (proofDatagram): the filter
// proves the address. It returns the connections, open, or an error with
// every connection closed.
func proveBots(ctx context.Context, hosts []netip.Addr, dst netip.AddrPort, seed uint64) ([]*h3Conn, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc908))
	var conns []*h3Conn
	fail := func(err error) ([]*h3Conn, error) {
		for _, h := range conns {
			h.close()
		}
		return nil, err
	}
	for _, host := range hosts {
		h, id, err := dialAttacker(ctx, host, dst)
		if err != nil {
			return fail(fmt.Errorf("bot %v: %w", host, err))
		}
		conns = append(conns, h)
		if _, err := h.udp.WriteToUDPAddrPort(proofDatagram(id, rng), dst); err != nil {
			return fail(fmt.Errorf("bot %v: sending its proof: %w", host, err))
		}
	}
	return conns, nil
}

// mute is a socket that sends and never reads: an address the attacker
// sends from and does not receive at. It hides the socket's other methods,
// through which quic-go would read; a read deadline (how quic-go's
// Transport stops its reader) ends its reads.
type mute struct {
	c      *net.UDPConn
	closed chan struct{}
	once   sync.Once
	sent   atomic.Int64
}

func newMute(src netip.Addr) (*mute, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		return nil, fmt.Errorf("binding %v: %w", src, err)
	}
	return &mute{c: c, closed: make(chan struct{})}, nil
}

func (m *mute) ReadFrom([]byte) (int, net.Addr, error) {
	<-m.closed
	return 0, nil, net.ErrClosed
}

func (m *mute) WriteTo(b []byte, a net.Addr) (int, error) {
	m.sent.Add(1)
	return m.c.WriteTo(b, a)
}

func (m *mute) stopReads() { m.once.Do(func() { close(m.closed) }) }

// SetReadBuffer, SetWriteBuffer and SyscallConn let quic-go size the
// socket's buffers as it does for a *net.UDPConn (it reads none of it).
func (m *mute) SetReadBuffer(n int) error             { return m.c.SetReadBuffer(n) }
func (m *mute) SetWriteBuffer(n int) error            { return m.c.SetWriteBuffer(n) }
func (m *mute) SyscallConn() (syscall.RawConn, error) { return m.c.SyscallConn() }

func (m *mute) LocalAddr() net.Addr                { return m.c.LocalAddr() }
func (m *mute) SetDeadline(t time.Time) error      { return m.SetReadDeadline(t) }
func (m *mute) SetWriteDeadline(t time.Time) error { return m.c.SetWriteDeadline(t) }

func (m *mute) SetReadDeadline(t time.Time) error {
	if !t.IsZero() {
		m.stopReads()
	}
	return nil
}

// Close ends the reads; the socket stays open until drain.
func (m *mute) Close() error {
	m.stopReads()
	return nil
}

// drain counts the datagrams waiting in the socket, what the server sent
// to it, without ever having read them before, and closes the socket.
func (m *mute) drain() int {
	defer m.c.Close()
	n := 0
	buf := make([]byte, 2048)
	for {
		m.c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, _, err := m.c.ReadFrom(buf); err != nil {
			return n
		}
		n++
	}
}

// ProbeResult is what the attacker's path probes from a victim's address
// did during the flood.
type ProbeResult struct {
	// Paths counts the paths added (one per probe), Datagrams the
	// datagrams the attacker's connection sent on them, from the
	// victim's address.
	Paths     int   `json:"paths"`
	Datagrams int64 `json:"datagrams"`
	// Answers counts the server's datagrams that reached the victim's
	// sockets (read after the flood, never during it).
	Answers int `json:"answers"`
	// Validated counts the probes that succeeded: none can, since
	// nothing reads at the victim's address.
	Validated  int    `json:"validated"`
	Errors     int    `json:"errors,omitempty"`
	FirstError string `json:"first_error,omitempty"`
}

// prober adds paths from a victim's address to the attacker's connection
// and probes them (run); finish closes them and counts what came back.
type prober struct {
	conn  *quic.Conn
	hosts []netip.Addr
	mu    sync.Mutex
	res   ProbeResult
	mutes []*mute
	trs   []*quic.Transport
}

func (p *prober) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.res.Errors++
	if p.res.FirstError == "" {
		p.res.FirstError = err.Error()
	}
}

// run probes a new path from each host every probeInterval, for d or
// until ctx is done.
func (p *prober) run(ctx context.Context, d time.Duration) {
	end := time.Now().Add(d)
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for time.Now().Before(end) && ctx.Err() == nil {
		for _, h := range p.hosts {
			p.probe(ctx, h)
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// probe adds one path from host, over a mute socket, and probes it for
// probeWait.
func (p *prober) probe(ctx context.Context, host netip.Addr) {
	m, err := newMute(host)
	if err != nil {
		p.fail(err)
		return
	}
	tr := &quic.Transport{Conn: m}
	p.mu.Lock()
	p.mutes, p.trs = append(p.mutes, m), append(p.trs, tr)
	p.mu.Unlock()
	path, err := p.conn.AddPath(tr)
	if err != nil {
		p.fail(fmt.Errorf("adding a path: %w", err))
		return
	}
	pctx, cancel := context.WithTimeout(ctx, probeWait)
	err = path.Probe(pctx)
	cancel()
	p.mu.Lock()
	p.res.Paths++
	if err == nil {
		p.res.Validated++
	}
	p.mu.Unlock()
	if err == nil {
		return // validated: keep it, to be counted
	}
	if err := path.Close(); err != nil && !errors.Is(err, quic.ErrPathClosed) {
		p.fail(fmt.Errorf("closing a path: %w", err))
	}
}

// finish stops the paths' transports (after the attacker's connection is
// closed: a transport's close ends the connections it carries) and counts
// what the server sent to the victim's sockets.
func (p *prober) finish() ProbeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, tr := range p.trs {
		tr.Close()
		p.res.Datagrams += p.mutes[i].sent.Load()
		p.res.Answers += p.mutes[i].drain()
	}
	p.trs, p.mutes = nil, nil
	return p.res
}

// The opening total's timeline: the module's cap in force on the opening
// class and that class's verdicts, each second of the flood.

// Metrics the timeline reads.
const (
	openingTotalMetric = modulePrefix + "opening_total_per_second"
	verifiedMetric     = modulePrefix + "verified_packets_total"
)

// OpeningSecond is one interval between two scrapes of the timeline.
type OpeningSecond struct {
	// At is the interval's end, in seconds since the flood's start.
	At float64 `json:"at"`
	// TotalPPS is the opening total in force, the larger of its values
	// at the interval's ends; nil when it was lifted.
	TotalPPS *float64 `json:"total_pps"`
	// PassedPPS is the opening class's datagrams let through (passed and
	// limited verdicts) per second over the interval, FromPeerPPS the
	// Initials from proven peers (verified opening_from_peer: the
	// returning users' Initials, let through or not).
	PassedPPS   float64 `json:"passed_pps"`
	FromPeerPPS float64 `json:"from_peer_pps"`
}

// OpeningTimeline is the opening class over the flood, second by second.
type OpeningTimeline struct {
	Seconds []OpeningSecond `json:"seconds"`
	// Scrapes that failed.
	Failures int `json:"failures,omitempty"`
}

// openingScrape is what one scrape of the timeline read.
type openingScrape struct {
	at       time.Time
	total    float64 // +Inf when lifted
	passed   float64
	fromPeer float64
}

// parseOpening reads an opening scrape from a Prometheus text exposition;
// false when it holds no opening total (no module).
func parseOpening(body []byte, at time.Time) (openingScrape, bool, error) {
	s := openingScrape{at: at}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return s, false, fmt.Errorf("parsing metrics: %w", err)
	}
	fam, ok := fams[openingTotalMetric]
	if !ok || len(fam.GetMetric()) == 0 {
		return s, false, nil
	}
	value := func(f *dto.MetricFamily, m *dto.Metric) float64 {
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		}
		return m.GetUntyped().GetValue()
	}
	label := func(m *dto.Metric, name string) string {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == name {
				return lp.GetValue()
			}
		}
		return ""
	}
	for _, m := range fam.GetMetric() {
		s.total = max(s.total, value(fam, m))
	}
	if f, ok := fams[packetsMetric]; ok {
		for _, m := range f.GetMetric() {
			if v := label(m, "verdict"); label(m, "class") == "opening" && (v == "passed" || v == "limited") {
				s.passed += value(f, m)
			}
		}
	}
	if f, ok := fams[verifiedMetric]; ok {
		for _, m := range f.GetMetric() {
			if label(m, "how") == "opening_from_peer" {
				s.fromPeer += value(f, m)
			}
		}
	}
	return s, true, nil
}

// timeline turns scrapes into intervals, from start.
func timeline(scrapes []openingScrape, start time.Time) []OpeningSecond {
	var out []OpeningSecond
	for i := 1; i < len(scrapes); i++ {
		a, b := scrapes[i-1], scrapes[i]
		dt := b.at.Sub(a.at).Seconds()
		if dt <= 0 {
			continue
		}
		sec := OpeningSecond{At: b.at.Sub(start).Seconds(), PassedPPS: (b.passed - a.passed) / dt, FromPeerPPS: (b.fromPeer - a.fromPeer) / dt}
		if total := max(a.total, b.total); !math.IsInf(total, 1) {
			sec.TotalPPS = &total
		}
		out = append(out, sec)
	}
	return out
}

// sampleOpening scrapes c's opening total and verdicts every second for d
// (and once at its start and end), and returns the timeline; nil when c
// has no module.
func sampleOpening(ctx context.Context, c *caddyProc, d time.Duration) *OpeningTimeline {
	start := time.Now()
	var scrapes []openingScrape
	failures := 0
	module := false
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * time.Second)
		if at.After(start.Add(d)) {
			at = start.Add(d)
		}
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		body, err := c.admin(ctx, "/metrics")
		now := time.Now()
		var s openingScrape
		var ok bool
		if err == nil {
			s, ok, err = parseOpening(body, now)
		}
		switch {
		case err != nil:
			failures++
		case ok:
			module = true
			scrapes = append(scrapes, s)
		}
		if !at.Before(start.Add(d)) {
			break
		}
	}
	if !module {
		return nil
	}
	return &OpeningTimeline{Seconds: timeline(scrapes, start), Failures: failures}
}

// openingFigures are the timeline's figures: the most the opening class
// let through in a second, the least total in force, and the largest ratio
// of the two in one interval (above 1: more passed than the total).
func (t *OpeningTimeline) figures() (maxPassed, minTotal, maxRatio, medianFromPeer float64, ok bool) {
	if t == nil || len(t.Seconds) == 0 {
		return 0, 0, 0, 0, false
	}
	minTotal = math.Inf(1)
	var peers []float64
	for _, s := range t.Seconds {
		maxPassed = max(maxPassed, s.PassedPPS)
		peers = append(peers, s.FromPeerPPS)
		if s.TotalPPS != nil && *s.TotalPPS > 0 {
			minTotal = min(minTotal, *s.TotalPPS)
			maxRatio = max(maxRatio, s.PassedPPS / *s.TotalPPS)
		}
	}
	if math.IsInf(minTotal, 1) {
		minTotal, maxRatio = math.NaN(), math.NaN() // lifted throughout
	}
	return maxPassed, minTotal, maxRatio, median(peers), true
}
