//go:build linux

package learn_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn/learntest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// newConn wraps conn in the packet conn quic-go reads and writes through,
// which shows l every write.
func newConn(t testing.TB, conn *net.UDPConn, l *learn.Learner) *packetconn.Conn {
	t.Helper()
	c, err := packetconn.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	c.SetLearner(l)
	return c
}

// cmsgConn is a Conn that counts the control messages quic-go writes with:
// GSO batches (UDP_SEGMENT) and ECN marks (IP_TOS, IPV6_TCLASS).
type cmsgConn struct {
	*packetconn.Conn
	gso, ecn atomic.Int64
}

func (c *cmsgConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	msgs, _ := unix.ParseSocketControlMessage(oob)
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_UDP && m.Header.Type == unix.UDP_SEGMENT:
			c.gso.Add(1)
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TOS,
			m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_TCLASS:
			c.ecn.Add(1)
		}
	}
	return c.Conn.WriteMsgUDP(b, oob, addr)
}

// TestQUICGoTeaches: a quic-go server writing through a Conn teaches its
// learner, before the client needs it, every ID the server reveals in a
// connection and the client's address, and grants it the credit that
// verifies every packet the client sends to an ID the learner cannot see,
// in both versions, with and without a Retry (which teaches nothing: the
// answer to it is a stranger's Initial); and it writes GSO batches and ECN
// marks through the Conn.
func TestQUICGoTeaches(t *testing.T) {
	tests := []struct {
		name string
		s    learntest.Setup
	}{
		{"v1", learntest.Setup{Version: quic.Version1}},
		{"v2", learntest.Setup{Version: quic.Version2}},
		{"v1 retry", learntest.Setup{Version: quic.Version1, Retry: true}},
		{"v2 retry", learntest.Setup{Version: quic.Version2, Retry: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cc *cmsgConn
			wrap := func(t testing.TB, conn *net.UDPConn, l *learn.Learner) net.PacketConn {
				cc = &cmsgConn{Conn: newConn(t, conn, l)}
				return cc
			}
			r := learntest.Check(t, wrap, tt.s)
			t.Logf("%+v; %d GSO batches, %d ECN-marked writes", r, cc.gso.Load(), cc.ecn.Load())
			if tt.s.Retry && r.RetryAnswers == 0 {
				t.Errorf("no answer to the Retry")
			}
			if runtime.GOOS == "linux" && (cc.gso.Load() == 0 || cc.ecn.Load() == 0) {
				t.Errorf("quic-go wrote %d GSO batches and %d ECN-marked datagrams through the Conn while echoing 1 MB",
					cc.gso.Load(), cc.ecn.Load())
			}
		})
	}
}

// serverSide is what a test's quic-go server needs: TLS configurations for
// it and its clients, a learner and its sink, and a socket on 127.0.0.1
// (at addr) wrapped in a packetconn.Conn that shows the learner every write.
type serverSide struct {
	serverTLS, clientTLS *tls.Config
	sink                 *learntest.Sink
	learner              *learn.Learner
	conn                 *packetconn.Conn
	addr                 netip.AddrPort
}

func newServerSide(t *testing.T) serverSide {
	t.Helper()
	var s serverSide
	s.serverTLS, s.clientTLS = learntest.TLSConfigs(t)
	s.sink, s.learner = learntest.NewLearner(t)
	conn := testutil.Listen(t, "udp4", "127.0.0.1:0")
	s.conn, s.addr = newConn(t, conn, s.learner), conn.LocalAddr().(*net.UDPAddr).AddrPort()
	return s
}

