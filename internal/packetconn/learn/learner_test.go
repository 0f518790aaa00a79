//go:build linux

package learn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// recSink records what it is taught; it refuses with idErr and peerErr
// when they are set, and each call waits for gate when it is not nil,
// after signalling entered.
type recSink struct {
	mu sync.Mutex
	// ids counts each ID taught, to the address it was last bound to.
	ids            map[ServerID]int
	to             map[ServerID]netip.Addr
	peers          map[netip.Addr]int
	credit         map[netip.Addr]int
	idErr, peerErr error
	gate, entered  chan struct{}
}

func newRecSink() *recSink {
	return &recSink{ids: map[ServerID]int{}, to: map[ServerID]netip.Addr{}, peers: map[netip.Addr]int{},
		credit: map[netip.Addr]int{}}
}

func (s *recSink) wait() {
	if s.gate != nil {
		s.entered <- struct{}{}
		<-s.gate
	}
}

func (s *recSink) LearnServerID(id ServerID, to netip.Addr) error {
	s.wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[id]++
	s.to[id] = to
	return s.idErr
}

// boundTo returns the address id was last bound to.
func (s *recSink) boundTo(id ServerID) netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.to[id]
}

func (s *recSink) LearnPeer(addr netip.Addr) error {
	s.wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peers[addr]++
	return s.peerErr
}

func (s *recSink) Grant(addr netip.Addr, credits int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.credit[addr] += credits
	return nil
}

// credits returns the credits addr was granted.
func (s *recSink) credits(addr netip.Addr) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.credit[addr]
}

// counts returns how often id and addr were taught.
func (s *recSink) counts(id ServerID, addr netip.Addr) (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[id], s.peers[addr]
}

// nopSink accepts everything and keeps nothing.
type nopSink struct{}

func (nopSink) LearnServerID(ServerID, netip.Addr) error { return nil }
func (nopSink) LearnPeer(netip.Addr) error               { return nil }
func (nopSink) Grant(netip.Addr, int) error              { return nil }

// testLearner returns a Learner teaching sink on a fake clock.
func testLearner(t testing.TB, sink Sink, o Options) (*Learner, *testutil.Clock) {
	t.Helper()
	clk := &testutil.Clock{}
	l, err := newLearner(sink, o, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	return l, clk
}

var (
	peerA = netip.MustParseAddrPort("127.0.0.1:40000")
	v1    = uint32(quicclass.Version1)
)

// handshakeTo is a Handshake packet from the server's ID id.
func handshakeTo(id ServerID) []byte {
	return quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], id[:], nil, 100)
}

// shortTo is a short header of the server's to the client's handshake ID
// (client[:4]), as handshakeTo's connection sends: it proves nothing.
func shortTo() []byte {
	var dcid decide.ServerID
	copy(dcid[:], client[:4])
	return quicclasstest.ShortPacket(dcid, 50)
}

func TestNewLearnerRefuses(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 500 * time.Millisecond} {
		if _, err := NewLearner(nil, Options{Lifetime: d}); err == nil || !strings.Contains(err.Error(), "lifetime") {
			t.Errorf("lifetime %v: %v", d, err)
		}
	}
	l, err := NewLearner(nil, Options{})
	if err != nil || l.lifetime != int64(DefaultLifetime) || l.refresh != int64(DefaultLifetime/4) {
		t.Fatalf("default: %v, lifetime %d", err, l.lifetime)
	}
	var nl *Learner
	nl.Learn(handshakeTo(idA), nil, peerA) // a nil Learner learns nothing
}

