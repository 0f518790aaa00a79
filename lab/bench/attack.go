//go:build linux

package bench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/net/ipv4"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// The attacks on verification. The filter verifies a client against what
// the server sent: the connection IDs it chose (ServerIDLen random bytes,
// the source connection ID of its Initial, Handshake and Retry packets) and
// the addresses it answers. Two ways to ride on that:
//
//   - Borrow an ID: open one real connection (dialAttacker), read the ID
//     the server chose in plain text, and send datagrams carrying it from
//     elsewhere (PacketIDShort, PacketIDLong).
//   - Get answered: send real ClientHellos (clientFlights) from spoofed
//     addresses, which quic-go answers with its first flight, then flood
//     from those addresses (FloodSpec.Warmup, PacketReuse).

// Rates of the attack scenarios.
const (
	// attackerRate is the requests per second on the attacker's own
	// connection during its flood: one every 200 ms.
	attackerRate = 5
	// returningRate is the returning client's new connections per second.
	returningRate = 5
	// warmupRate is the first flights per second of a warm-up: under the
	// 1000 handshakes a second above which Caddy asks quic-go for a Retry
	// (which would teach no spoofed address), and under the default
	// limit of one network (1000 a second).
	warmupRate = 900
	// warmupTick is how often a warm-up sends the flights due.
	warmupTick = 5 * time.Millisecond
)

// serverIDOf returns the source connection ID of the long-header packet a
// datagram starts with when the server chose it for a connection: that of
// an Initial or Handshake packet of QUIC v1 or v2, ServerIDLen bytes long.
// Version Negotiation and Retry packets, and IDs of another length, give
// nothing.
func serverIDOf(b []byte) ([quicclass.ServerIDLen]byte, bool) {
	var id [quicclass.ServerIDLen]byte
	if len(b) < 7 || b[0]&0x80 == 0 {
		return id, false
	}
	typ := b[0] >> 4 & 3
	switch binary.BigEndian.Uint32(b[1:5]) {
	case quicclass.Version1:
	case quicclass.Version2:
		typ = (typ + 3) & 3 // v2 rotates the types by one (RFC 9369)
	default:
		return id, false
	}
	if typ != longTypeInitial && typ != longTypeHandshake {
		return id, false
	}
	dcil := int(b[5])
	if len(b) < 7+dcil || int(b[6+dcil]) != quicclass.ServerIDLen || len(b) < 7+dcil+quicclass.ServerIDLen {
		return id, false
	}
	copy(id[:], b[7+dcil:])
	return id, true
}

// idCapture is the packet conn of the attacker's connection: it reads and
// writes a UDP socket and keeps the server ID of the first datagram received
// that carries one. It offers neither ReadMsgUDP nor WriteMsgUDP, so that
// quic-go reads through ReadFrom (its basic path, one datagram a read).
type idCapture struct {
	conn *net.UDPConn
	mu   sync.Mutex
	id   [quicclass.ServerIDLen]byte
	ok   bool
}

func (c *idCapture) ReadFrom(b []byte) (int, net.Addr, error) {
	n, addr, err := c.conn.ReadFrom(b)
	if err == nil {
		if id, ok := serverIDOf(b[:n]); ok {
			c.mu.Lock()
			if !c.ok {
				c.id, c.ok = id, true
			}
			c.mu.Unlock()
		}
	}
	return n, addr, err
}

// serverID returns the server ID captured, if any.
func (c *idCapture) serverID() ([quicclass.ServerIDLen]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id, c.ok
}

func (c *idCapture) WriteTo(b []byte, addr net.Addr) (int, error) { return c.conn.WriteTo(b, addr) }
func (c *idCapture) Close() error                                 { return c.conn.Close() }
func (c *idCapture) LocalAddr() net.Addr                          { return c.conn.LocalAddr() }
func (c *idCapture) SetDeadline(t time.Time) error                { return c.conn.SetDeadline(t) }
func (c *idCapture) SetReadDeadline(t time.Time) error            { return c.conn.SetReadDeadline(t) }
func (c *idCapture) SetWriteDeadline(t time.Time) error           { return c.conn.SetWriteDeadline(t) }

