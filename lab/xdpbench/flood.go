//go:build linux

package xdpbench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// The floods: 1,200-byte Initials (each a connection quic-go would make,
// limited per source), or 48-byte short headers with unknown connection
// IDs (the unverified class's small total holds them).
const (
	FloodInitial = "initial"
	FloodSmall   = "small"
)

// FloodKinds lists the floods.
var FloodKinds = []string{FloodInitial, FloodSmall}

// batch is how many datagrams one sendmmsg sends.
const batch = 64

// Flood is a bounded flood of one kind to one address, from the
// addresses FloodSource(0) to FloodSource(Sources-1): from sockets bound to
// them (Send), or as Ethernet frames that claim them (SendFrames).
type Flood struct {
	// Kind is one of FloodKinds.
	Kind string
	// Rate is the datagrams per second of all the senders together; 0
	// sends as fast as they go.
	Rate int
	// Senders are the goroutines that send, Sources the addresses they
	// send from, in turn.
	Senders, Sources int
	// Count and For bound the flood.
	Count int
	For   time.Duration
}

// check refuses a flood to an address outside loopback and fd00::/8, and
// an unbounded one.
func (f Flood) check(dst netip.AddrPort) error {
	if !testutil.Allowed(dst.Addr()) {
		return fmt.Errorf("flood: destination %v is not in fd00::/8", dst)
	}
	if f.Count <= 0 || f.For <= 0 || f.Senders <= 0 || f.Sources < f.Senders {
		return errors.New("flood: needs a count, a duration, senders and a source for each")
	}
	return nil
}

// payloads are the datagrams a sender sends in turn.
func payloads(kind string, seed uint64) [][]byte {
	out := make([][]byte, batch)
	switch kind {
	case FloodSmall:
		rng := rand.New(rand.NewPCG(seed, seed+1))
		for i := range out {
			b := make([]byte, 48)
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			b[0] = 0x40 | b[0]&0x3f // a short header
			out[i] = b
		}
	default:
		g := testutil.NewInitials(seed)
		for i := range out {
			out[i] = append([]byte(nil), g.Next()...)
		}
	}
	return out
}

// Send sends the flood to dst from UDP sockets bound in ns to its sources
// (addresses of an interface there), and returns what it sent and for how
// long.
func (f Flood) Send(ns *testutil.NetNS, dst netip.AddrPort) (int, time.Duration, error) {
	if err := f.check(dst); err != nil {
		return 0, 0, err
	}
	conns := make([][]*ipv6.PacketConn, f.Senders)
	var raw []*net.UDPConn
	defer func() {
		for _, c := range raw {
			c.Close()
		}
	}()
	if err := ns.Enter(func() error {
		for i := range f.Sources {
			c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(FloodSource(i)), 0)))
			if err != nil {
				return fmt.Errorf("flood: binding %s: %w", FloodSource(i), err)
			}
			raw = append(raw, c)
			conns[i%f.Senders] = append(conns[i%f.Senders], ipv6.NewPacketConn(c))
		}
		return nil
	}); err != nil {
		return 0, 0, err
	}
	to := net.UDPAddrFromAddrPort(dst)
	start := time.Now()
	var mu sync.Mutex
	total := 0
	var firstErr error
	var wg sync.WaitGroup
	for s := range f.Senders {
		wg.Go(func() {
			n, err := f.send(conns[s], to, payloads(f.Kind, uint64(s)+1), start)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	return total, time.Since(start), firstErr
}

// send is one sender's loop: batches from its sockets in turn, paced at its
// share of the rate, until its share of the count is sent or the flood's
// time is up.
func (f Flood) send(conns []*ipv6.PacketConn, to *net.UDPAddr, data [][]byte, start time.Time) (int, error) {
	msgs := make([]ipv6.Message, batch)
	for i := range msgs {
		msgs[i] = ipv6.Message{Buffers: [][]byte{data[i]}, Addr: to}
	}
	count := f.Count / f.Senders
	rate := float64(f.Rate) / float64(f.Senders)
	sent := 0
	for turn := 0; sent < count; turn++ {
		elapsed := time.Since(start)
		if elapsed >= f.For {
			break
		}
		n := min(batch, count-sent)
		if rate > 0 {
			due := int(elapsed.Seconds()*rate) - sent
			if due <= 0 {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			n = min(n, due)
		}
		k, err := conns[turn%len(conns)].WriteBatch(msgs[:n], 0)
		switch {
		case errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN):
			// The veth backs up: the datagrams are not sent.
		case err != nil:
			return sent, fmt.Errorf("flood: %w", err)
		}
		sent += max(k, 0)
	}
	return sent, nil
}
