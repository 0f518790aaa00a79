package testutil

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
)

// InitialSize is the size of the datagrams Initials makes: the smallest a
// client's Initial may be.
const InitialSize = 1200

// The long header Initials writes (quicclasstest.LongPacket's): first byte,
// version, the destination connection ID's length and the ID (where Next
// writes a new one), the source connection ID's length and the ID, the
// token length (0), and the Length field, a 2-byte varint that covers the
// rest of the datagram, as in a real Initial.
const (
	initialDCIDAt    = 6
	initialCIDLen    = 8
	initialHeaderLen = initialDCIDAt + initialCIDLen + 1 + initialCIDLen + 1 + 2
	// initialPool is how many payloads Initials makes up front.
	initialPool = 64
)

// Initials makes flood datagrams that look like a client's first packet:
// 1200 bytes with a long header of type Initial, version 1, 8-byte
// connection IDs, no token and a Length that covers the rest, then random
// bytes, which a QUIC server must try to decrypt. Each has a destination connection ID of its own, so that a
// server would make a connection for each.
type Initials struct {
	rng  *rand.Rand
	pool [initialPool][InitialSize]byte
	buf  []byte
	n    int
}

// NewInitials returns a generator whose datagrams follow from seed.
func NewInitials(seed uint64) *Initials {
	g := &Initials{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), buf: make([]byte, InitialSize)}
	// Random payloads made once: filling 1,200 bytes per datagram would
	// slow a sender below its rate under the race detector.
	for p := range g.pool {
		b := g.pool[p][:]
		for i := range b {
			b[i] = byte(g.rng.Uint32())
		}
		// The header, with the random connection IDs and the random low
		// bits of the first byte (the packet number length and reserved
		// bits, which header protection hides).
		h := quicclasstest.LongPacket(quicclass.Version1, 0, b[initialDCIDAt:initialDCIDAt+initialCIDLen],
			b[initialDCIDAt+initialCIDLen+1:initialDCIDAt+2*initialCIDLen+1], nil, InitialSize)
		h[0] |= b[0] & 0x0f
		copy(b, h[:initialHeaderLen])
	}
	return g
}

// Next returns the next datagram, in a buffer the next call reuses.
func (g *Initials) Next() []byte {
	copy(g.buf, g.pool[g.n%initialPool][:])
	binary.LittleEndian.PutUint64(g.buf[initialDCIDAt:], g.rng.Uint64())
	g.n++
	return g.buf
}

// FloodInitials sends Initials from a socket bound to src (any port) to dst
// at rate datagrams per second for d, rate x d datagrams at the most, and
// returns how many it sent. dst must be a loopback or fd00::/8 address. An
// error fails t without stopping the goroutine, which may be another than
// the test's.
func FloodInitials(t testing.TB, src netip.Addr, dst netip.AddrPort, rate int, d time.Duration) int {
	t.Helper()
	conn, err := bind(netip.AddrPortFrom(src, 0))
	if err != nil {
		t.Errorf("flood of Initials: %v", err)
		return 0
	}
	defer conn.Close()
	g := NewInitials(uint64(rate) ^ uint64(d))
	count := int(float64(rate) * d.Seconds())
	sent, err := Flood{From: []*net.UDPConn{conn}, To: dst, Rate: rate, Count: count, For: d, Next: g.Next}.Send()
	if err != nil {
		t.Errorf("flood of Initials from %v: %v", src, err)
	}
	return sent
}