// SetReadBuffer, SetWriteBuffer and SyscallConn let quic-go size the
// socket's buffers as it does for a *net.UDPConn.
func (c *idCapture) SetReadBuffer(n int) error             { return c.conn.SetReadBuffer(n) }
func (c *idCapture) SetWriteBuffer(n int) error            { return c.conn.SetWriteBuffer(n) }
func (c *idCapture) SyscallConn() (syscall.RawConn, error) { return c.conn.SyscallConn() }

// dialAttacker opens the attacker's own HTTP/3 connection from a new socket
// on src to dst and returns it with the server ID the server chose for it:
// the source connection ID of the server's first long-header packet, as
// anyone on the path reads it.
func dialAttacker(ctx context.Context, src netip.Addr, dst netip.AddrPort) (*h3Conn, [quicclass.ServerIDLen]byte, error) {
	var none [quicclass.ServerIDLen]byte
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		return nil, none, fmt.Errorf("binding %v: %w", src, err)
	}
	capture := &idCapture{conn: udp}
	h, err := dialH3On(ctx, udp, capture, dst)
	if err != nil {
		return nil, none, err
	}
	id, ok := capture.serverID()
	if !ok {
		h.close()
		return nil, none, errors.New("the handshake completed without a server ID in the server's long headers")
	}
	return h, id, nil
}

// flightCapture is a packet conn that sends nothing and receives nothing:
// it keeps the first datagram written for each destination connection ID
// when it is an Initial of at least 1200 bytes, a client's first flight.
type flightCapture struct {
	mu      sync.Mutex
	seen    map[string]bool
	flights [][]byte
	added   chan struct{}
	done    chan struct{}
	once    sync.Once
}

func newFlightCapture() *flightCapture {
	return &flightCapture{seen: map[string]bool{}, added: make(chan struct{}, 1), done: make(chan struct{})}
}

func (c *flightCapture) WriteTo(b []byte, _ net.Addr) (int, error) {
	h := quicclass.Inspect(nil, 0, b, len(b), true)
	if h.Check != quicclass.CheckOpening || h.Reason != quicclass.NotInvalid || len(b) < quicclass.MinInitialDatagram {
		return len(b), nil
	}
	dcid := string(b[6 : 6+int(b[5])])
	c.mu.Lock()
	if !c.seen[dcid] {
		c.seen[dcid] = true
		c.flights = append(c.flights, append([]byte(nil), b...))
		select {
		case c.added <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()
	return len(b), nil
}

// ReadFrom waits until the conn is closed or given a read deadline (how
// quic-go's Transport stops its reader).
func (c *flightCapture) ReadFrom([]byte) (int, net.Addr, error) {
	<-c.done
	return 0, nil, net.ErrClosed
}

func (c *flightCapture) Close() error {
	c.once.Do(func() { close(c.done) })
	return nil
}

func (c *flightCapture) SetReadDeadline(t time.Time) error {
	if !t.IsZero() {
		c.Close()
	}
	return nil
}

func (c *flightCapture) LocalAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
}
func (c *flightCapture) SetDeadline(t time.Time) error    { return c.SetReadDeadline(t) }
func (c *flightCapture) SetWriteDeadline(time.Time) error { return nil }
func (c *flightCapture) SetReadBuffer(int) error          { return nil }
func (c *flightCapture) SetWriteBuffer(int) error         { return nil }

func (c *flightCapture) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.flights)
}