// TestStatelessRepliesTeachNoPeer replays a quic-go client's first flight
// from 127.0.0.2, a source that never answers, as a spoofer would. With a
// Retry, the server keeps no state and its Retry teaches nothing, neither
// its ID nor the spoofed address. Without one, the server answers with a
// connection, and the spoofed address becomes a peer, an answered one,
// with the credit of what the server sent it: the limit of learning peers
// from writes (see the package doc), which a test of the filter's bounds
// (TestBorrowedProof) takes further.
func TestStatelessRepliesTeachNoPeer(t *testing.T) {
	tests := []struct {
		name     string
		retry    bool
		wantPeer bool
	}{
		{"retry", true, false},
		{"no retry", false, true},
	}
	victim := netip.MustParseAddr("127.0.0.2")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServerSide(t)
			sink, l := s.sink, s.learner
			rl := &replyLog{Conn: s.conn, out: map[netip.Addr][][]byte{}}
			tr := &quic.Transport{Conn: rl, VerifySourceAddress: func(net.Addr) bool { return tt.retry }}
			learntest.Serve(t, tr, s.serverTLS, learntest.ServerConfig(quic.Version1))
			spoofFlight(t, s, victim)
			replies := rl.waitReply(t, victim)
			ids, _ := sink.Counts()
			if got := sink.KnowsPeer(victim); got != tt.wantPeer || tt.retry && (ids != 0 || sink.Credit(victim) != 0) {
				t.Errorf("after %d replies the spoofed source is a peer: %v, want %v (%d IDs taught, credit %d, %+v)",
					len(replies), got, tt.wantPeer, ids, sink.Credit(victim), l.Counts())
			}
			t.Logf("%d replies to the spoofed source; %d IDs taught, credit %d", len(replies), ids, sink.Credit(victim))
		})
	}
}

// spoofFlight sends a quic-go client's first flight to s from a socket on
// from, as a spoofer would: nothing reads the socket.
func spoofFlight(t *testing.T, s serverSide, from netip.Addr) {
	t.Helper()
	flight := learntest.FirstFlight(t, s.addr, s.clientTLS, quic.Version1)
	spoofer := testutil.Sender(t, netip.AddrPortFrom(from, 0))
	for _, b := range flight {
		if _, err := spoofer.WriteToUDPAddrPort(b, s.addr); err != nil {
			t.Fatal(err)
		}
	}
}

// replyLog is the server's Conn, which records the datagrams it writes to
// each destination.
type replyLog struct {
	*packetconn.Conn
	mu  sync.Mutex
	out map[netip.Addr][][]byte
}

func (c *replyLog) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	c.mu.Lock()
	c.out[addr.AddrPort().Addr().Unmap()] = append(c.out[addr.AddrPort().Addr().Unmap()], bytes.Clone(b))
	c.mu.Unlock()
	return c.Conn.WriteMsgUDP(b, oob, addr)
}

// waitReply waits until the server wrote to a, and returns what it wrote.
func (c *replyLog) waitReply(t *testing.T, a netip.Addr) [][]byte {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		out := c.out[a]
		c.mu.Unlock()
		if len(out) > 0 {
			time.Sleep(100 * time.Millisecond) // anything after it
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.out[a]
		}
	}
	t.Fatalf("the server wrote nothing to %v in 5 s", a)
	return nil
}

// retryAnswer is a client's packet conn that keeps, and does not send, its
// Initials to a server ID (the answers to a Retry, with its token).
type retryAnswer struct {
	net.PacketConn
	mu   sync.Mutex
	kept [][]byte
}

func (c *retryAnswer) WriteTo(b []byte, a net.Addr) (int, error) {
	if h := quicclass.Inspect(nil, 50000, b, len(b), true); h.Check == quicclass.CheckOpening && h.HasID {
		c.mu.Lock()
		c.kept = append(c.kept, bytes.Clone(b))
		c.mu.Unlock()
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, a)
}

