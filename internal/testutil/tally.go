package testutil

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// Tally counts the datagrams a test receives, per source (address and port)
// and per second since it was made. It is safe for concurrent use.
type Tally struct {
	start time.Time
	mu    sync.Mutex
	// perSecond holds, per source, the datagrams received in each second.
	perSecond map[netip.AddrPort][]int
	total     int
}

// NewTally returns an empty Tally whose first second starts now.
func NewTally() *Tally {
	return &Tally{start: time.Now(), perSecond: map[netip.AddrPort][]int{}}
}

// Add counts a datagram from from, now; an IPv4-mapped address counts as
// the IPv4 address.
func (t *Tally) Add(from netip.AddrPort) {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	sec := int(time.Since(t.start) / time.Second)
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.perSecond[from]) <= sec {
		t.perSecond[from] = append(t.perSecond[from], 0)
	}
	t.perSecond[from][sec]++
	t.total++
}

// Total is the number of datagrams counted.
func (t *Tally) Total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// PerSecond returns the datagrams from src in each second so far.
func (t *Tally) PerSecond(src netip.AddrPort) []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.perSecond[src])
}

// PerSecondFrom returns the datagrams from addr, on any port, in each
// second so far.
func (t *Tally) PerSecondFrom(addr netip.Addr) []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for src, counts := range t.perSecond {
		if src.Addr() != addr.Unmap() {
			continue
		}
		for len(out) < len(counts) {
			out = append(out, 0)
		}
		for s, n := range counts {
			out[s] += n
		}
	}
	return out
}

// Received is the number of datagrams from src.
func (t *Tally) Received(src netip.AddrPort) int { return sum(t.PerSecond(src)) }

// ReceivedFrom is the number of datagrams from addr, on any port.
func (t *Tally) ReceivedFrom(addr netip.Addr) int { return sum(t.PerSecondFrom(addr)) }

func sum(counts []int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// Receiver reads a socket into a Tally until Stop.
type Receiver struct {
	*Tally
	conn *net.UDPConn
	done chan struct{}
}

// Receive starts reading conn into a new Tally.
func Receive(conn *net.UDPConn) *Receiver {
	r := &Receiver{Tally: NewTally(), conn: conn, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		buf := make([]byte, 2048)
		for {
			_, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			r.Add(from)
		}
	}()
	return r
}

// Stop waits 100 ms for datagrams in flight, closes the socket and waits
// for the reader to end; the counts are final then.
func (r *Receiver) Stop() {
	time.Sleep(100 * time.Millisecond)
	r.conn.Close()
	<-r.done
}

// CheckHeld fails the test unless every full second of perSecond after the
// first (seconds in all) lies within limit +- 10%.
func CheckHeld(t testing.TB, what string, perSecond []int, seconds int, limit float64) {
	t.Helper()
	if len(perSecond) < seconds {
		t.Fatalf("%s: received in %d seconds only: %v", what, len(perSecond), perSecond)
		return
	}
	for s := 1; s < seconds; s++ {
		if got := float64(perSecond[s]); got < 0.9*limit || got > 1.1*limit {
			t.Errorf("%s: second %d received %v, want %v +- 10%% (all seconds: %v)", what, s, got, limit, perSecond)
		}
	}
}

// Held reports whether a flood of sent datagrams at a rate well over limit
// per second was held to limit by a limiter that dropped dropped of them:
// all but a burst and a second at the limit, with as much again for margin,
// were dropped.
func Held(sent int, dropped uint64, limit int) bool { return dropped+uint64(4*limit) >= uint64(sent) }
