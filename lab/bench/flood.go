//go:build linux

package bench

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// FloodResult is what one flood sent and what came back to its sockets.
type FloodResult struct {
	Kind    PacketKind `json:"kind"`
	Sockets int        `json:"sockets"`
	// Addresses counts the flood's source addresses: those its sockets
	// are bound to, or the distinct ones a spoofed flood sent from.
	Addresses int `json:"addresses"`
	// Spoofed is the source range of a spoofed flood, empty otherwise.
	Spoofed string `json:"spoofed,omitempty"`
	// Sent and Bytes count datagrams the kernel accepted from the senders.
	Sent  uint64 `json:"sent"`
	Bytes uint64 `json:"bytes"`
	// Seconds is how long the flood ran, pauses of a pulse included.
	Seconds float64 `json:"seconds"`
	// OfferedPPS is Sent / Seconds; PeakPPS is Sent over the time spent
	// sending (equal for a continuous flood).
	OfferedPPS float64 `json:"offered_pps"`
	PeakPPS    float64 `json:"peak_pps"`
	// CountBound is set when the flood stopped at its count, not its time.
	CountBound bool   `json:"count_bound"`
	SendErrors uint64 `json:"send_errors"`
	FirstError string `json:"first_error,omitempty"`
	// WarmupSent counts the datagrams of a warm-up (FloodSpec.Warmup), in
	// Sent too: one client's first flight from each address warmed, the
	// only addresses the rest of the flood comes from.
	WarmupSent uint64 `json:"warmup_sent,omitempty"`
	// ServerID is the server ID (hex) of the attacker's connection that
	// the flood's datagrams carry, for kinds that carry one.
	ServerID string `json:"server_id,omitempty"`
	// Reflected counts datagrams received on the flood's sockets: what
	// the server sent back to the sources it was flooded from. A spoofed
	// flood has no socket at its sources: it counts nothing.
	Reflected      uint64 `json:"reflected"`
	ReflectedBytes uint64 `json:"reflected_bytes"`
}

// batchWriter is ipv4.PacketConn or ipv6.PacketConn: both send a batch with
// one sendmmsg.
type batchWriter interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// floodBatch is the number of datagrams per sendmmsg.
const floodBatch = 64

// paceTick is how long a paced flood (FloodSpec.Rate) waits when it is
// ahead of its rate.
const paceTick = time.Millisecond

// datagrams writes a flood's datagrams, each into one of floodBatch buffers
// of its own.
type datagrams interface {
	// next writes the next datagram into buffer i and returns it.
	next(i int) []byte
}

// boundDatagrams are the datagrams of a flood from bound sockets: payloads
// only.
type boundDatagrams struct {
	gen  *packetGen
	bufs [][]byte
}

func newBoundDatagrams(kind PacketKind, seed uint64) *boundDatagrams {
	d := &boundDatagrams{gen: newPacketGen(kind, seed)}
	for range floodBatch {
		d.bufs = append(d.bufs, d.gen.newBuffer())
	}
	return d
}

func (d *boundDatagrams) next(i int) []byte { return d.gen.next(d.bufs[i]) }

// flood is a set of sockets, each bound to the source address it claims and
// connected to the target, with a reader per socket counting replies; and,
// for a spoofed flood, one raw socket connected to the target, the first
// writer.
type flood struct {
	spec    *FloodSpec
	dst     netip.AddrPort
	conns   []io.Closer
	writers []batchWriter
	readers sync.WaitGroup
	// hosts are the spoofed sources of a flood with a SpoofedSet.
	hosts []netip.Addr
	// serverID is what the kinds that need a server ID carry: the
	// attacker's connection's, set before run.
	serverID [quicclass.ServerIDLen]byte
	// warmup holds the whole IPv4 datagrams of a warm-up, one per host
	// (prepareWarmup).
	warmup [][]byte

	reflected, reflectedBytes atomic.Uint64
}

