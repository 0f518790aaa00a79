//go:build linux

package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
)

func TestServerIDOf(t *testing.T) {
	id := []byte{0xa1, 0xb2, 0xc3, 0xd4}
	client := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	long := func(v uint32, typ uint8, dcid, scid []byte) []byte {
		return quicclasstest.AppendLongPacket(nil, v, typ, dcid, scid, nil, 100)
	}
	for _, tt := range []struct {
		name string
		b    []byte
		want []byte // nil: none
	}{
		{"v1 Initial", long(quicclass.Version1, longTypeInitial, client, id), id},
		{"v1 Handshake", long(quicclass.Version1, longTypeHandshake, client, id), id},
		{"v2 Initial", long(quicclass.Version2, longTypeInitial, client, id), id},
		{"v2 Handshake", long(quicclass.Version2, longTypeHandshake, client, id), id},
		{"v1 Retry", long(quicclass.Version1, 3, client, id), nil},
		{"v2 Retry", long(quicclass.Version2, 3, client, id), nil},
		{"0-RTT", long(quicclass.Version1, 1, client, id), nil},
		{"8-byte source ID", long(quicclass.Version1, longTypeInitial, id, client), nil},
		{"version negotiation", append([]byte{0x80, 0, 0, 0, 0, 8}, append(append(client, 4), id...)...), nil},
		{"unknown version", long(0x5a6a7a8a, longTypeInitial, client, id), nil},
		{"short header", quicclasstest.ShortHeader(100), nil},
		{"cut in the source ID", long(quicclass.Version1, longTypeInitial, client, id)[:16], nil},
		{"cut in the destination ID", long(quicclass.Version1, longTypeInitial, client, id)[:9], nil},
		{"empty", nil, nil},
	} {
		got, ok := serverIDOf(tt.b)
		if ok != (tt.want != nil) || ok && !bytes.Equal(got[:], tt.want) {
			t.Errorf("%s: %x, %v; want %x", tt.name, got, ok, tt.want)
		}
	}
}

func TestSetHosts(t *testing.T) {
	hosts, err := setHosts(answeredNet, answeredSet)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]bool{}
	nets := map[netip.Prefix]int{}
	for _, h := range hosts {
		if !answeredNet.Contains(h) || seen[h] || h.As4()[3] == 0 || h.As4()[3] > 8 {
			t.Fatalf("host %v (repeated: %v)", h, seen[h])
		}
		seen[h] = true
		nets[netip.PrefixFrom(h, 24).Masked()]++
	}
	if len(hosts) != answeredSet || len(nets) != 256 {
		t.Errorf("%d hosts in %d /24s, want %d in 256", len(hosts), len(nets), answeredSet)
	}
	if hosts[0] != netip.MustParseAddr("127.129.0.1") || hosts[256] != netip.MustParseAddr("127.129.0.2") || hosts[1999] != netip.MustParseAddr("127.129.207.8") {
		t.Errorf("hosts 0, 256, 1999: %v %v %v", hosts[0], hosts[256], hosts[1999])
	}
	for _, tt := range []struct {
		p    string
		n    int
		want string
	}{
		{"127.129.0.0/25", 10, "want an IPv4 prefix from /8 to /24"},
		{"fd00::/64", 10, "want an IPv4 prefix from /8 to /24"},
		{"127.129.0.0/24", 255, "want 1 to 254"},
		{"127.129.0.0/16", 0, "want 1 to 65024"},
	} {
		if _, err := setHosts(netip.MustParsePrefix(tt.p), tt.n); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s, %d: err = %v, want %q", tt.p, tt.n, err, tt.want)
		}
	}
}