// TestLearnDedupes: an ID is taught once, and again only a quarter of the
// lifetime after its last report; a peer at most once per PeerInterval.
func TestLearnDedupes(t *testing.T) {
	sink := newRecSink()
	l, clk := testLearner(t, sink, Options{Lifetime: 40 * time.Second})
	steps := []struct {
		after      time.Duration
		b          []byte
		ids, peers int // reports so far
	}{
		{0, handshakeTo(idA), 1, 1},
		{100 * time.Millisecond, handshakeTo(idA), 1, 1},
		{100 * time.Millisecond, shortTo(), 1, 1},
		{800 * time.Millisecond, shortTo(), 1, 2}, // PeerInterval after the first
		{500 * time.Millisecond, shortTo(), 1, 2},
		{8 * time.Second, handshakeTo(idA), 1, 3}, // 9.5 s: no refresh yet
		{500 * time.Millisecond, handshakeTo(idA), 2, 3},
		{time.Second, handshakeTo(idA), 2, 4},
	}
	for i, s := range steps {
		clk.Advance(s.after)
		l.Learn(s.b, nil, peerA)
		if ids, peers := sink.counts(idA, peerA.Addr()); ids != s.ids || peers != s.peers {
			t.Fatalf("step %d: taught the ID %d times and the peer %d times, want %d and %d", i, ids, peers, s.ids, s.peers)
		}
	}
	if st := l.Counts(); st.IDs != 2 || st.Peers != 4 || st.Errors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLearnPeerAddress: a peer is taught as an unmapped address without a
// zone, one entry whatever its port or mapping.
func TestLearnPeerAddress(t *testing.T) {
	tests := []struct {
		to   []string
		want netip.Addr
	}{
		{[]string{"[::ffff:127.0.0.1]:443", "127.0.0.1:444"}, netip.MustParseAddr("127.0.0.1")},
		{[]string{"[fe80::1%lo]:443", "[fe80::1]:443"}, netip.MustParseAddr("fe80::1")},
		{[]string{"[::1]:1", "[::1]:2"}, netip.IPv6Loopback()},
	}
	for _, tt := range tests {
		sink := newRecSink()
		l, _ := testLearner(t, sink, Options{})
		for _, to := range tt.to {
			l.Learn(quicclasstest.ShortHeader(50), nil, netip.MustParseAddrPort(to))
		}
		if _, n := sink.counts(ServerID{}, tt.want); n != 1 || len(sink.peers) != 1 {
			t.Errorf("%v: taught %v", tt.to, sink.peers)
		}
	}
	sink := newRecSink()
	l, _ := testLearner(t, sink, Options{})
	l.Learn(quicclasstest.ShortHeader(50), nil, netip.AddrPort{})
	if len(sink.peers) != 0 {
		t.Errorf("a datagram without a destination taught %v", sink.peers)
	}
}

// TestSinkErrors: a refused ID is reported again with the next packet that
// carries it; a refused peer only after PeerInterval.
func TestSinkErrors(t *testing.T) {
	sink := newRecSink()
	sink.idErr, sink.peerErr = errors.New("map full"), errors.New("map full")
	l, clk := testLearner(t, sink, Options{})
	l.Learn(handshakeTo(idA), nil, peerA)
	clk.Advance(time.Millisecond)
	l.Learn(handshakeTo(idA), nil, peerA)
	if ids, peers := sink.counts(idA, peerA.Addr()); ids != 2 || peers != 1 {
		t.Fatalf("refused: ID tried %d times, peer %d times; want 2, 1", ids, peers)
	}
	sink.mu.Lock()
	sink.idErr = nil
	sink.mu.Unlock()
	l.Learn(handshakeTo(idA), nil, peerA)
	l.Learn(handshakeTo(idA), nil, peerA)
	if ids, _ := sink.counts(idA, peerA.Addr()); ids != 3 {
		t.Fatalf("accepted at the third try: tried %d times", ids)
	}
	if st := l.Counts(); st.Errors != 3 || st.IDs != 1 || st.Peers != 0 {
		t.Fatalf("stats %+v, want 3 errors, 1 ID", st)
	}
}

// TestSetSink: a new sink is taught at once the IDs sent within the
// lifetime, and each peer at its next datagram; with no sink nothing is
// learned or remembered.
func TestSetSink(t *testing.T) {
	first := newRecSink()
	l, clk := testLearner(t, first, Options{Lifetime: 40 * time.Second})
	l.Learn(handshakeTo(idA), nil, peerA)
	clk.Advance(30 * time.Second)
	l.Learn(handshakeTo(idB), nil, peerA)
	clk.Advance(15 * time.Second) // A was sent 45 s ago, B 15 s ago

	second := newRecSink()
	l.SetSink(second)
	if a, _ := second.counts(idA, peerA.Addr()); a != 0 || second.ids[idB] != 1 || len(second.peers) != 0 {
		t.Fatalf("the new sink was taught %v and %v; want %x only", second.ids, second.peers, idB)
	}
	l.Learn(quicclasstest.ShortHeader(50), nil, peerA)
	if _, p := second.counts(idA, peerA.Addr()); p != 1 {
		t.Fatal("the new sink was not taught the peer at its next datagram")
	}

	l.SetSink(nil)
	id := ServerID{9, 9, 9, 9}
	l.Learn(handshakeTo(id), nil, netip.MustParseAddrPort("127.0.0.9:1"))
	third := newRecSink()
	l.SetSink(third)
	if third.ids[id] != 0 || third.ids[idB] != 1 || len(third.peers) != 0 {
		t.Fatalf("after a time without a sink, the new one was taught %v and %v", third.ids, third.peers)
	}
	if st := l.Counts(); st.IDs != 4 {
		t.Fatalf("stats %+v, want 4 IDs taught (A, B, B again, B again)", st)
	}
}

// TestOddIDs: Handshake packets whose ID is not 4 bytes are counted, and
// the callback is called once, with the length.
func TestOddIDs(t *testing.T) {
	var calls []int
	l, _ := testLearner(t, newRecSink(), Options{OnOddID: func(n int) { calls = append(calls, n) }})
	odd := quicclasstest.AppendLongPacket(nil, v1, typeHandshake, client[:4], client, nil, 100)
	l.Learn(odd, nil, peerA)
	l.Learn(cat(quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], client, nil, 100), odd), nil, peerA)
	if st := l.Counts(); st.OddIDs != 2 || len(calls) != 1 || calls[0] != len(client) {
		t.Fatalf("odd IDs %d, callback calls %v; want 2, [%d]", st.OddIDs, calls, len(client))
	}
}