// openFlood binds one socket per source and connects it to dst: the IPv4
// loopback address 127.0.0.1 for IPv4 sources, ::1 for IPv6 ones. Only
// loopback sources are accepted. A spoofed flood opens one raw socket to
// 127.0.0.1 as well (first); its source range must be in 127.0.0.0/8.
func openFlood(spec *FloodSpec, port uint16) (*flood, error) {
	f := &flood{spec: spec}
	switch {
	case spec.Warmup && spec.SpoofedSet == 0:
		return nil, errors.New("a warm-up needs a spoofed set of addresses")
	case spec.Prove && spec.SpoofedSet == 0:
		return nil, errors.New("proven bots need a spoofed set of addresses")
	case spec.PathProbes && (spec.SpoofedSet == 0 || !spec.Attacker.IsValid()):
		return nil, errors.New("path probes need an attacker's connection and a spoofed set of addresses")
	case spec.SpoofedExcept.IsValid() && (!spec.Spoofed.IsValid() || spec.SpoofedSet > 0 || !spec.Spoofed.Contains(spec.SpoofedExcept)):
		return nil, fmt.Errorf("a spoofed flood's excepted source %v must be in its range, which is not narrowed to a set", spec.SpoofedExcept)
	case spec.Rate < 0 || spec.WarmupFlights < 0:
		return nil, fmt.Errorf("flood rate %d, warm-up flights %d: want 0 or more", spec.Rate, spec.WarmupFlights)
	}
	if spec.Spoofed.IsValid() {
		f.dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port)
		if err := checkSpoofed(spec.Spoofed, f.dst); err != nil {
			return nil, err
		}
		if spec.SpoofedSet > 0 {
			var err error
			if f.hosts, err = setHosts(spec.Spoofed, spec.SpoofedSet); err != nil {
				return nil, err
			}
		}
		c, w, err := openRawSender(f.dst)
		if err != nil {
			return nil, err
		}
		f.conns, f.writers = []io.Closer{c}, []batchWriter{w}
	}
	for _, src := range spec.Sources {
		if !src.IsLoopback() {
			f.close()
			return nil, fmt.Errorf("flood source %v is not a loopback address", src)
		}
		dst := netip.AddrPortFrom(netip.IPv6Loopback(), port)
		if src.Is4() {
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port)
		}
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(dst))
		if err != nil {
			f.close()
			return nil, fmt.Errorf("binding flood source %v: %w", src, err)
		}
		f.conns = append(f.conns, c)
		if src.Is4() {
			f.writers = append(f.writers, ipv4.NewPacketConn(c))
		} else {
			f.writers = append(f.writers, ipv6.NewPacketConn(c))
		}
		f.readers.Go(func() { f.read(c) })
	}
	return f, nil
}