// clientFlights returns n first flights of quic-go clients to Caddy's site
// (SNI localhost, ALPN h3), each a ClientHello in one Initial datagram of at
// least 1200 bytes with its own destination connection ID: what a spoofer
// sends to be answered. Nothing goes on the network: each dial writes into a
// flightCapture and is cancelled once its first datagram is kept. The key
// share is X25519's alone, so that the ClientHello fits one datagram.
func clientFlights(ctx context.Context, n int) ([][]byte, error) {
	c := newFlightCapture()
	tr := &quic.Transport{Conn: c}
	defer tr.Close()
	defer c.Close()
	conf := clientTLS()
	conf.CurvePreferences = []tls.CurveID{tls.X25519}
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} // never reached
	for try := 0; c.count() < n; try++ {
		if try >= 2*n+10 {
			return nil, fmt.Errorf("client flights: %d of %d after %d dials", c.count(), n, try)
		}
		select { // a signal left by the previous dial's last writes
		case <-c.added:
		default:
		}
		dctx, cancel := context.WithCancel(ctx)
		dialed := make(chan struct{})
		go func() {
			defer close(dialed)
			if conn, err := tr.Dial(dctx, to, conf, &quic.Config{}); err == nil {
				conn.CloseWithError(0, "")
			}
		}()
		select {
		case <-c.added:
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
		cancel()
		<-dialed
		if ctx.Err() != nil {
			return nil, fmt.Errorf("client flights: %w", ctx.Err())
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flights[:n], nil
}

// setHosts returns n addresses of p spread over its /24s, the i-th host
// 1 + i/k of the (i mod k)-th /24, k being p's number of /24s: a fixed set of
// spoofed sources. p must be IPv4, a /24 or wider, and n at most 254 per
// /24.
func setHosts(p netip.Prefix, n int) ([]netip.Addr, error) {
	if !p.Addr().Is4() || p.Bits() > 24 || p.Bits() < 8 {
		return nil, fmt.Errorf("spoofed set in %v: want an IPv4 prefix from /8 to /24", p)
	}
	k := 1 << (24 - p.Bits())
	if n < 1 || n > k*254 {
		return nil, fmt.Errorf("spoofed set of %d addresses in %v: want 1 to %d", n, p, k*254)
	}
	base := binary.BigEndian.Uint32(p.Masked().Addr().AsSlice())
	out := make([]netip.Addr, n)
	for i := range out {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], base|uint32(i%k)<<8|uint32(1+i/k))
		out[i] = netip.AddrFrom4(a)
	}
	return out, nil
}

// warmupFlights is the number of first flights a flood's warm-up sends:
// WarmupFlights (at least one) from each address of its spoofed set.
func (s *FloodSpec) warmupFlights() int { return s.SpoofedSet * max(1, s.WarmupFlights) }

// prepareWarmup writes the whole IPv4 datagrams of the flood's warm-up: the
// i-th flight from host i modulo the size of its spoofed set (each host's
// first flight first), from a random port.
func (f *flood) prepareWarmup(flights [][]byte, seed uint64) error {
	n := f.spec.warmupFlights()
	if len(f.hosts) == 0 || len(flights) < n {
		return fmt.Errorf("warm-up: %d flights for %d spoofed addresses, %d each", len(flights), len(f.hosts), max(1, f.spec.WarmupFlights))
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	dst := f.dst.Addr().As4()
	f.warmup = make([][]byte, n)
	for i := range n {
		h, p := f.hosts[i%len(f.hosts)], flights[i]
		buf := make([]byte, spoofHeaders+len(p))
		copy(buf[spoofHeaders:], p)
		sport := uint16(spoofPortMin + rng.IntN(spoofPortCount))
		f.warmup[i] = writeHeaders(buf, binary.BigEndian.Uint32(h.AsSlice()), dst, sport, f.dst.Port(),
			uint16(rng.Uint32()), len(p), sum16(0, p))
	}
	return nil
}

// warmUp sends the warm-up's datagrams through the raw socket (the first
// writer) at warmupRate, until all are sent, limit is reached, count
// datagrams are sent in all or ctx is done, and returns how many went out:
// the first that many hosts (at most all) are warmed.
func (f *flood) warmUp(ctx context.Context, msgs []ipv4.Message, limit time.Time, count uint64, res *FloodResult) int {
	start := time.Now()
	sent := 0
	for sent < len(f.warmup) && res.Sent < count && ctx.Err() == nil {
		now := time.Now()
		if !now.Before(limit) {
			break
		}
		due := min(len(f.warmup), 1+int(now.Sub(start).Seconds()*warmupRate))
		for sent < due && res.Sent < count {
			n := min(due-sent, floodBatch, int(count-res.Sent))
			for j := range n {
				msgs[j].Buffers[0] = f.warmup[sent+j]
			}
			k, err := f.writers[0].WriteBatch(msgs[:n], 0)
			k = max(k, 0)
			if k == 0 && err == nil {
				err = errors.New("the raw socket sent nothing")
			}
			for j := range k {
				res.Bytes += uint64(len(f.warmup[sent+j]) - spoofHeaders)
			}
			sent += k
			res.Sent += uint64(k)
			res.WarmupSent += uint64(k)
			if err != nil {
				res.SendErrors++
				if res.FirstError == "" {
					res.FirstError = err.Error()
				}
				break
			}
		}
		t := time.NewTimer(warmupTick)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return sent
}