// TestAttackScenarios: the attack scenarios, their flood sources and what
// they need, and their selection by name.
func TestAttackScenarios(t *testing.T) {
	legit := netip.MustParsePrefix("127.77.0.0/24")
	attackNet := netip.MustParsePrefix("127.67.0.0/16")
	type want struct {
		kind      PacketKind
		attacker  bool
		spoofed   netip.Prefix
		set       int
		sources   int
		warmup    bool
		returning bool
		flights   int
		prove     bool
		probes    bool
		rate      int
		except    netip.Addr
	}
	tests := map[string]want{
		"id-spray-spoofed":     {kind: PacketIDShort, attacker: true, spoofed: spoofedNet},
		"id-spray-fixed":       {kind: PacketIDShort, attacker: true, sources: 1},
		"answered-reuse":       {kind: PacketReuse, spoofed: answeredNet, set: answeredSet, warmup: true, returning: true},
		"id-long-headers":      {kind: PacketIDLong, attacker: true, spoofed: spoofedNet, sources: 1},
		"id-guess":             {kind: PacketGuess, spoofed: guessNet, set: 1, warmup: true, flights: 16},
		"borrowed-proof":       {kind: PacketShort, attacker: true, spoofed: borrowedNet, set: 1, warmup: true, probes: true},
		"proven-botnet":        {kind: PacketInitial, spoofed: botNet, set: 60, prove: true, rate: 54_000},
		"returning-flooded-24": {kind: PacketShortInitial, spoofed: floodedNet, returning: true, except: floodedReturning},
	}
	seen := 0
	for _, sc := range Scenarios() {
		w, ok := tests[sc.Name]
		if !ok {
			if sc.attack() {
				t.Errorf("%s is an attack scenario", sc.Name)
			}
			continue
		}
		seen++
		f := sc.Flood
		if !sc.attack() || f == nil || f.Kind != w.kind || f.Attacker.IsValid() != w.attacker || f.Spoofed != w.spoofed ||
			f.SpoofedSet != w.set || len(f.Sources) != w.sources || f.Warmup != w.warmup || sc.Returning != w.returning ||
			f.WarmupFlights != w.flights || f.Prove != w.prove || f.PathProbes != w.probes || f.Rate != w.rate || f.SpoofedExcept != w.except {
			t.Errorf("%s: %+v, flood %+v; want %+v", sc.Name, sc, f, w)
			continue
		}
		if f.Kind.needsServerID() && !f.Attacker.IsValid() {
			t.Errorf("%s: %s without an attacker's connection", sc.Name, f.Kind)
		}
		if f.Spoofed.IsValid() && (!spoofedNet.Contains(f.Spoofed.Addr()) || f.Spoofed.Bits() < spoofedNet.Bits()) {
			t.Errorf("%s: spoofed from %v, outside %v", sc.Name, f.Spoofed, spoofedNet)
		}
		// The attacker's connection and the fixed sources: in
		// 127.67.0.0/16, one /24 per scenario, never the same address.
		addrs := append([]netip.Addr{}, f.Sources...)
		if f.Attacker.IsValid() {
			addrs = append(addrs, f.Attacker)
		}
		for _, a := range addrs {
			if !attackNet.Contains(a) || legit.Contains(a) || spoofedNet.Contains(a) || netip.PrefixFrom(a, 24).Masked() != netip.PrefixFrom(addrs[0], 24).Masked() {
				t.Errorf("%s: source %v", sc.Name, a)
			}
		}
		if slices.Contains(f.Sources, f.Attacker) {
			t.Errorf("%s: the flood comes from the attacker's own address %v", sc.Name, f.Attacker)
		}
	}
	if seen != len(tests) {
		t.Errorf("%d attack scenarios, want %d", seen, len(tests))
	}
	if !legit.Contains(returningSrc) || returningSrc == newConnSrc || returningSrc == establishedSrc {
		t.Errorf("returning client at %v", returningSrc)
	}
	// The ranges of the attacks on proofs: in the spoofed range, apart
	// from each other and from answered-reuse's; the bots one per /24;
	// the flooded /24's returning client inside it, and no other
	// scenario's returning client moved.
	ranges := []netip.Prefix{answeredNet, guessNet, botNet, floodedNet, borrowedNet}
	for i, p := range ranges {
		for _, q := range ranges[i+1:] {
			if p.Overlaps(q) {
				t.Errorf("%v overlaps %v", p, q)
			}
		}
	}
	if hosts, err := setHosts(botNet, bots); err != nil || len(hosts) != 60 || hosts[59] != netip.MustParseAddr("127.131.59.1") {
		t.Errorf("bots %v (%v)", hosts, err)
	}
	// The stranger client: proven-botnet's alone, a new address of its
	// quiet /24 for each connection, away from every other range.
	for i, want := range map[int]string{0: "127.76.0.1", 253: "127.76.0.254", 254: "127.76.0.1"} {
		if got := strangerAddr(i); got.String() != want {
			t.Errorf("stranger address %d: %v, want %s", i, got, want)
		}
	}
	if strangerNet.Overlaps(legit) || strangerNet.Overlaps(spoofedNet) || strangerNet.Overlaps(attackNet) {
		t.Errorf("stranger network %v", strangerNet)
	}
	for _, sc := range Scenarios() {
		if sc.Stranger != (sc.Name == "proven-botnet") {
			t.Errorf("%s: stranger client %v", sc.Name, sc.Stranger)
		}
		want := returningSrc
		if sc.Name == "returning-flooded-24" {
			want = floodedReturning
			if !sc.ReturningKeeps || !floodedNet.Contains(want) || legit.Contains(want) {
				t.Errorf("%s: returning client at %v, keeps %v", sc.Name, want, sc.ReturningKeeps)
			}
		}
		if got := sc.returningAddr(); got != want {
			t.Errorf("%s: returning client at %v, want %v", sc.Name, got, want)
		}
	}
	got, err := selectScenarios("id-spray-spoofed,id-spray-fixed,answered-reuse,id-long-headers")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sc := range got {
		names = append(names, sc.Name)
	}
	if strings.Join(names, ",") != "id-spray-spoofed,id-spray-fixed,answered-reuse,id-long-headers" {
		t.Errorf("selected %v", names)
	}
}

