//go:build linux

package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sink is a dual-stack UDP socket on loopback that counts what arrives and
// when, and echoes the first echo datagrams back to their senders.
type sink struct {
	conn   *net.UDPConn
	got    atomic.Int64
	echoed atomic.Int64
	echo   int64
	mu     sync.Mutex
	// arrivals are the kernel's receive time stamps (SO_TIMESTAMPNS): on
	// loopback, the time the sender's datagram entered the receive path,
	// however late the reader gets to it on a busy machine; unstamped
	// counts the datagrams that came without one.
	arrivals  []time.Time
	unstamped int
	// from and size are each datagram's source (IPv4 unmapped) and size.
	from []netip.AddrPort
	size []int
	done chan struct{}
}

func newSink(t *testing.T, echo int64) *sink {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadBuffer(8 << 20)
	if err := setTimestamps(c); err != nil {
		t.Fatal(err)
	}
	s := &sink{conn: c, echo: echo, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf, oob := make([]byte, 2048), make([]byte, 128)
		for {
			n, oobn, _, from, err := c.ReadMsgUDPAddrPort(buf, oob)
			if err != nil {
				return
			}
			at, stamped := kernelStamp(oob[:oobn])
			s.got.Add(1)
			s.mu.Lock()
			if !stamped {
				s.unstamped++
			}
			s.arrivals = append(s.arrivals, at)
			s.from = append(s.from, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
			s.size = append(s.size, n)
			s.mu.Unlock()
			if s.echoed.Load() < s.echo {
				if _, err := c.WriteToUDPAddrPort(buf[:min(n, 40)], from); err == nil {
					s.echoed.Add(1)
				}
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-s.done })
	return s
}

// setTimestamps asks the kernel to stamp each datagram c receives with the
// time it arrived (SO_TIMESTAMPNS).
func setTimestamps(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("sink time stamps: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return fmt.Errorf("sink time stamps: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("sink time stamps: setting SO_TIMESTAMPNS: %w", serr)
	}
	return nil
}

// timespecSize is the size of the struct timespec of SCM_TIMESTAMPNS on a
// 64-bit kernel: seconds and nanoseconds, 8 bytes each.
const timespecSize = 16

// kernelStamp returns the receive time stamp in the control messages oob,
// or the time now and false when there is none.
func kernelStamp(oob []byte) (time.Time, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Now(), false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= timespecSize {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
			return time.Unix(sec, nsec), true
		}
	}
	return time.Now(), false
}

func (s *sink) port() uint16 { return uint16(s.conn.LocalAddr().(*net.UDPAddr).Port) }

// waitFor waits up to a second for the sink to have received n.
func (s *sink) waitFor(n int64) int64 {
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) && s.got.Load() < n; {
		time.Sleep(5 * time.Millisecond)
	}
	return s.got.Load()
}

// received returns the source and size of every datagram received so far.
func (s *sink) received() ([]netip.AddrPort, []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netip.AddrPort(nil), s.from...), append([]int(nil), s.size...)
}

func addrs(t *testing.T, ss ...string) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestFloodStopsAtCount(t *testing.T) {
	s := newSink(t, 0)
	f, err := openFlood(&FloodSpec{Sources: addrs(t, "127.99.0.1", "127.99.0.2", "127.99.1.1"), Kind: PacketInitial}, s.port())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := f.run(context.Background(), 10*time.Second, 2000, 1)
	f.finish(&res, 0)
	if time.Since(start) > 3*time.Second || res.Sent != 2000 || !res.CountBound || res.Bytes != 2000*MaxDatagram {
		t.Fatalf("after %v: %+v; want 2000 datagrams, bound by the count", time.Since(start), res)
	}
	if got := s.waitFor(2000); got != 2000 {
		t.Errorf("sink received %d, want 2000", got)
	}
	if res.Sockets != 3 || res.Addresses != 3 || res.OfferedPPS <= 0 {
		t.Errorf("result %+v", res)
	}
}

func TestFloodStopsAtTime(t *testing.T) {
	s := newSink(t, 0)
	f, err := openFlood(&FloodSpec{Sources: onePort(netip.MustParseAddr("127.99.0.3"), 8), Kind: PacketShort}, s.port())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := f.run(context.Background(), 300*time.Millisecond, 1<<62, 1)
	returned := time.Now()
	elapsed := returned.Sub(start)
	f.finish(&res, 0)
	if elapsed < 300*time.Millisecond || elapsed > time.Second || res.CountBound || res.Sent == 0 {
		t.Fatalf("after %v: %+v; want ~300ms, bound by time", elapsed, res)
	}
	if res.Sockets != 8 || res.Addresses != 1 {
		t.Errorf("one address on 8 ports: %+v", res)
	}
	// Nothing arrives after the flood returned: by the kernel's arrival
	// stamps, not by the reader's count, which a loaded machine delays.
	s.waitFor(int64(res.Sent))
	time.Sleep(100 * time.Millisecond)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unstamped != 0 {
		t.Fatalf("%d of %d datagrams came without the kernel's time stamp", s.unstamped, len(s.arrivals))
	}
	if got := len(s.arrivals); got > int(res.Sent) {
		t.Errorf("sink received %d, the flood counted %d sent", got, res.Sent)
	}
	for _, at := range s.arrivals {
		if at.After(returned) {
			t.Fatalf("a datagram arrived %v after the flood returned", at.Sub(returned))
		}
	}
}

