//go:build linux

package learn_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn/learntest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// twinSink teaches a Go twin of the filter, as the kernel filter is taught,
// on a monotonic clock of its own; safe for concurrent use.
type twinSink struct {
	mu    sync.Mutex
	f     *decide.Filter
	hk    sketch.HashKey
	start time.Time
}

func newTwinSink(t *testing.T) *twinSink {
	t.Helper()
	c := testutil.QUICLimits(1000, 200_000)
	c.VerifyIDs = true
	hk, err := sketch.NewHashKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := decide.New(c, hk)
	if err != nil {
		t.Fatal(err)
	}
	return &twinSink{f: f, hk: hk, start: time.Now()}
}

// now is the twin's time: a second in, so that stamps start past zero.
func (s *twinSink) now() int64 { return int64(time.Second + time.Since(s.start)) }

func (s *twinSink) LearnServerID(id learn.ServerID, to netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.LearnServerID(id, to, s.now())
}

func (s *twinSink) LearnPeer(addr netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.LearnPeer(addr, s.now())
}

func (s *twinSink) Grant(addr netip.Addr, credits int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.Grant(addr, credits)
}

// proven reports whether the twin holds a as a proven peer.
func (s *twinSink) proven(a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	pk, err := decide.PeerKeyOf(a)
	if err != nil {
		return false
	}
	return s.f.Learned().Proven.Find(decide.PeerHash(&s.hk, &pk)) >= 0
}

// credit returns a's credit in the twin, -1 when it is no answered peer.
func (s *twinSink) credit(a netip.Addr) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	pk, err := decide.PeerKeyOf(a)
	if err != nil {
		return -1
	}
	l := s.f.Learned()
	i := l.Answered.Find(decide.PeerHash(&s.hk, &pk))
	if i < 0 {
		return -1
	}
	return int(l.Credit.Of(i))
}

// flood runs n junk short headers (random 4-byte IDs, random ports) from a
// through the twin, a million a second from its time now, and returns how
// many it passed.
func (s *twinSink) flood(a netip.Addr, n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	at, passed := s.now(), 0
	for range n {
		var id decide.ServerID
		binary.BigEndian.PutUint32(id[:], rng.Uint32())
		b := quicclasstest.ShortPacket(id, 60)
		d := decide.Datagram{Key: sketch.KeyFrom(netip.AddrPortFrom(a, uint16(1024+rng.IntN(60000))), 443), Length: len(b), Probe: b}
		if !s.f.Decide(&d, at, rng.Uint32()).Drop {
			passed++
		}
		at += int64(time.Microsecond)
	}
	return passed
}

// mute is a socket that sends and never reads: an address the attacker
// sends from and does not receive at. It hides the socket's other methods,
// through which quic-go would read.
type mute struct {
	c      *net.UDPConn
	closed chan struct{}
	once   sync.Once
	sent   atomic.Int64
}

func (m *mute) ReadFrom([]byte) (int, net.Addr, error) {
	<-m.closed
	return 0, nil, net.ErrClosed
}

func (m *mute) WriteTo(b []byte, a net.Addr) (int, error) {
	m.sent.Add(1)
	return m.c.WriteTo(b, a)
}

func (m *mute) LocalAddr() net.Addr                { return m.c.LocalAddr() }
func (m *mute) SetDeadline(t time.Time) error      { return m.c.SetDeadline(t) }
func (m *mute) SetReadDeadline(t time.Time) error  { return nil }
func (m *mute) SetWriteDeadline(t time.Time) error { return m.c.SetWriteDeadline(t) }

func (m *mute) Close() error {
	m.once.Do(func() { close(m.closed) })
	return m.c.Close()
}

// TestBorrowedProof: an attacker with a connection of its own, which has
// the server answer a spoofed first flight from a victim's address, cannot
// borrow the standing of its connection for the victim through what
// quic-go then sends there: a path probe (its own 1-RTT packet from the
// victim's address, which quic-go answers with a PATH_CHALLENGE to a fresh
// ID), or stateless resets (with a reset key set, to short headers from
// the victim's address). The victim is never proven, its credit is what
// the spoofed flight earned and at most one for each datagram the
// attacker had the server answer, and a flood of junk from it is held:
// at least 99% dropped by the filter the learner taught.
func TestBorrowedProof(t *testing.T) {
	victim := netip.MustParseAddr("127.0.0.2")
	tests := []struct {
		name  string
		reset bool
		trick func(t *testing.T, s serverSide) int // the datagrams sent from the victim's address
	}{
		{"path probe", false, func(t *testing.T, s serverSide) int {
			ctr := &quic.Transport{Conn: testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))}
			t.Cleanup(func() { ctr.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := ctr.Dial(ctx, net.UDPAddrFromAddrPort(s.addr), s.clientTLS, &quic.Config{Versions: []quic.Version{quic.Version1}})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.CloseWithError(0, "")
			if err := learntest.Echo(ctx, conn, [][]byte{[]byte("ping")}); err != nil {
				t.Fatal(err)
			}
			sent := 0
			for range 3 {
				m := &mute{c: testutil.Sender(t, netip.AddrPortFrom(victim, 0)), closed: make(chan struct{})}
				path, err := conn.AddPath(&quic.Transport{Conn: m})
				if err != nil {
					t.Fatal(err)
				}
				pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
				if err := path.Probe(pctx); err == nil {
					t.Fatal("a path from an address that reads nothing was validated")
				}
				pcancel()
				sent += int(m.sent.Load())
			}
			return sent
		}},
		{"stateless resets", true, func(t *testing.T, s serverSide) int {
			spoofer := testutil.Sender(t, netip.AddrPortFrom(victim, 0))
			rng := rand.New(rand.NewPCG(1, 1))
			const n = 50
			for range n {
				var id decide.ServerID
				binary.BigEndian.PutUint32(id[:], rng.Uint32())
				if _, err := spoofer.WriteToUDPAddrPort(quicclasstest.ShortPacket(id, 100), s.addr); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Millisecond)
			}
			return n
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServerSide(t)
			sink := newTwinSink(t)
			s.learner.SetSink(sink)
			rl := &replyLog{Conn: s.conn, out: map[netip.Addr][][]byte{}}
			tr := &quic.Transport{Conn: rl}
			if tt.reset {
				var key quic.StatelessResetKey
				copy(key[:], "a stateless reset key for a test")
				tr.StatelessResetKey = &key
			}
			learntest.Serve(t, tr, s.serverTLS, learntest.ServerConfig(quic.Version1))
			spoofFlight(t, s, victim)
			rl.waitReply(t, victim)
			earned := sink.credit(victim)
			if earned < 0 {
				t.Fatal("the spoofed flight's answer made no answered peer")
			}
			sent := tt.trick(t, s)
			time.Sleep(100 * time.Millisecond)
			replies := len(rl.waitReply(t, victim))
			credit := sink.credit(victim)
			if sink.proven(victim) || credit > earned+sent {
				t.Fatalf("after %d datagrams from the victim's address: proven %v, credit %d (the spoofed flight earned %d)",
					sent, sink.proven(victim), credit, earned)
			}
			const n = 1_000_000
			if passed := sink.flood(victim, n); passed > n/100 {
				t.Fatalf("a flood from the victim's address: %d of %d passed", passed, n)
			} else {
				t.Logf("%d replies to the victim; its credit %d (earned %d by the flight); a flood from it: %d of %d passed",
					replies, credit, earned, passed, n)
			}
		})
	}
}