// TestClientFlights: each flight is one Initial of at least 1200 bytes, a
// valid opening to the classifier, with its own destination ID.
func TestClientFlights(t *testing.T) {
	flights, err := clientFlights(context.Background(), 20)
	if err != nil {
		t.Fatal(err)
	}
	dcids := map[string]bool{}
	for i, f := range flights {
		h := quicclass.Inspect(nil, 4433, f, len(f), true)
		if len(f) < quicclass.MinInitialDatagram || h.Check != quicclass.CheckOpening || h.Reason != quicclass.NotInvalid || f[0]&0x30 != 0 {
			t.Fatalf("flight %d: %d bytes, %+v", i, len(f), h)
		}
		dcids[string(f[6:6+int(f[5])])] = true
	}
	if len(flights) != 20 || len(dcids) != 20 {
		t.Errorf("%d flights with %d destination IDs, want 20", len(flights), len(dcids))
	}
}

// recordingConn is a server's socket that records, from what the server
// writes, the server IDs of its long headers and the addresses it writes
// to. It keeps quic-go's fast path (a *net.UDPConn underneath).
type recordingConn struct {
	*net.UDPConn
	mu  sync.Mutex
	ids map[[quicclass.ServerIDLen]byte]bool
	to  map[netip.Addr]bool
	// idsAt holds the server IDs written to each address.
	idsAt map[netip.Addr]map[[quicclass.ServerIDLen]byte]bool
}

func (c *recordingConn) record(b []byte, to netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	to = to.Unmap()
	if id, ok := serverIDOf(b); ok {
		c.ids[id] = true
		if c.idsAt[to] == nil {
			c.idsAt[to] = map[[quicclass.ServerIDLen]byte]bool{}
		}
		c.idsAt[to][id] = true
	}
	c.to[to] = true
}

// idsTo returns the server IDs written to a.
func (c *recordingConn) idsTo(a netip.Addr) [][quicclass.ServerIDLen]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][quicclass.ServerIDLen]byte
	for id := range c.idsAt[a] {
		out = append(out, id)
	}
	return out
}

func (c *recordingConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	c.record(b, addr.AddrPort().Addr())
	return c.UDPConn.WriteMsgUDP(b, oob, addr)
}

func (c *recordingConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if u, ok := addr.(*net.UDPAddr); ok {
		c.record(b, u.AddrPort().Addr())
	}
	return c.UDPConn.WriteTo(b, addr)
}

func (c *recordingConn) knows(id [quicclass.ServerIDLen]byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[id]
}

// wroteTo counts the addresses of hosts the server wrote to.
func (c *recordingConn) wroteTo(hosts []netip.Addr) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hosts {
		if c.to[h] {
			n++
		}
	}
	return n
}

// startRecordingServer serves the page over HTTP/3 on 127.0.0.1 from a
// recordingConn, with quic-go's defaults: no Retry, 4-byte server IDs.
func startRecordingServer(t *testing.T) (*recordingConn, netip.AddrPort) {
	t.Helper()
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	c := &recordingConn{UDPConn: udp, ids: map[[quicclass.ServerIDLen]byte]bool{}, to: map[netip.Addr]bool{},
		idsAt: map[netip.Addr]map[[quicclass.ServerIDLen]byte]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, page) })
	srv := &http3.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{testCert(t)}}}
	go srv.Serve(c)
	t.Cleanup(func() { srv.Close(); udp.Close() })
	return c, udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestAttackerReadsServerID: the attacker's connection is served and reads