func TestFloodCancel(t *testing.T) {
	s := newSink(t, 0)
	f, err := openFlood(&FloodSpec{Sources: addrs(t, "127.99.0.4"), Kind: PacketInvalid}, s.port())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := f.run(ctx, 10*time.Second, 1<<62, 1)
	f.finish(&res, 0)
	if d := time.Since(start); d > time.Second || res.Sent == 0 {
		t.Fatalf("cancelled flood returned after %v: %+v", d, res)
	}
}

// TestFloodPulse: a pulsed flood sends in its pulses and pauses between
// them. Arrivals are the kernel's time stamps, so a reader that falls behind
// does not move them; the sender, though, checks the phase once per batch
// of floodBatch datagrams, and a loaded machine may preempt it between the
// check and the batch's last datagram. That is a property of the machine,
// not of the pulses: a flood that ignored its pauses sends into every pause
// of every attempt, so a datagram in a pause fails only when 3 attempts in
// a row show one.
func TestFloodPulse(t *testing.T) {
	const attempts = 3
	var errs []string
	for range attempts {
		err := floodPulse(t)
		if err == nil {
			return
		}
		errs = append(errs, err.Error())
	}
	t.Fatalf("%d attempts: %s", attempts, strings.Join(errs, "; "))
}

// floodPulse runs a pulsed flood into a new sink and reports a datagram that
// arrived in a pause, or a pulse nothing arrived in (a sender starved for
// the whole pulse); it fails t on what no load explains.
func floodPulse(t *testing.T) error {
	t.Helper()
	s := newSink(t, 0)
	const on, off = 100 * time.Millisecond, 300 * time.Millisecond
	f, err := openFlood(&FloodSpec{Sources: addrs(t, "127.99.0.5"), Kind: PacketInitial, On: on, Off: off}, s.port())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := f.run(context.Background(), 900*time.Millisecond, 1<<62, 1)
	f.finish(&res, 50*time.Millisecond)
	if res.Sent == 0 || res.PeakPPS < 2*res.OfferedPPS {
		t.Fatalf("pulse %+v: want a peak rate well above the average", res)
	}
	s.waitFor(int64(res.Sent))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unstamped != 0 {
		t.Fatalf("%d of %d datagrams came without the kernel's time stamp", s.unstamped, len(s.arrivals))
	}
	perPulse := map[int]int{}
	const slack = 30 * time.Millisecond
	for _, at := range s.arrivals {
		since := at.Sub(start)
		phase := since % (on + off)
		if phase > on+slack && phase < on+off-slack {
			return fmt.Errorf("a datagram arrived %v into the flood, %v into a pause", since, phase-on)
		}
		perPulse[int(since/(on+off))]++
	}
	for i := range 3 {
		if perPulse[i] == 0 {
			return fmt.Errorf("nothing arrived in pulse %d: %v", i, perPulse)
		}
	}
	return nil
}

func TestFloodCountsReflection(t *testing.T) {
	s := newSink(t, 300)
	f, err := openFlood(&FloodSpec{Sources: addrs(t, "127.99.0.6", "127.99.0.7", "::1"), Kind: PacketInitial}, s.port())
	if err != nil {
		t.Fatal(err)
	}
	res := f.run(context.Background(), 5*time.Second, 1000, 1)
	if s.waitFor(1000) != 1000 {
		t.Fatalf("sink received %d of 1000 (IPv4 and IPv6 sources)", s.got.Load())
	}
	// The echoes, read by the flood's readers: waited for, not a fixed
	// grace a loaded machine may overrun; finish then closes the readers.
	deadline := time.Now().Add(10 * time.Second)
	for f.reflected.Load() < 300 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	f.finish(&res, 50*time.Millisecond)
	if echoed := s.echoed.Load(); echoed != 300 || res.Reflected != uint64(echoed) || res.ReflectedBytes != 300*40 {
		t.Fatalf("sink echoed %d; flood counted %d replies, %d bytes", echoed, res.Reflected, res.ReflectedBytes)
	}
}

func TestFloodRefusesOtherSources(t *testing.T) {
	for _, src := range []string{"192.0.2.1", "10.0.0.1", "fd00::1"} {
		_, err := openFlood(&FloodSpec{Sources: addrs(t, "127.99.0.8", src), Kind: PacketInitial}, 9)
		if err == nil || !strings.Contains(err.Error(), "flood source "+src+" is not a loopback address") {
			t.Errorf("source %s: err = %v", src, err)
		}
	}
}

