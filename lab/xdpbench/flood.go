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

// flood is a bounded flood of one kind from the sender's namespace.
type flood struct {
	kind string
	// rate is the datagrams per second of all the senders together; 0
	// sends as fast as they go.
	rate int
	// senders are the goroutines that send, sources the addresses they
	// send from, in turn.
	senders, sources int
	// count and dur bound the flood.
	count int
	dur   time.Duration
	// live sends XDP frames into the veth (runLive), not datagrams from
	// sockets.
	live bool
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

// run sends the flood to dst and returns what it sent and for how long.
func (f flood) run(ns *testutil.NetNS, dst netip.AddrPort) (int, time.Duration, error) {
	if !testutil.Allowed(dst.Addr()) {
		return 0, 0, fmt.Errorf("flood: destination %v is not in fd00::/8", dst)
	}
	if f.count <= 0 || f.dur <= 0 || f.senders <= 0 || f.sources < f.senders {
		return 0, 0, errors.New("flood: needs a count, a duration, senders and a source for each")
	}
	conns := make([][]*ipv6.PacketConn, f.senders)
	var raw []*net.UDPConn
	defer func() {
		for _, c := range raw {
			c.Close()
		}
	}()
	if err := ns.Enter(func() error {
		for i := range f.sources {
			c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(floodSource(i)), 0)))
			if err != nil {
				return fmt.Errorf("flood: binding %s: %w", floodSource(i), err)
			}
			raw = append(raw, c)
			conns[i%f.senders] = append(conns[i%f.senders], ipv6.NewPacketConn(c))
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
	for s := range f.senders {
		wg.Go(func() {
			n, err := f.send(conns[s], to, payloads(f.kind, uint64(s)+1), start)
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
func (f flood) send(conns []*ipv6.PacketConn, to *net.UDPAddr, data [][]byte, start time.Time) (int, error) {
	msgs := make([]ipv6.Message, batch)
	for i := range msgs {
		msgs[i] = ipv6.Message{Buffers: [][]byte{data[i]}, Addr: to}
	}
	count := f.count / f.senders
	rate := float64(f.rate) / float64(f.senders)
	sent := 0
	for turn := 0; sent < count; turn++ {
		elapsed := time.Since(start)
		if elapsed >= f.dur {
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