// pad returns p followed by zeros to size bytes: after a packet, zeros read
// as a short header with the fixed bit clear, which ends the walk through
// coalesced packets.
func pad(p []byte, size int) []byte { return append(p, make([]byte, size-len(p))...) }

// TestGSOBatch: each segment of a GSO batch is a datagram of its own.
func TestGSOBatch(t *testing.T) {
	const size = 1200
	initial := pad(quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 300), size)
	handshake := pad(handshakeTo(idB), size)
	tests := []struct {
		name string
		b    []byte
		oob  []byte
		ids  []ServerID
		peer bool
	}{
		{"batch", cat(initial, handshake, quicclasstest.ShortHeader(500)), segmentMsg(size), []ServerID{idA, idB}, true},
		{"one datagram", cat(initial, handshake, quicclasstest.ShortHeader(500)), nil, []ServerID{idA}, true},
		{"short headers", cat(quicclasstest.ShortHeader(size), quicclasstest.ShortHeader(size), quicclasstest.ShortHeader(10)), segmentMsg(size), nil, true},
		{"last segment a Handshake", cat(pad(quicclasstest.ShortHeader(100), size), handshakeTo(idB)), segmentMsg(size), []ServerID{idB}, true},
		{"retry", quicclasstest.AppendLongPacket(nil, v1, typeRetry, client, idB[:], []byte("token"), 0), segmentMsg(size), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := newRecSink()
			l, _ := testLearner(t, sink, Options{})
			l.Learn(tt.b, tt.oob, peerA)
			for _, id := range tt.ids {
				if sink.ids[id] != 1 {
					t.Errorf("ID %x taught %d times", id, sink.ids[id])
				}
			}
			if len(sink.ids) != len(tt.ids) || (len(sink.peers) == 1) != tt.peer {
				t.Errorf("taught %v and %v; want %x and peer %v", sink.ids, sink.peers, tt.ids, tt.peer)
			}
		})
	}
}