// read counts the datagrams that arrive on c until c is closed.
func (f *flood) read(c *net.UDPConn) {
	buf := make([]byte, 2048)
	for {
		n, err := c.Read(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err == nil {
			f.reflected.Add(1)
			f.reflectedBytes.Add(uint64(n))
		}
		// Other errors are ICMP reports of the connected socket
		// (ECONNREFUSED while the server is down): keep reading.
	}
}

// run sends at full rate, round-robin over the sockets in batches, until d
// has passed, count datagrams are sent or ctx is done; a pulsing flood sends
// only during the On part of each period.
//
// A flood with a warm-up first sends it (warmUp), then the rest from the
// addresses warmed only.
func (f *flood) run(ctx context.Context, d time.Duration, count uint64, seed uint64) FloodResult {
	res := FloodResult{Kind: f.spec.Kind, Sockets: len(f.conns), Addresses: countAddrs(f.spec.Sources)}
	if f.spec.Kind.needsServerID() {
		res.ServerID = hex.EncodeToString(f.serverID[:])
	}
	// Each writer's datagrams and the bytes of headers they carry before
	// the UDP payload: the bound sockets share one generator, the raw
	// socket (the first writer) has its own.
	bound := newBoundDatagrams(f.spec.Kind, seed)
	bound.gen.serverID = f.serverID
	gens := make([]datagrams, len(f.writers))
	headers := make([]int, len(f.writers))
	for i := range gens {
		gens[i] = bound
	}
	var spoofed *spoofGen
	if f.spec.Spoofed.IsValid() {
		var err error
		if spoofed, err = newSpoofGen(f.spec.Kind, f.spec.Spoofed, f.dst, seed); err != nil {
			res.SendErrors, res.FirstError = 1, err.Error()
			return res
		}
		spoofed.payload.serverID = f.serverID
		if f.spec.SpoofedExcept.IsValid() {
			if err := spoofed.exclude(f.spec.SpoofedExcept); err != nil {
				res.SendErrors, res.FirstError = 1, err.Error()
				return res
			}
		}
		spoofed.cycle = f.spec.Rate > 0
		gens[0], headers[0] = spoofed, spoofHeaders
		res.Spoofed = f.spec.Spoofed.String()
	}
	msgs := make([]ipv4.Message, floodBatch)
	for i := range msgs {
		msgs[i].Buffers = [][]byte{nil}
	}
	start := time.Now()
	end := start.Add(d)
	writers := len(f.writers)
	if spoofed != nil && len(f.hosts) > 0 {
		hosts := f.hosts
		if len(f.warmup) > 0 {
			hosts = hosts[:min(len(hosts), f.warmUp(ctx, msgs, start.Add(d/2), count, &res))]
		}
		if len(hosts) == 0 {
			writers = 0 // nothing warmed: nothing more to send
		} else if err := spoofed.narrow(hosts); err != nil {
			res.SendErrors, res.FirstError = res.SendErrors+1, err.Error()
			return res
		}
	}
	period := f.spec.On + f.spec.Off
	// A paced flood counts its datagrams from here, after the warm-up.
	paceStart, paced := time.Now(), uint64(0)
	for i := 0; writers > 0; i = (i + 1) % writers {
		now := time.Now()
		if res.Sent >= count {
			res.CountBound = true
			break
		}
		if !now.Before(end) || ctx.Err() != nil {
			break
		}
		if f.spec.On > 0 {
			if phase := now.Sub(start) % period; phase >= f.spec.On {
				t := time.NewTimer(min(period-phase, end.Sub(now)))
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
				continue
			}
		}
		n := int(min(uint64(floodBatch), count-res.Sent))
		if f.spec.Rate > 0 {
			due := uint64(now.Sub(paceStart).Seconds()*float64(f.spec.Rate)) + 1
			if due <= paced {
				t := time.NewTimer(paceTick)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
				continue
			}
			n = int(min(uint64(n), due-paced))
		}
		for j := range n {
			msgs[j].Buffers[0] = gens[i].next(j)
		}
		k, err := f.writers[i].WriteBatch(msgs[:n], 0)
		for j := range k {
			res.Bytes += uint64(len(msgs[j].Buffers[0]) - headers[i])
		}
		res.Sent += uint64(max(k, 0))
		paced += uint64(max(k, 0))
		if err != nil {
			res.SendErrors++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
		}
	}
	elapsed := time.Since(start)
	if spoofed != nil {
		res.Addresses += spoofed.distinct
	}
	sending := elapsed
	if f.spec.On > 0 {
		sending = onTime(elapsed, f.spec.On, f.spec.Off)
	}
	res.Seconds = elapsed.Seconds()
	if res.Seconds > 0 {
		res.OfferedPPS = float64(res.Sent) / res.Seconds
	}
	if sending > 0 {
		res.PeakPPS = float64(res.Sent) / sending.Seconds()
	}
	return res
}

// finish waits grace for late replies, closes the sockets and adds the
// replies counted to res.
func (f *flood) finish(res *FloodResult, grace time.Duration) {
	time.Sleep(grace)
	f.close()
	res.Reflected = f.reflected.Load()
	res.ReflectedBytes = f.reflectedBytes.Load()
}

// close closes every socket and waits for the readers.
func (f *flood) close() {
	for _, c := range f.conns {
		c.Close()
	}
	f.readers.Wait()
}

// onTime is the time spent in On phases during the first elapsed of a
// pulse that starts on.
func onTime(elapsed, on, off time.Duration) time.Duration {
	period := on + off
	return elapsed/period*on + min(elapsed%period, on)
}

func countAddrs(addrs []netip.Addr) int {
	seen := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		seen[a] = true
	}
	return len(seen)
}
