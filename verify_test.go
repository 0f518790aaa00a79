//go:build linux

package rakelimit

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// TestMigratingClientKeepsConnection: with connection IDs verified (the
// default), a client that moves its connection to a new source port, or to
// a new address, keeps it: from the same address the server answers, its
// packets are verified by the credit the server's packets to the address
// grant, whatever their connection ID (quic-go's clients use IDs the server
// issued encrypted); from a new address, once the server moved there after
// validating it, by the credit its packets there grant.
func TestMigratingClientKeepsConnection(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(siteWithLimit, 1000))
	url := fmt.Sprintf("https://127.0.0.1:%d/", c.port)
	lim := limiterNamed(DefaultName)
	for _, tt := range []struct {
		name string
		// to is the address the client moves to; how the class and the
		// verifications one of which must have grown: by the address's
		// credit, or by its proof when the client's first flight happened
		// to carry the server's first ID back in a long header (quic-go's
		// Initial acknowledgement does when it leaves before the client has
		// read the server's 1-RTT packet).
		to    netip.Addr
		class quicclass.Class
		how   []quicclass.Verification
	}{
		{"new port, same address", legitSrc, quicclass.Established, []quicclass.Verification{quicclass.FromAnswered, quicclass.ShortByPeer}},
		{"new address", netip.MustParseAddr("127.0.0.8"), quicclass.Established, []quicclass.Verification{quicclass.FromAnswered}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			first := transport(t, legitSrc)
			conn, err := first.DialEarly(ctx, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port))),
				&tls.Config{InsecureSkipVerify: true, ServerName: "localhost", NextProtos: []string{http3.NextProtoH3}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.CloseWithError(0, "")
			cc := (&http3.Transport{}).NewClientConn(conn)
			get := func(when string) {
				t.Helper()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := cc.RoundTrip(req)
				if err != nil {
					t.Fatalf("request %s: %v", when, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(body) != "hello over HTTP/3.0" {
					t.Fatalf("request %s: %q", when, body)
				}
			}
			get("before moving")
			before := engineStats(t, lim)
			path, err := conn.AddPath(transport(t, tt.to))
			if err != nil {
				t.Fatal(err)
			}
			if err := path.Probe(ctx); err != nil {
				t.Fatalf("probing the new path: %v", err)
			}
			if err := path.Switch(); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				get(fmt.Sprintf("%d after moving", i+1))
			}
			after := engineStats(t, lim)
			v4 := decide.FamilyIndex(sketch.IPv4)
			if after.Passed[tt.class][v4] == before.Passed[tt.class][v4] {
				t.Errorf("no %v datagram passed after the move", tt.class)
			}
			if !slices.ContainsFunc(tt.how, func(h quicclass.Verification) bool { return after.Verified[v4][h] > before.Verified[v4][h] }) {
				t.Errorf("no datagram verified %v after the move", tt.how)
			}
		})
	}
}

// transport returns a QUIC transport on a socket bound to src, closed when
// the test ends.
func transport(t *testing.T, src netip.Addr) *quic.Transport {
	t.Helper()
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() { tr.Close(); udp.Close() })
	return tr
}

// engineStats reads a limiter's counters.
func engineStats(t *testing.T, l *engine.Limiter) decide.Stats {
	t.Helper()
	st, err := l.Engine().Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestNoStatelessReset pins an assumption the learner rests on: a short
// header the server writes belongs to a connection (its destination becomes
// a peer, answered, and earns credit). quic-go writes one to an unknown
// connection ID only as a stateless reset, and only with a
// StatelessResetKey, which Caddy does not set: a Caddy that set one would
// answer every spoofed short header with a packet, and make its forged
// source an answered peer, with a new peer's credit (the reset's own grant
// is one credit, which pays back the datagram that asked for it:
// learn.TestBorrowedProof). This sends short headers with unknown IDs to
// a running Caddy and expects no reply, and checks that the learner
// learned no peer from them.
func TestNoStatelessReset(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(siteWithLimit, 1000))
	src := netip.MustParseAddr("127.0.0.19")
	s, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(c.port)))
	before := limiterNamed(DefaultName).Learned()
	for i := range 20 {
		if _, err := s.WriteToUDP(quicclasstest.ShortPacket(decide.ServerID{0xee, 0xee, 0xee, byte(i)}, 1200), dst); err != nil {
			t.Fatal(err)
		}
	}
	s.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 2048)
	if n, _, err := s.ReadFromUDP(buf); err == nil {
		t.Fatalf("Caddy answered a short header to an unknown connection ID with %d bytes (%x): a stateless reset, "+
			"which makes a forged source an answered peer with a new peer's credit (decide.CreditFirst); the learner "+
			"must learn no peer from a reset's shape then", n, buf[:min(n, 16)])
	}
	if after := limiterNamed(DefaultName).Learned(); after.Peers != before.Peers {
		t.Fatalf("the learner taught %d peers from short headers to unknown IDs", after.Peers-before.Peers)
	}
}