// TestCredit: each lone short-header datagram of a connection grants its
// destination decide.CreditPerDatagram, but one to a destination ID of the
// server's latest long headers there, or coalesced after long headers (a
// handshake's), CreditInHandshake, and one shaped as quic-go's stateless
// replies to a datagram of the address's own (a path probe, 1200 bytes
// written alone; a stateless reset, 42 bytes) one; long headers alone,
// Retries and what is not QUIC grant nothing.
func TestCredit(t *testing.T) {
	const k, hs = decide.CreditPerDatagram, CreditInHandshake
	small := quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 300)
	initial := pad(small, 1200)
	var c4 decide.ServerID
	copy(c4[:], client[:4])
	tests := []struct {
		name   string
		before []byte // written first, to the same peer
		b      []byte
		oob    []byte
		want   int
	}{
		{"short header", nil, quicclasstest.ShortHeader(100), nil, k},
		{"short header, fixed bit clear", nil, make([]byte, 100), nil, 0},
		{"a path probe's shape", nil, quicclasstest.ShortHeader(1200), nil, 1},
		{"a stateless reset's shape", nil, quicclasstest.ShortHeader(42), nil, 1},
		{"1200 bytes in a GSO batch", nil, cat(quicclasstest.ShortHeader(1200), quicclasstest.ShortHeader(1200), quicclasstest.ShortHeader(42)), segmentMsg(1200), 2*k + 1},
		{"1201 bytes alone", nil, quicclasstest.ShortHeader(1201), nil, k},
		{"Initial and Handshake", nil, cat(small, handshakeTo(idA)), nil, 0},
		{"Initial, Handshake and 1-RTT", nil, cat(small, handshakeTo(idA), quicclasstest.ShortHeader(60)), nil, hs},
		{"a batch of the first flight", nil, cat(initial, pad(handshakeTo(idA), 1200), quicclasstest.ShortHeader(300)), segmentMsg(1200), k},
		{"0.5-RTT to the handshake's ID, alone", handshakeTo(idA), quicclasstest.ShortPacket(c4, 300), nil, hs},
		{"to another ID after a handshake", handshakeTo(idA), quicclasstest.ShortPacket(idB, 300), nil, k},
		{"Retry", nil, quicclasstest.AppendLongPacket(nil, v1, typeRetry, client, idB[:], []byte("token"), 0), nil, 0},
	}
	// A stateless reply's shape makes no peer: it grants nothing to an
	// address that is not one.
	t.Run("a stateless reset's shape to a stranger", func(t *testing.T) {
		sink := newRecSink()
		l, _ := testLearner(t, sink, Options{})
		l.Learn(quicclasstest.ShortHeader(42), nil, peerA)
		l.Learn(quicclasstest.ShortHeader(1200), nil, peerA)
		if _, peers := sink.counts(idA, peerA.Addr()); peers != 0 {
			t.Fatalf("a stateless reply's shape made a peer (%d reports)", peers)
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := newRecSink()
			l, _ := testLearner(t, sink, Options{})
			if tt.before != nil {
				l.Learn(tt.before, nil, peerA)
			}
			before := sink.credits(peerA.Addr())
			l.Learn(tt.b, tt.oob, peerA)
			if got := sink.credits(peerA.Addr()) - before; got != tt.want {
				t.Fatalf("granted %d, want %d", got, tt.want)
			}
		})
	}
}

// TestTeachBeforeWrite: a second writer to the same peer, or with the same
// ID, returns only after the sink has learned it for the first.
func TestTeachBeforeWrite(t *testing.T) {
	tests := []struct {
		name    string
		first   []byte
		then    []byte
		reports int // the ID and the peer of a Handshake
	}{
		{"peer", quicclasstest.ShortHeader(50), quicclasstest.ShortHeader(60), 1},
		{"ID", handshakeTo(idA), handshakeTo(idA), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := newRecSink()
			sink.gate, sink.entered = make(chan struct{}), make(chan struct{}, 1)
			l, _ := testLearner(t, sink, Options{})
			firstDone, thenDone := make(chan struct{}), make(chan struct{})
			go func() { l.Learn(tt.first, nil, peerA); close(firstDone) }()
			<-sink.entered // the first writer is in the sink
			go func() { l.Learn(tt.then, nil, peerA); close(thenDone) }()
			select {
			case <-thenDone:
				t.Fatal("the second writer went on while the sink was still learning for the first")
			case <-time.After(100 * time.Millisecond):
			}
			close(sink.gate)
			<-firstDone
			<-thenDone
			if len(sink.ids)+len(sink.peers) != tt.reports {
				t.Fatalf("taught %v and %v, want %d reports", sink.ids, sink.peers, tt.reports)
			}
		})
	}
}

// TestConcurrentLearn: writers on many goroutines teach each ID and each
// peer exactly once.
func TestConcurrentLearn(t *testing.T) {
	const writers, rounds, keys = 8, 200, 64
	sink := newRecSink()
	l, _ := testLearner(t, sink, Options{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				k := (w + r) % keys
				var id ServerID
				binary.BigEndian.PutUint32(id[:], uint32(k))
				to := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 1, byte(k)}), 443)
				l.Learn(handshakeTo(id), nil, to)
				l.Learn(shortTo(), nil, to)
			}
		})
	}
	wg.Wait()
	if len(sink.ids) != keys || len(sink.peers) != keys {
		t.Fatalf("taught %d IDs and %d peers, want %d each", len(sink.ids), len(sink.peers), keys)
	}
	for id, n := range sink.ids {
		if n != 1 {
			t.Errorf("ID %x taught %d times", id, n)
		}
	}
	for p, n := range sink.peers {
		if n != 1 {
			t.Errorf("peer %v taught %d times", p, n)
		}
	}
}

