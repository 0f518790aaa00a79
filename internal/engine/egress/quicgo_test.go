//go:build linux

package egress_test

import (
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/egress"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/egress/egresstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// cmsgConn is a Conn that counts the control messages quic-go writes with:
// GSO batches (UDP_SEGMENT) and ECN marks (IP_TOS, IPV6_TCLASS).
type cmsgConn struct {
	*egress.Conn
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
// learner, before the client needs it, every ID the server reveals and the
// client's address, in both versions, with and without a Retry; and it
// writes GSO batches and ECN marks through the Conn.
func TestQUICGoTeaches(t *testing.T) {
	tests := []struct {
		name string
		s    egresstest.Setup
	}{
		{"v1", egresstest.Setup{Version: quic.Version1}},
		{"v2", egresstest.Setup{Version: quic.Version2}},
		{"v1 retry", egresstest.Setup{Version: quic.Version1, Retry: true}},
		{"v2 retry", egresstest.Setup{Version: quic.Version2, Retry: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cc *cmsgConn
			wrap := func(t testing.TB, conn *net.UDPConn, l *egress.Learner) net.PacketConn {
				c, err := egress.NewConn(conn, l)
				if err != nil {
					t.Fatal(err)
				}
				cc = &cmsgConn{Conn: c}
				return cc
			}
			r := egresstest.Check(t, wrap, tt.s)
			t.Logf("%+v; %d GSO batches, %d ECN-marked writes", r, cc.gso.Load(), cc.ecn.Load())
			if tt.s.Retry && r.ByID[egresstest.Initial] == 0 {
				t.Error("no answer to the Retry was verified by its ID")
			}
			if runtime.GOOS == "linux" && (cc.gso.Load() == 0 || cc.ecn.Load() == 0) {
				t.Errorf("quic-go wrote %d GSO batches and %d ECN-marked datagrams through the Conn while echoing 1 MB",
					cc.gso.Load(), cc.ecn.Load())
			}
		})
	}
}

// TestStatelessRepliesTeachNoPeer replays a quic-go client's first flight
// from 127.0.0.2, a source that never answers, as a spoofer would. With a
// Retry, the server keeps no state and its Retry teaches its ID but not the
// spoofed address. Without one, the server answers with a connection, and
// the spoofed address becomes a peer: the limit of learning peers from
// writes (see the package doc).
func TestStatelessRepliesTeachNoPeer(t *testing.T) {
	tests := []struct {
		name     string
		retry    bool
		wantPeer bool
	}{
		{"retry", true, false},
		{"no retry", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			serverTLS, clientTLS := egresstest.TLSConfigs(t)
			sink := egresstest.NewSink()
			l, err := egress.NewLearner(sink, egress.Options{})
			if err != nil {
				t.Fatal(err)
			}
			conn := testutil.Listen(t, "udp4", "127.0.0.1:0")
			c, err := egress.NewConn(conn, l)
			if err != nil {
				t.Fatal(err)
			}
			tr := &quic.Transport{Conn: c, VerifySourceAddress: func(net.Addr) bool { return tt.retry }}
			egresstest.Serve(t, tr, serverTLS, egresstest.ServerConfig(quic.Version1))
			to := conn.LocalAddr().(*net.UDPAddr).AddrPort()
			flight := egresstest.FirstFlight(t, to, clientTLS, quic.Version1)
			spoofer := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
			for _, b := range flight {
				if _, err := spoofer.WriteToUDPAddrPort(b, to); err != nil {
					t.Fatal(err)
				}
			}
			// Wait until the server has answered (it teaches an ID
			// with its first reply either way), then a little more.
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if ids, _ := sink.Counts(); ids > 0 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("the server did not answer %d datagrams of a ClientHello in 5 s", len(flight))
				}
			}
			time.Sleep(200 * time.Millisecond)
			ids, _ := sink.Counts()
			if got := sink.KnowsPeer(netip.MustParseAddr("127.0.0.2")); got != tt.wantPeer {
				t.Errorf("the spoofed source is a peer: %v, want %v (%d IDs taught, %+v)", got, tt.wantPeer, ids, l.Stats())
			}
		})
	}
}
