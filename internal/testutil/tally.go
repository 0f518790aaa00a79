package testutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
)

// Tally counts the datagrams a test receives, per source (address and port)
// and per second. A datagram with a send-time stamp (Flood.Stamp) counts in
// the second of its flood's epoch it was sent in; one too short for a stamp
// in the second of the last stamped one from its source (a socket's
// datagrams arrive in the order sent); any other in the second since the
// Tally was made that it was counted in. It is safe for concurrent use.
type Tally struct {
	start time.Time
	mu    sync.Mutex
	// perSecond holds, per source, the datagrams received in each second.
	perSecond map[netip.AddrPort][]int
	// stamped holds, per source, the second of its last stamped datagram.
	stamped map[netip.AddrPort]int
	total   int
}

// NewTally returns an empty Tally whose first second starts now.
func NewTally() *Tally {
	return &Tally{start: time.Now(), perSecond: map[netip.AddrPort][]int{}, stamped: map[netip.AddrPort]int{}}
}

// Add counts a datagram from from, now; an IPv4-mapped address counts as
// the IPv4 address.
func (t *Tally) Add(from netip.AddrPort) { t.AddDatagram(from, nil) }

// AddDatagram counts a datagram from from with payload b: in the second
// its stamp gives, if it carries one (see Tally).
func (t *Tally) AddDatagram(from netip.AddrPort, b []byte) {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	since, stamped := ReadStamp(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	sec, ok := int(since/time.Second), stamped
	if stamped {
		t.stamped[from] = sec
	} else {
		sec, ok = t.stamped[from]
	}
	if !ok {
		sec = int(time.Since(t.start) / time.Second)
	}
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
	// drains counts the calls of Drain; idle is the value of drains the
	// reader read before a read that found nothing to read for
	// idleAfter: every datagram queued before then has been counted.
	drains, idle atomic.Int64
}

// idleAfter is how long a read waits before the reader reports the socket
// idle to Drain.
const idleAfter = 10 * time.Millisecond

// Receive starts reading conn into a new Tally; stamped datagrams count in
// the second they were sent (see Tally).
func Receive(conn *net.UDPConn) *Receiver {
	r := &Receiver{Tally: NewTally(), conn: conn, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		buf := make([]byte, 2048)
		for {
			drains := r.drains.Load()
			if err := conn.SetReadDeadline(time.Now().Add(idleAfter)); err != nil {
				return
			}
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				r.idle.Store(drains)
				continue
			}
			if err != nil {
				return
			}
			r.AddDatagram(from, buf[:n])
		}
	}()
	return r
}

// inFlight is how long a datagram sent on loopback may take to reach the
// socket's queue: the receive path runs in the sender's sendto, or in
// ksoftirqd when a loaded CPU defers it.
const inFlight = 100 * time.Millisecond

// drainFor bounds how long Drain waits for a reader that is behind: far
// longer than a reader descheduled on a loaded machine ever stays behind.
const drainFor = 30 * time.Second

// Drain waits for datagrams in flight, then until the reader has counted
// every datagram queued before that: until one of its reads, begun after
// the wait, found the socket empty. However far behind a loaded machine
// put the reader, the counts then hold everything sent before Drain was
// called. It fails t when the reader is still busy after drainFor.
func (r *Receiver) Drain(t testing.TB) {
	t.Helper()
	time.Sleep(inFlight)
	want := r.drains.Add(1)
	for end := time.Now().Add(drainFor); r.idle.Load() < want; time.Sleep(idleAfter) {
		select {
		case <-r.done:
			return // the socket was closed: nothing more to count
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("draining the receiver: still reading after %v", drainFor)
			return
		}
	}
}

// Stop drains the socket (Drain), closes it and waits for the reader to
// end; the counts are final then.
func (r *Receiver) Stop(t testing.TB) {
	t.Helper()
	r.Drain(t)
	r.conn.Close()
	<-r.done
}

// WaitEmpty waits for datagrams in flight, then until conn's reader (one
// the test runs itself) has taken every datagram off its receive queue:
// the kernel's own count of queued bytes (SO_MEMINFO) is 0. It fails t
// when the queue is not empty after drainFor.
func WaitEmpty(t testing.TB, conn *net.UDPConn) {
	t.Helper()
	time.Sleep(inFlight)
	for end := time.Now().Add(drainFor); ; time.Sleep(idleAfter) {
		queued, _, _, err := backlog.ReadSockets([]*net.UDPConn{conn})
		if err != nil {
			t.Fatalf("waiting for the receive queue to empty: %v", err)
			return
		}
		if queued == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("waiting for the receive queue to empty: %d bytes still queued after %v", queued, drainFor)
			return
		}
	}
}

// CheckHeld fails the test unless the flood was held at limit in every
// full second after the first (seconds in all), as HeldPerSecond checks.
func CheckHeld(t testing.TB, what string, perSecond, sent []int, seconds int, limit float64) {
	t.Helper()
	if err := HeldPerSecond(perSecond, sent, seconds, limit); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// HeldPerSecond checks that a flood was held at limit in every full second
// after the first (seconds in all): perSecond holds what was received in
// each second, sent what the flood sent in each (Sent.PerSecond; nil for a
// sender known to keep its pace). No second may pass more than the
// limiter's 10% over limit. The lower bound, 90% of the limit (or of what
// was sent, when less), holds only in the seconds in which the sender kept
// its pace (within 10% of its median second): a sender that a loaded
// machine stalled sends its second's datagrams in a burst, over part of
// the second, and a limiter passes limit per second of the burst, not per
// second of the clock. The counts decay over a stall, so a burst that
// catches up in the next second meets the room the stall opened: a second
// may pass, over the 10%, the share of the limit the previous second's
// shortfall left unused (a second that sent 60% of the pace: 40% more).
func HeldPerSecond(perSecond, sent []int, seconds int, limit float64) error {
	var bad []string
	pace := Median(sent)
	for s := 1; s < seconds; s++ {
		got, offered := 0.0, limit
		if s < len(perSecond) {
			got = float64(perSecond[s])
		}
		kept := true
		if sent != nil {
			offered = 0
			if s < len(sent) {
				offered = float64(sent[s])
			}
			kept = offered >= 0.9*pace && offered <= 1.1*pace
		}
		low, high := 0.9*min(limit, offered), 1.1*limit
		if !kept {
			low = 0
		}
		if sent != nil && pace > 0 {
			before := 0.0
			if s-1 < len(sent) {
				before = float64(sent[s-1])
			}
			high += limit * max(0, 1-before/pace)
		}
		if got < low || got > high {
			bad = append(bad, fmt.Sprintf("second %d received %v, want %.0f to %.0f", s, got, low, high))
		}
	}
	if bad != nil {
		return fmt.Errorf("%s, a limit of %v +- 10%% (received per second %v, sent %v)",
			strings.Join(bad, "; "), limit, perSecond, sent)
	}
	return nil
}

// Median is the median of v (the lower one of an even count), 0 for none.
func Median[T int | float64](v []T) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return float64(s[(len(s)-1)/2])
}

// Held reports whether a flood of sent datagrams at a rate well over limit
// per second was held to limit by a limiter that dropped dropped of them:
// all but a burst and a second at the limit, with as much again for margin,
// were dropped.
func Held(sent int, dropped uint64, limit int) bool { return dropped+uint64(4*limit) >= uint64(sent) }