func TestScenarioAddresses(t *testing.T) {
	legit := netip.MustParsePrefix("127.77.0.0/24")
	transfer := netip.MustParsePrefix("127.78.0.0/16")
	caddyNet := netip.MustParsePrefix("127.0.0.0/24")
	for _, a := range []netip.Addr{newConnSrc, establishedSrc, returningSrc, probeSrc, transferSrc} {
		if !legit.Contains(a) {
			t.Errorf("legitimate source %v outside %v", a, legit)
		}
	}
	for i := range concurrent {
		if a := transferNet(i); !transfer.Contains(a) || (i > 0 && netip.PrefixFrom(a, 24).Masked() == netip.PrefixFrom(transferNet(i-1), 24).Masked()) {
			t.Errorf("transfer source %d: %v", i, a)
		}
	}
	wantSockets := map[string][2]int{ // sockets, /24s
		"one-source": {1, 1}, "many-ports": {1024, 1}, "carpet-24": {256, 1}, "spread-1024": {1024, 256},
		"invalid": {1024, 256}, "short-one": {1, 1}, "short-1024": {1024, 256}, "pulse": {1024, 256},
		"id-spray-fixed": {1, 1}, "id-long-headers": {1, 1},
	}
	spoofed := map[string]PacketKind{}
	for _, sc := range Scenarios() {
		if sc.Flood == nil {
			continue
		}
		if sp := sc.Flood.Spoofed; sp.IsValid() {
			spoofed[sc.Name] = sc.Flood.Kind
			// Spoofed from the range or, for answered-reuse and the
			// attacks on proofs, a part of it; id-long-headers has a
			// bound socket too.
			inRange := sp == spoofedNet || sp.Bits() > spoofedNet.Bits() && spoofedNet.Contains(sp.Addr()) &&
				slices.Contains([]netip.Prefix{answeredNet, guessNet, botNet, floodedNet, borrowedNet}, sp)
			if !inRange || len(sc.Flood.Sources) > 0 && sc.Name != "id-long-headers" {
				t.Errorf("%s: spoofed from %v and %d sockets", sc.Name, sp, len(sc.Flood.Sources))
			}
			if len(sc.Flood.Sources) == 0 {
				continue
			}
		}
		nets := map[netip.Prefix]bool{}
		for _, a := range sc.Flood.Sources {
			if !a.Is4() || !a.IsLoopback() || legit.Contains(a) || transfer.Contains(a) || caddyNet.Contains(a) || spoofedNet.Contains(a) {
				t.Errorf("%s: source %v", sc.Name, a)
			}
			nets[netip.PrefixFrom(a, 24).Masked()] = true
		}
		if w := wantSockets[sc.Name]; len(sc.Flood.Sources) != w[0] || len(nets) != w[1] {
			t.Errorf("%s: %d sockets in %d /24s, want %v", sc.Name, len(sc.Flood.Sources), len(nets), w)
		}
	}
	// The spoofed range: 32,768 /24s in 127.0.0.0/8, none of them the
	// clients', the transfer's or Caddy's.
	lo := netip.MustParsePrefix("127.0.0.0/8")
	if !lo.Contains(spoofedNet.Addr()) || spoofedNet.Bits() != 9 || spoofedNet.Overlaps(legit) || spoofedNet.Overlaps(transfer) || spoofedNet.Overlaps(caddyNet) {
		t.Errorf("spoofed range %v", spoofedNet)
	}
	if want := map[string]PacketKind{"spoofed-initial": PacketInitial, "spoofed-long-min": PacketLongMin, "spoofed-short": PacketShortSmall,
		"id-spray-spoofed": PacketIDShort, "answered-reuse": PacketReuse, "id-long-headers": PacketIDLong,
		"id-guess": PacketGuess, "borrowed-proof": PacketShort, "proven-botnet": PacketInitial,
		"returning-flooded-24": PacketShortInitial}; !maps.Equal(spoofed, want) {
		t.Errorf("spoofed scenarios %v, want %v", spoofed, want)
	}
}

func TestOnTime(t *testing.T) {
	for _, tt := range []struct{ elapsed, want time.Duration }{
		{0, 0}, {50 * time.Millisecond, 50 * time.Millisecond}, {300 * time.Millisecond, 100 * time.Millisecond},
		{450 * time.Millisecond, 150 * time.Millisecond}, {2 * time.Second, 500 * time.Millisecond},
	} {
		if got := onTime(tt.elapsed, 100*time.Millisecond, 300*time.Millisecond); got != tt.want {
			t.Errorf("onTime(%v) = %v, want %v", tt.elapsed, got, tt.want)
		}
	}
}