// one of the IDs the server wrote in its long headers.
func TestAttackerReadsServerID(t *testing.T) {
	rec, dst := startRecordingServer(t)
	src := netip.MustParseAddr("127.67.0.1")
	h, id, err := dialAttacker(context.Background(), src, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	if got := h.udp.LocalAddr().(*net.UDPAddr).AddrPort().Addr(); got != src {
		t.Errorf("connection from %v, want %v", got, src)
	}
	if !rec.knows(id) {
		t.Errorf("server ID %x is none the server sent (%v)", id, rec.ids)
	}
	for range 3 {
		if _, err := h.get(context.Background(), "/", page, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAttackFloodsOnLoopback sends the attack scenarios' floods, bounded by
// count, to a sink: every datagram carries what its scenario says, from the
// sources it says.
func TestAttackFloodsOnLoopback(t *testing.T) {
	id := [quicclass.ServerIDLen]byte{0xa1, 0xb2, 0xc3, 0xd4}
	byName := map[string]*FloodSpec{}
	for _, sc := range Scenarios() {
		byName[sc.Name] = sc.Flood
	}
	for _, name := range []string{"id-spray-spoofed", "id-spray-fixed", "id-long-headers"} {
		t.Run(name, func(t *testing.T) {
			spec := byName[name]
			s := newSink(t, 0)
			f, err := openFlood(spec, s.port())
			if err != nil {
				t.Fatal(err)
			}
			f.serverID = id
			const n = 512 // 8 batches: 4 from each writer of id-long-headers
			res := f.run(context.Background(), 5*time.Second, n, 9)
			f.finish(&res, 0)
			if res.Sent != n || res.SendErrors != 0 || res.ServerID != "a1b2c3d4" {
				t.Fatalf("flood %+v", res)
			}
			if s.waitFor(n) != n {
				t.Fatalf("sink received %d of %d", s.got.Load(), n)
			}
			from, sizes := s.received()
			fixed := 0
			for i, a := range from {
				switch {
				case slices.Contains(spec.Sources, a.Addr()):
					fixed++
				case !spec.Spoofed.IsValid() || !spec.Spoofed.Contains(a.Addr()):
					t.Fatalf("datagram %d from %v", i, a)
				}
				if sizes[i] < 50 || sizes[i] > MaxDatagram {
					t.Fatalf("datagram %d: %d bytes", i, sizes[i])
				}
			}
			wantFixed := map[string]int{"id-spray-spoofed": 0, "id-spray-fixed": n, "id-long-headers": n / 2}[name]
			if fixed != wantFixed {
				t.Errorf("%d of %d from the fixed source, want %d", fixed, n, wantFixed)
			}
		})
	}
	// What the datagrams carry: the sink keeps no payloads; the
	// generators are those of the flood, checked with quicclass in
	// TestAttackPackets and here with the ID set as run sets it.
	for _, kind := range []PacketKind{PacketIDShort, PacketIDLong} {
		d := newBoundDatagrams(kind, 9)
		d.gen.serverID = id
		for i := range 200 {
			p := d.next(i % floodBatch)
			h := quicclass.Inspect(nil, 4433, p, len(p), true)
			if !h.HasID || h.ID != id || h.Reason != quicclass.NotInvalid {
				t.Fatalf("%s datagram %d: %+v", kind, i, h)
			}
		}
	}
}

// TestWarmupAnswered runs answered-reuse's flood with a set of 40 spoofed
// addresses: to a sink, its warm-up is one real first flight from each
// address of the set, in order, and the rest comes from those addresses
// only; to a quic-go server, the warm-up alone makes it write to every
// spoofed address.
func TestWarmupAnswered(t *testing.T) {
	const hosts = 40
	spec := *Scenarios()[slices.IndexFunc(Scenarios(), func(s Scenario) bool { return s.Name == "answered-reuse" })].Flood
	spec.SpoofedSet = hosts
	flights, err := clientFlights(context.Background(), hosts)
	if err != nil {
		t.Fatal(err)
	}
	set, err := setHosts(spec.Spoofed, hosts)
	if err != nil {
		t.Fatal(err)
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
		const n = hosts + 600
		res := f.run(context.Background(), 5*time.Second, n, 1)
		f.finish(&res, 0)
		if res.Sent != n || res.WarmupSent != hosts || res.SendErrors != 0 || res.Addresses > hosts {
			t.Fatalf("flood %+v", res)
		}
		if s.waitFor(n) != n {
			t.Fatalf("sink received %d of %d", s.got.Load(), n)
		}
		from, sizes := s.received()
		for i, a := range from {
			if i < hosts && (a.Addr() != set[i] || sizes[i] != len(flights[i])) {
				t.Fatalf("warm-up datagram %d: %d bytes from %v, want %d from %v", i, sizes[i], a, len(flights[i]), set[i])
			}
			if !slices.Contains(set, a.Addr()) {
				t.Fatalf("datagram %d from %v, outside the set", i, a)
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
		res := f.run(context.Background(), 5*time.Second, hosts, 2)
		f.finish(&res, 0)
		if res.Sent != hosts || res.WarmupSent != hosts {
			t.Fatalf("flood %+v", res)
		}
		for deadline := time.Now().Add(10 * time.Second); rec.wroteTo(set) < hosts && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if got := rec.wroteTo(set); got != hosts {
			t.Errorf("the server wrote to %d of the %d spoofed addresses", got, hosts)
		}
	})
}