// TestLearnAllocatesNothing: learning from a datagram already seen
// allocates nothing, whatever the datagram.
func TestLearnAllocatesNothing(t *testing.T) {
	l, _ := testLearner(t, newRecSink(), Options{})
	mapped := netip.MustParseAddrPort("[::ffff:127.0.0.1]:443")
	batch := cat(quicclasstest.ShortHeader(1200), quicclasstest.ShortHeader(1200), quicclasstest.ShortHeader(700))
	oob := cat(cmsgTOS(), segmentMsg(1200))
	coalesced := cat(quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 300), handshakeTo(idA), quicclasstest.ShortHeader(100))
	tests := []struct {
		name string
		b    []byte
		oob  []byte
	}{
		{"short header", quicclasstest.ShortHeader(1200), nil},
		{"GSO batch", batch, oob},
		{"coalesced handshake", coalesced, nil},
	}
	for _, tt := range tests {
		l.Learn(tt.b, tt.oob, mapped)
		if n := testing.AllocsPerRun(100, func() { l.Learn(tt.b, tt.oob, mapped) }); n != 0 {
			t.Errorf("%s: %.1f allocations per datagram", tt.name, n)
		}
	}
}

// cmsgTOS is the ECN message quic-go adds to a datagram it marks.
func cmsgTOS() []byte { return cmsg(unix.IPPROTO_IP, unix.IP_TOS, []byte{2, 0, 0, 0}) }

// TestMemoryBound: tables past their bound empty a shard rather than grow;
// entries past their time are forgotten first; both tables full hold less
// memory than the package doc says.
func TestMemoryBound(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l, clk := testLearner(t, nopSink{}, Options{})
	for i := range MaxIDs {
		var id ServerID
		binary.BigEndian.PutUint32(id[:], uint32(i))
		l.learnID(boundID{id: id, to: netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}).As16()}, clk.Now())
	}
	for i := range MaxPeers {
		l.learnPeer(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), clk.Now(), &peerSeen{peer: true})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := after.HeapAlloc - before.HeapAlloc
	t.Logf("%d IDs and %d peers hold %.1f MiB; %d overflows", MaxIDs, MaxPeers, float64(held)/(1<<20), l.Counts().Overflows)
	if held > 16<<20 {
		t.Errorf("both tables full hold %d bytes, over the 16 MiB of the package doc", held)
	}
	runtime.KeepAlive(l)

	// Past the bound at one instant: shards empty (overflows), sizes stay.
	for i := range MaxPeers {
		l.learnPeer(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), clk.Now(), &peerSeen{peer: true})
	}
	if l.Counts().Overflows == 0 {
		t.Error("twice MaxPeers peers in one instant overflowed no shard")
	}
	// A second later the old peers are past their time: swept, no
	// overflow.
	over := l.Counts().Overflows
	clk.Advance(PeerInterval)
	for i := range MaxPeers {
		l.learnPeer(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), clk.Now(), &peerSeen{peer: true})
	}
	if got := l.Counts().Overflows; got != over {
		t.Errorf("peers a second old were not swept first: %d more overflows", got-over)
	}
	for i := range l.peers {
		if n := len(l.peers[i].m); n > peersPerShard {
			t.Errorf("peer shard %d holds %d entries, over %d", i, n, peersPerShard)
		}
	}
	for i := range l.ids {
		if n := len(l.ids[i].m); n > idsPerShard {
			t.Errorf("ID shard %d holds %d entries, over %d", i, n, idsPerShard)
		}
	}
}

// Example of a sink's error surfacing in Counts only: Learn never fails a
// write.
func ExampleLearner_Counts() {
	sink := newRecSink()
	sink.peerErr = errors.New("no room")
	l, _ := NewLearner(sink, Options{})
	l.Learn(quicclasstest.ShortHeader(100), nil, netip.MustParseAddrPort("127.0.0.1:443"))
	fmt.Printf("%+v\n", l.Counts())
	// Output: {IDs:0 Peers:0 Grants:64 Errors:1 OddIDs:0 Overflows:0}
}
