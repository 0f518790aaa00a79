//go:build linux

package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// scenarioFlood returns a copy of the named scenario's flood.
func scenarioFlood(t *testing.T, name string) FloodSpec {
	t.Helper()
	i := slices.IndexFunc(Scenarios(), func(s Scenario) bool { return s.Name == name })
	if i < 0 || Scenarios()[i].Flood == nil {
		t.Fatalf("no flood scenario %s", name)
	}
	return *Scenarios()[i].Flood
}

// TestSpoofedExcept: a flood from random addresses of a /24 but one never
// sends from that one, and refuses one outside its range.
func TestSpoofedExcept(t *testing.T) {
	dst := netip.MustParseAddrPort("127.0.0.1:4433")
	g, err := newSpoofGen(PacketShortInitial, floodedNet, dst, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.exclude(floodedReturning); err != nil {
		t.Fatal(err)
	}
	sources := map[netip.Addr]int{}
	for i := range 20_000 {
		d := parseSpoofed(t, g.next(i%floodBatch))
		if !floodedNet.Contains(d.src) || d.src == floodedReturning || !d.udpOK {
			t.Fatalf("datagram %d from %v (checksum %v)", i, d.src, d.udpOK)
		}
		sources[d.src]++
	}
	if len(sources) != 255 {
		t.Errorf("%d sources, want the 255 of the /24 but one", len(sources))
	}
	for _, a := range []string{"127.132.1.3", "127.0.0.1", "::1"} {
		if err := g.exclude(netip.MustParseAddr(a)); err == nil {
			t.Errorf("excluded %s, outside the range", a)
		}
	}
	spec := FloodSpec{Spoofed: floodedNet, SpoofedExcept: netip.MustParseAddr("127.132.1.3"), Kind: PacketShortInitial}
	if _, err := openFlood(&spec, 9); err == nil || !strings.Contains(err.Error(), "must be in its range") {
		t.Errorf("flood excepting a source outside its range: err = %v", err)
	}
}

// TestPacedFloodInTurn runs proven-botnet's flood with 6 bots at 6,000
// datagrams a second for half a second to a sink: the rate holds, and the
// bots send in turn, from random ports.
func TestPacedFloodInTurn(t *testing.T) {
	spec := scenarioFlood(t, "proven-botnet")
	spec.SpoofedSet, spec.Rate = 6, 6000
	s := newSink(t, 0)
	f, err := openFlood(&spec, s.port())
	if err != nil {
		t.Fatal(err)
	}
	res := f.run(context.Background(), 500*time.Millisecond, 1e6, 4)
	f.finish(&res, 0)
	if res.CountBound || res.SendErrors != 0 || res.Sent < 2700 || res.Sent > 3300 {
		t.Fatalf("flood %+v; want about 3000 datagrams in 0.5 s", res)
	}
	s.waitFor(int64(res.Sent))
	from, sizes := s.received()
	hosts, _ := setHosts(botNet, 6)
	per := map[netip.Addr]int{}
	ports := map[uint16]bool{}
	for i, a := range from {
		if want := hosts[i%6]; a.Addr() != want || sizes[i] != MaxDatagram {
			t.Fatalf("datagram %d: %d bytes from %v, want %v", i, sizes[i], a, want)
		}
		per[a.Addr()]++
		ports[a.Port()] = true
	}
	for _, h := range hosts {
		if n := per[h]; n < len(from)/6 || n > len(from)/6+1 {
			t.Errorf("bot %v sent %d of %d", h, n, len(from))
		}
	}
	if len(ports) < len(from)-100 {
		t.Errorf("%d ports in %d datagrams", len(ports), len(from))
	}
}

// TestGuessWarmup runs id-guess's flood to a sink: its warm-up is 16 real
// first flights, all from the victim's address, and the rest comes from
// that address too: short headers, Handshakes and Initials to random 4-byte
// IDs in turn. To a quic-go server, the warm-up has it write long headers
// to the victim with 16 IDs of its own.
func TestGuessWarmup(t *testing.T) {
	spec := scenarioFlood(t, "id-guess")
	victim := netip.MustParseAddr("127.130.0.1")
	flights, err := clientFlights(context.Background(), spec.warmupFlights())
	if err != nil {
		t.Fatal(err)
	}
	if len(flights) != 16 {
		t.Fatalf("%d flights", len(flights))
	}
	t.Run("sink", func(t *testing.T) {
		s := newSink(t, 0)
		f, err := openFlood(&spec, s.port())
		if err != nil {
			t.Fatal(err)
		}
		if err := f.prepareWarmup(flights, 1); err != nil {
			t.Fatal(err)
		}
		const n = 16 + 300
		res := f.run(context.Background(), 5*time.Second, n, 1)
		f.finish(&res, 0)
		if res.Sent != n || res.WarmupSent != 16 || res.SendErrors != 0 || res.Addresses != 1 {
			t.Fatalf("flood %+v", res)
		}
		if s.waitFor(n) != n {
			t.Fatalf("sink received %d of %d", s.got.Load(), n)
		}
		from, sizes := s.received()
		for i, a := range from {
			if a.Addr() != victim || i < 16 && sizes[i] != len(flights[i]) {
				t.Fatalf("datagram %d: %d bytes from %v", i, sizes[i], a)
			}
		}
	})
	t.Run("quic-go answers", func(t *testing.T) {
		rec, dst := startRecordingServer(t)
		f, err := openFlood(&spec, dst.Port())
		if err != nil {
			t.Fatal(err)
		}
		if err := f.prepareWarmup(flights, 2); err != nil {
			t.Fatal(err)
		}
		res := f.run(context.Background(), 5*time.Second, 16, 2)
		f.finish(&res, 0)
		if res.WarmupSent != 16 {
			t.Fatalf("flood %+v", res)
		}
		for deadline := time.Now().Add(10 * time.Second); len(rec.idsTo(victim)) < 16 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if got := len(rec.idsTo(victim)); got != 16 {
			t.Errorf("the server wrote %d IDs to the victim, want 16", got)
		}
	})
}

// TestProofDatagram: a bot's proof is a valid version 1 Handshake whose
// destination ID is the server ID: an attempt at a proof.
func TestProofDatagram(t *testing.T) {
	id := [quicclass.ServerIDLen]byte{9, 8, 7, 6}
	p := proofDatagram(id, rand.New(rand.NewPCG(1, 2)))
	h := quicclass.Inspect(nil, 4433, p, len(p), true)
	if len(p) != proofSize || h.Check != quicclass.CheckHandshake || !h.HasID || h.ID != id || h.Reason != quicclass.NotInvalid || !h.Attempts() {
		t.Fatalf("proof of %d bytes: %+v", len(p), h)
	}
}

// TestProveBots: each bot's connection comes from its own address and the
// ID it read is one the server wrote there; each stays usable.
func TestProveBots(t *testing.T) {
	rec, dst := startRecordingServer(t)
	hosts, err := setHosts(botNet, 3)
	if err != nil {
		t.Fatal(err)
	}
	conns, err := proveBots(context.Background(), hosts, dst, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, h := range conns {
			h.close()
		}
	}()
	if len(conns) != 3 {
		t.Fatalf("%d bots", len(conns))
	}
	for i, h := range conns {
		if got := h.udp.LocalAddr().(*net.UDPAddr).AddrPort().Addr(); got != hosts[i] {
			t.Errorf("bot %d at %v, want %v", i, got, hosts[i])
		}
		if len(rec.idsTo(hosts[i])) == 0 {
			t.Errorf("the server wrote no long header to bot %v", hosts[i])
		}
		if _, err := h.get(context.Background(), "/", page, nil); err != nil {
			t.Errorf("bot %d after its proof: %v", i, err)
		}
	}
}

// TestProbePaths: the attacker's connection adds paths from a victim's
// address over silent sockets and probes them; none is validated, the
// server answers each at the victim's address, and the connection goes on.
func TestProbePaths(t *testing.T) {
	rec, dst := startRecordingServer(t)
	victim := netip.MustParseAddr("127.133.0.1")
	h, _, err := dialAttacker(context.Background(), netip.MustParseAddr("127.67.4.1"), dst)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	p := &prober{conn: h.conn, hosts: []netip.Addr{victim}}
	p.run(context.Background(), 600*time.Millisecond)
	if _, err := h.get(context.Background(), "/", page, nil); err != nil {
		t.Errorf("the attacker's connection after the probes: %v", err)
	}
	h.close()
	res := p.finish()
	t.Logf("probes: %+v", res)
	if res.Paths < 3 || res.Datagrams < int64(res.Paths) || res.Validated != 0 || res.Errors != 0 {
		t.Errorf("probes %+v", res)
	}
	if res.Answers < 1 || rec.wroteTo([]netip.Addr{victim}) != 1 {
		t.Errorf("%d answers read at the victim's address; the server wrote to it: %d", res.Answers, rec.wroteTo([]netip.Addr{victim}))
	}
}

const openingExposition = `# TYPE caddy_rakelimit_opening_total_per_second gauge
caddy_rakelimit_opening_total_per_second{adaptive="true",limiter="default"} %s
# TYPE caddy_rakelimit_packets_total counter
caddy_rakelimit_packets_total{class="opening",family="ipv4",level="",limiter="default",listener="udp/:443",verdict="passed"} %d
caddy_rakelimit_packets_total{class="opening",family="ipv4",level="3",limiter="default",listener="udp/:443",verdict="limited"} 100
caddy_rakelimit_packets_total{class="opening",family="ipv4",level="3",limiter="default",listener="udp/:443",verdict="dropped"} 99999
caddy_rakelimit_packets_total{class="established",family="ipv4",level="",limiter="default",listener="udp/:443",verdict="passed"} 5000
# TYPE caddy_rakelimit_verified_packets_total counter
caddy_rakelimit_verified_packets_total{family="ipv4",how="opening_from_peer",limiter="default",listener="udp/:443"} %d
caddy_rakelimit_verified_packets_total{family="ipv4",how="short_by_id",limiter="default",listener="udp/:443"} 7
`

// TestOpeningTimeline: the opening total in force and the opening class's
// verdicts, from scrapes to intervals to figures; a lifted total is none.
func TestOpeningTimeline(t *testing.T) {
	start := time.Unix(1000, 0)
	var scrapes []openingScrape
	for i, sc := range []struct {
		total           string
		passed, fromPee int
	}{{"20000", 1000, 0}, {"20000", 19000, 30000}, {"15000", 35000, 80000}, {"+Inf", 36000, 80000}} {
		body := []byte(fmt.Sprintf(openingExposition, sc.total, sc.passed, sc.fromPee))
		s, ok, err := parseOpening(body, start.Add(time.Duration(i)*time.Second))
		if err != nil || !ok {
			t.Fatalf("scrape %d: %v, %v", i, ok, err)
		}
		scrapes = append(scrapes, s)
	}
	if s := scrapes[1]; s.total != 20000 || s.passed != 19100 || s.fromPeer != 30000 {
		t.Fatalf("scrape 1: %+v", s)
	}
	if _, ok, err := parseOpening([]byte("# TYPE caddy_rakelimit_packets_total counter\n"), start); ok || err != nil {
		t.Errorf("a scrape without the opening total: %v, %v", ok, err)
	}
	tl := &OpeningTimeline{Seconds: timeline(scrapes, start)}
	if len(tl.Seconds) != 3 {
		t.Fatalf("timeline %+v", tl.Seconds)
	}
	s1 := tl.Seconds[1]
	if s1.At != 2 || s1.PassedPPS != 16000 || s1.FromPeerPPS != 50000 || s1.TotalPPS == nil || *s1.TotalPPS != 20000 {
		t.Errorf("second 2: %+v", s1)
	}
	if tl.Seconds[2].TotalPPS != nil {
		t.Errorf("a lifted total in force: %v", *tl.Seconds[2].TotalPPS)
	}
	passed, total, over, peers, ok := tl.figures()
	if !ok || passed != 18000 || total != 20000 || over != 0.9 || peers != 30000 {
		t.Errorf("figures %v %v %v %v %v", passed, total, over, peers, ok)
	}
	if _, _, _, _, ok := (*OpeningTimeline)(nil).figures(); ok {
		t.Error("figures of no timeline")
	}
	lifted := &OpeningTimeline{Seconds: tl.Seconds[2:]}
	if _, total, over, _, ok := lifted.figures(); !ok || !math.IsNaN(total) || !math.IsNaN(over) {
		t.Errorf("lifted throughout: total %v, ratio %v", total, over)
	}
}

// TestLearnedOf: the learned counter's kinds, summed over limiters, from
// the series of a scrape's delta.
func TestLearnedOf(t *testing.T) {
	series := []Series{
		{Metric: learnedMetric, Labels: map[string]string{"limiter": "a", "kind": "proofs"}, Value: 2},
		{Metric: learnedMetric, Labels: map[string]string{"limiter": "b", "kind": "proofs"}, Value: 3},
		{Metric: learnedMetric, Labels: map[string]string{"limiter": "a", "kind": "credits"}, Value: 64},
		{Metric: packetsMetric, Labels: map[string]string{"kind": "proofs"}, Value: 100},
	}
	if v, ok := learnedOf(series, proofsKind); !ok || v != 5 {
		t.Errorf("proofs %v, %v", v, ok)
	}
	if v, ok := learnedOf(series, unpacedKind); ok || v != 0 {
		t.Errorf("unpaced attempts %v, %v", v, ok)
	}
}
