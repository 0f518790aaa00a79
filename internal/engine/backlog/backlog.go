// Package backlog sets a class's total for the sockets (the last level of
// the opening class, and of the established class: LawFor) from what
// quic-go can take, measured on the sockets themselves: how full their
// receive queues are, and how many datagrams the kernel dropped because a
// queue was full; and, in the userspace mode, the share of long headers
// the kernel pre-filter sheds while the queue overflows (Shedder). It reads
// the sockets' counters from /proc/net (procnet.go) and their queues
// (socket_linux.go), in every mode: the XDP program's refusals never reach
// a socket, so they count in neither.
//
// A fixed total is a guess about one machine: set too low, it refuses new
// connections quic-go could have served (under a spoofed flood every network
// looks alike, and plain Caddy may well keep up); set too high, it lets
// quic-go's queue overflow, which drops packets of every kind at random. The
// controller drops only what quic-go cannot take: while the queue stays
// short the total rises, multiplicatively, until it lifts; when the queue
// passes a high-water mark or the kernel drops datagrams for want of room,
// the total falls below the rate of openings that passed in the last period,
// so the queue drains, and holds while it does. Under a flood larger than quic-go's capacity the total
// settles around it, and the fair total (package sketch) shares it among
// networks.
//
// Controller is the control law, deterministic and free of sockets, run by
// package engine on real sockets and by package sim in virtual time.
package backlog

import (
	"math"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Sample is one reading of a limiter's sockets and filter. Counts are
// cumulative; the controller works on the differences between samples.
type Sample struct {
	// At is when the sample was taken, in nanoseconds on a monotonic
	// clock.
	At int64
	// Queued and Capacity are the bytes waiting in the receive queues and
	// the queues' size (SO_MEMINFO: SK_MEMINFO_RMEM_ALLOC and
	// SK_MEMINFO_RCVBUF).
	Queued, Capacity uint64
	// Overflows counts datagrams the kernel dropped for want of room in
	// the queues (the socket's drops less the filter's own).
	Overflows uint64
	// Passed counts the datagrams of the controller's class the filter
	// let through (the connection-opening ones for the opening total).
	Passed uint64
	// Received counts the datagrams the userspace limiter received, and
	// Long those of them with a long header of a known version (the
	// opening class), for its Shedder; the kernel filter leaves them 0.
	Received, Long uint64
}

// Law are the constants of the control loop.
type Law struct {
	// Min and Max bound the total, in packets per second; past Max it is
	// lifted.
	Min, Max uint32
	// High and Low are fractions of the queue's capacity: at High or
	// above with the queue growing, or after an overflow, the total falls;
	// at Low or below with no datagram dropped it rises; otherwise it
	// holds.
	High, Low float64
	// Decrease is the fraction of the openings that passed during the
	// last period the total falls to; Increase multiplies the total each
	// period the queue stays short.
	Decrease, Increase float64
	// Overflows is how many dropped datagrams in one period count as an
	// overflow: the socket's drops and the filter's are read a moment
	// apart.
	Overflows uint64
}

// DefaultLaw are the constants the engine uses, with a period of Period.
// The queue is kept short (under a quarter of its size, about 25 ms of
// quic-go's work with its 7 MiB buffer), because a packet waits behind
// everything queued and a handshake that waits long times out. From the
// 20,000 the total starts at, a quiet queue lifts it in about 5 s (102
// periods at +6.25%); a flood 5 times quic-go's capacity is brought to it in
// about 6 periods (0.3 s).
var DefaultLaw = Law{Min: 1000, Max: 10_000_000, High: 0.25, Low: 0.0625, Decrease: 0.75, Increase: 1.0625, Overflows: 8}

// LawFor is DefaultLaw for the total of class of a limiter configured with
// c: the total never falls below the limit of one of the class's streams
// (one client's transfer passes whatever the load), and past what the
// counters hold for c's window (sketch.MaxBurst) it is lifted.
func LawFor(c sketch.Config, class int) Law {
	law := DefaultLaw
	law.Min = max(law.Min, c.Class(class).Limit)
	law.Max = uint32(min(float64(law.Max), float64(sketch.MaxBurst)/c.Window.Seconds()))
	return law
}

// Period is how often the engine samples the sockets: in 50 ms a full-rate
// flood fills a default receive queue (quic-go asks for 7 MiB) only partly.
const Period = 50_000_000

// Unlimited is the cap of a lifted total.
const Unlimited = 0

// Controller is the state of the control loop.
type Controller struct {
	law  Law
	cap  uint32
	prev Sample
	have bool
	// why records what the last step saw, for logs and the admin view.
	why Reading
}

// Reading is what a step saw.
type Reading struct {
	// Fill is the queue's fill, 0 to 1.
	Fill float64
	// Overflows are the datagrams dropped for want of room in the period.
	Overflows uint64
	// PassedPPS is the rate of the class's datagrams the filter let
	// through.
	PassedPPS float64
}

// NewController returns a controller whose total starts at start packets
// per second (Unlimited: lifted).
func NewController(law Law, start uint32) *Controller {
	return &Controller{law: law, cap: start}
}

// Cap is the total in force, in packets per second, or Unlimited.
func (c *Controller) Cap() uint32 { return c.cap }

// Last is what the last step saw.
func (c *Controller) Last() Reading { return c.why }

// Step takes a sample and returns the total and whether it changed.
func (c *Controller) Step(s Sample) (uint32, bool) {
	if !c.have || s.At <= c.prev.At {
		c.prev, c.have = s, true
		return c.cap, false
	}
	dt := float64(s.At-c.prev.At) / 1e9
	r := Reading{PassedPPS: float64(sub(s.Passed, c.prev.Passed)) / dt, Overflows: sub(s.Overflows, c.prev.Overflows)}
	if s.Capacity > 0 {
		r.Fill = float64(s.Queued) / float64(s.Capacity)
	}
	growing := s.Queued > c.prev.Queued
	c.prev, c.why = s, r
	prev := c.cap
	switch {
	// A queue over the high-water mark that is draining already needs no
	// lower total: falling on it again would take the total to the floor
	// while the backlog drains.
	case r.Overflows >= max(c.law.Overflows, 1) || (r.Fill >= c.law.High && growing):
		target := uint32(min(math.Max(float64(c.law.Min), r.PassedPPS*c.law.Decrease), float64(c.law.Max)))
		if c.cap == Unlimited || target < c.cap {
			c.cap = target
		}
	case r.Fill <= c.law.Low && r.Overflows == 0 && c.cap != Unlimited:
		next := float64(c.cap)*c.law.Increase + 1
		if next >= float64(c.law.Max) {
			c.cap = Unlimited
		} else {
			c.cap = uint32(next)
		}
	}
	return c.cap, c.cap != prev
}

// sub is a-b for counters, 0 when a counter went back (a socket closed).
func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