// TestRefusalsTeachNothing: quic-go's refusals of a connection, made by a
// real quic-go server as it makes them, teach the learner neither an ID
// nor a peer, although their source connection ID is ServerIDLen bytes
// long (the client's chosen destination ID): INVALID_TOKEN, the answer to
// a Retry token sent from another address than the one it was made for
// (here a real client's Initial after a Retry, replayed from 127.0.0.2),
// and CONNECTION_REFUSED (a server that refuses every connection, to an
// Initial from 127.0.0.3 whose destination ID is 4 bytes).
func TestRefusalsTeachNothing(t *testing.T) {
	tests := []struct {
		name      string
		from      netip.Addr
		configure func(tr *quic.Transport, cfg *quic.Config)
		replay    func(t *testing.T, to netip.AddrPort, clientTLS *tls.Config) []byte
	}{
		{"invalid token", netip.MustParseAddr("127.0.0.2"), func(tr *quic.Transport, _ *quic.Config) {
			tr.VerifySourceAddress = func(net.Addr) bool { return true }
		}, func(t *testing.T, to netip.AddrPort, clientTLS *tls.Config) []byte {
			// A real client from 127.0.0.1 answers the Retry: its
			// Initial carries the token, made for 127.0.0.1; it is kept,
			// not sent, so that the server knows no connection by it.
			client := &retryAnswer{PacketConn: testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))}
			ctr := &quic.Transport{Conn: client}
			t.Cleanup(func() { ctr.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if _, err := ctr.Dial(ctx, net.UDPAddrFromAddrPort(to), clientTLS, &quic.Config{Versions: []quic.Version{quic.Version1}}); err == nil {
				t.Fatal("a client whose answer to the Retry was not sent connected")
			}
			client.mu.Lock()
			defer client.mu.Unlock()
			if len(client.kept) == 0 {
				t.Fatal("the client answered no Retry")
			}
			return client.kept[0]
		}},
		{"connection refused", netip.MustParseAddr("127.0.0.3"), func(_ *quic.Transport, cfg *quic.Config) {
			cfg.GetConfigForClient = func(*quic.ClientInfo) (*quic.Config, error) { return nil, errors.New("refused") }
		}, func(*testing.T, netip.AddrPort, *tls.Config) []byte {
			// quic-go takes a destination ID under 8 bytes from an
			// Initial with a token, whatever the token.
			return quicclasstest.LongPacket(quicclass.Version1, 0, []byte{0xab, 0xcd, 0xef, 0x01}, []byte{1, 2, 3, 4, 5, 6, 7, 8},
				[]byte("not a token"), quicclass.MinInitialDatagram)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServerSide(t)
			sink, l := s.sink, s.learner
			rl := &replyLog{Conn: s.conn, out: map[netip.Addr][][]byte{}}
			tr := &quic.Transport{Conn: rl}
			cfg := learntest.ServerConfig(quic.Version1)
			tt.configure(tr, cfg)
			learntest.Serve(t, tr, s.serverTLS, cfg)
			to := s.addr
			b := tt.replay(t, to, s.clientTLS)
			spoofer := testutil.Sender(t, netip.AddrPortFrom(tt.from, 0))
			if _, err := spoofer.WriteToUDPAddrPort(b, to); err != nil {
				t.Fatal(err)
			}
			replies := rl.waitReply(t, tt.from)
			for _, r := range replies {
				if len(r) < 7 || r[0]&0xb0 != 0x80 || len(r) < 7+int(r[5]) || int(r[6+r[5]]) != learn.ServerIDLen {
					t.Fatalf("the reply is not an Initial from a server-length ID: %x", r[:min(len(r), 32)])
				}
			}
			for _, b := range sink.IDs() {
				if b.To == tt.from {
					t.Errorf("the refusal taught ID %x bound to %v", b.ID, tt.from)
				}
			}
			if sink.KnowsPeer(tt.from) || l.Counts().OddIDs != 0 {
				t.Errorf("the refusal taught %v as a peer: %v; stats %+v", tt.from, sink.KnowsPeer(tt.from), l.Counts())
			}
			t.Logf("%d refusals of %d bytes to %v taught nothing", len(replies), len(replies[0]), tt.from)
		})
	}
}
