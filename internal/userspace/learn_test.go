package userspace

import (
	"net"
	"net/netip"
	"testing"

	"github.com/quic-go/quic-go"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn/learntest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestWritesTeach: each way to write through a Conn teaches its learner,
// once one is set, and sends the datagram.
func TestWritesTeach(t *testing.T) {
	writes := []struct {
		name  string
		write func(c *packetconn.Conn, b []byte, to netip.AddrPort) error
	}{
		{"WriteMsgUDP", func(c *packetconn.Conn, b []byte, to netip.AddrPort) error {
			_, _, err := c.WriteMsgUDP(b, nil, net.UDPAddrFromAddrPort(to))
			return err
		}},
		{"WriteMsgUDPAddrPort", func(c *packetconn.Conn, b []byte, to netip.AddrPort) error {
			_, _, err := c.WriteMsgUDPAddrPort(b, nil, to)
			return err
		}},
		{"WriteTo", func(c *packetconn.Conn, b []byte, to netip.AddrPort) error {
			_, err := c.WriteTo(b, net.UDPAddrFromAddrPort(to))
			return err
		}},
		{"WriteToUDP", func(c *packetconn.Conn, b []byte, to netip.AddrPort) error {
			_, err := c.WriteToUDP(b, net.UDPAddrFromAddrPort(to))
			return err
		}},
		{"WriteToUDPAddrPort", func(c *packetconn.Conn, b []byte, to netip.AddrPort) error {
			_, err := c.WriteToUDPAddrPort(b, to)
			return err
		}},
	}
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			c := wrap(t, testutil.Listen(t, "udp", "[::]:0"), nil)
			rx := sender(t, "127.0.0.1:0")
			to := netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), testutil.PortOf(rx))
			sink, l := learntest.NewLearner(t)
			if err := w.write(c, quicclasstest.ShortHeader(100), to); err != nil {
				t.Fatal(err)
			}
			if _, peers := sink.Counts(); peers != 0 || c.Learner() != nil {
				t.Fatal("a Conn without a learner taught")
			}
			c.SetLearner(l)
			if err := w.write(c, quicclasstest.ShortHeader(100), to); err != nil {
				t.Fatal(err)
			}
			if !sink.KnowsPeer(netip.MustParseAddr("127.0.0.1")) {
				t.Fatal("the peer was not taught")
			}
		})
	}
}

// TestQUICGoTeachesThroughLimiter: with a Conn that both filters reads and
// teaches a learner from writes, a quic-go client's packets are all
// verifiable when they arrive, and none is dropped.
func TestQUICGoTeachesThroughLimiter(t *testing.T) {
	tests := []struct {
		name string
		s    learntest.Setup
	}{
		{"v1", learntest.Setup{Version: quic.Version1}},
		{"v2 retry", learntest.Setup{Version: quic.Version2, Retry: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lim *Decider
			wrapLearning := func(t testing.TB, conn *net.UDPConn, l *learn.Learner) net.PacketConn {
				lim = newTestDecider(t, testutil.QUICLimits(1000, 100_000), nil, -1)
				c := wrap(t, conn, lim)
				c.SetLearner(l)
				return c
			}
			r := learntest.Check(t, wrapLearning, tt.s)
			st, _ := lim.Stats()
			var dropped uint64
			for c := range sketch.NumClasses {
				for f := range st.Dropped[c] {
					for _, d := range st.Dropped[c][f] {
						dropped += d
					}
				}
			}
			v4 := decide.FamilyIndex(sketch.IPv4)
			if dropped != 0 || st.Passed[quicclass.Established][v4] < 500 {
				t.Errorf("the limiter dropped %d datagrams and passed %d established ones", dropped, st.Passed[quicclass.Established][v4])
			}
			t.Logf("%+v", r)
		})
	}
}
