package userspace

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// readMethods are every way to read a datagram through a Conn, each
// returning the payload's length and the source.
var readMethods = []struct {
	name string
	read func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error)
}{
	{"Read", func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error) {
		n, err := c.Read(b)
		return n, netip.AddrPort{}, err
	}},
	{"ReadFrom", func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error) {
		n, a, err := c.ReadFrom(b)
		if a == nil {
			return n, netip.AddrPort{}, err
		}
		return n, a.(*net.UDPAddr).AddrPort(), err
	}},
	{"ReadFromUDP", func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error) {
		n, a, err := c.ReadFromUDP(b)
		return n, a.AddrPort(), err
	}},
	{"ReadFromUDPAddrPort", func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error) {
		return c.ReadFromUDPAddrPort(b)
	}},
	{"ReadMsgUDP", func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error) {
		n, _, _, a, err := c.ReadMsgUDP(b, make([]byte, 128))
		return n, a.AddrPort(), err
	}},
	{"ReadMsgUDPAddrPort", func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error) {
		n, _, _, a, err := c.ReadMsgUDPAddrPort(b, make([]byte, 128))
		return n, a, err
	}},
	{"ReadBatch", func(c *packetconn.Conn, b []byte) (int, netip.AddrPort, error) {
		ms := []ipv4.Message{{Buffers: [][]byte{b}, OOB: make([]byte, 128)}}
		n, err := c.ReadBatch(ms, 0)
		if n == 0 {
			return 0, netip.AddrPort{}, err
		}
		return ms[0].N, ms[0].Addr.(*net.UDPAddr).AddrPort(), err
	}},
}

// TestEveryReadFilters: each read method skips a datagram the limiter drops
// and returns the next one, with its source; and the list above holds every
// read method of *net.UDPConn, so that none reads around the limiter.
func TestEveryReadFilters(t *testing.T) {
	tested := map[string]bool{}
	for _, m := range readMethods {
		tested[m.name] = true
	}
	ty := reflect.TypeFor[*net.UDPConn]()
	for i := range ty.NumMethod() {
		if name := ty.Method(i).Name; strings.HasPrefix(name, "Read") && !tested[name] {
			t.Errorf("*net.UDPConn has %s, which no test shows filtered", name)
		}
	}
	for _, m := range readMethods {
		t.Run(m.name, func(t *testing.T) {
			l := newTestDecider(t, testutil.QUICLimits(100, 1000), nil, -1)
			c := wrap(t, testutil.Listen(t, "udp4", "127.0.0.1:0"), l)
			s := sender(t, "127.0.0.1:0")
			dst := loopbackTo("127.0.0.1:0", testutil.PortOf(c.UDPConn))
			want := quicclasstest.Initial()
			copy(want[100:], "the datagram that passes")
			for _, b := range [][]byte{junk(), quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 300), want} {
				if _, err := s.WriteToUDPAddrPort(b, dst); err != nil {
					t.Fatal(err)
				}
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 1500)
			n, from, err := m.read(c, buf)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:n], want) {
				t.Fatalf("read %d bytes starting %x, want the Initial", n, buf[:min(n, 16)])
			}
			if m.name != "Read" && from != netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testutil.PortOf(s)) {
				t.Fatalf("from %v, want %v", from, s.LocalAddr())
			}
			st, _ := l.Stats()
			if st.Invalid[0][1][quicclass.FixedBit] != 1 || st.Invalid[0][1][quicclass.SmallInitial] != 1 || st.Passed[0][1] != 1 {
				t.Fatalf("counters: invalid %v, passed %v", st.Invalid[0][1], st.Passed[0][1])
			}
		})
	}
}

// TestSetDecider: without a decider every datagram passes; with one again,
// the drops resume.
func TestSetDecider(t *testing.T) {
	l := newTestDecider(t, testutil.QUICLimits(100, 1000), nil, -1)
	c := wrap(t, testutil.Listen(t, "udp4", "127.0.0.1:0"), l)
	s := sender(t, "127.0.0.1:0")
	dst := loopbackTo("127.0.0.1:0", testutil.PortOf(c.UDPConn))
	buf := make([]byte, 1500)
	c.SetDecider(nil)
	s.WriteToUDPAddrPort(junk(), dst)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, _, err := c.ReadFromUDPAddrPort(buf); err != nil || n != len(junk()) {
		t.Fatalf("without a limiter: %d bytes, %v", n, err)
	}
	c.SetDecider(l)
	if c.Decider() != l {
		t.Fatal("Decider() is not the limiter set")
	}
	s.WriteToUDPAddrPort(junk(), dst)
	s.WriteToUDPAddrPort(quicclasstest.ShortHeader(100), dst)
	if n, _, err := c.ReadFromUDPAddrPort(buf); err != nil || n != len(quicclasstest.ShortHeader(100)) {
		t.Fatalf("with the limiter again: %d bytes, %v; want the junk dropped", n, err)
	}
}

// TestDroppingReadsBlock: when everything is dropped, a read keeps reading
// until its deadline, and returns when the socket is closed, never with
// nothing and no error.
func TestDroppingReadsBlock(t *testing.T) {
	for _, m := range readMethods {
		t.Run(m.name, func(t *testing.T) {
			l := newTestDecider(t, testutil.QUICLimits(100, 1000), nil, -1)
			conn := testutil.Listen(t, "udp4", "127.0.0.1:0")
			c := wrap(t, conn, l)
			s := sender(t, "127.0.0.1:0")
			dst := loopbackTo("127.0.0.1:0", testutil.PortOf(conn))
			for range 20 {
				s.WriteToUDPAddrPort(junk(), dst)
			}
			start := time.Now()
			c.SetReadDeadline(start.Add(150 * time.Millisecond))
			buf := make([]byte, 1500)
			// ReadMsgUDP and ReadMsgUDPAddrPort return -1 with an error,
			// as *net.UDPConn's do.
			if n, _, err := m.read(c, buf); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read %d bytes, %v; want the deadline", n, err)
			}
			if d := time.Since(start); d < 140*time.Millisecond {
				t.Fatalf("returned after %v, before the deadline", d)
			}
			c.SetReadDeadline(time.Time{})
			errc := make(chan error, 1)
			go func() { _, _, err := m.read(c, buf); errc <- err }()
			for range 20 {
				s.WriteToUDPAddrPort(junk(), dst)
			}
			time.Sleep(50 * time.Millisecond)
			conn.Close()
			select {
			case err := <-errc:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("after Close: %v, want net.ErrClosed", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("a read blocked in drops did not return on Close")
			}
			st, _ := l.Stats()
			if got := st.Invalid[0][1][quicclass.FixedBit]; got != 40 {
				t.Fatalf("dropped %d junk datagrams, sent 40", got)
			}
		})
	}
}

// TestReadBatchPairs sends, round after round, one datagram from each of 16
// sources on a dual-stack socket (8 ports on 127.0.0.1, 8 on ::1), every
// other source sending junk, and reads them with ReadBatch in batches of 8,
// so that kept and dropped datagrams interleave in each batch: every
// datagram returned carries its own source's payload, and on Linux its own
// control message (the destination address, of its own family).
func TestReadBatchPairs(t *testing.T) {
	const rounds = 20
	l := newTestDecider(t, testutil.QUICLimits(10_000, 10_000), nil, -1)
	conn := testutil.Listen(t, "udp", "[::]:0")
	linux := runtime.GOOS == "linux"
	if linux {
		if err := ipv6.NewPacketConn(conn).SetControlMessage(ipv6.FlagDst, true); err != nil {
			t.Fatal(err)
		}
	}
	c := wrap(t, conn, l)
	var srcs []*net.UDPConn
	for i := range 16 {
		addr := "127.0.0.1:0"
		if i >= 8 {
			addr = "[::1]:0"
		}
		srcs = append(srcs, sender(t, addr))
	}
	ms, bufs := quicGoBatch()
	batches, mixed := 0, 0
	for round := range rounds {
		for i, s := range srcs {
			b := quicclasstest.ShortHeader(100)
			if i%2 == 1 {
				b = junk()
			}
			b = fmt.Appendf(b[:30], "port %d round %d", testutil.PortOf(s), round)
			if _, err := s.WriteToUDPAddrPort(b, loopbackTo(s.LocalAddr().String(), testutil.PortOf(conn))); err != nil {
				t.Fatal(err)
			}
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		for got := 0; got < len(srcs)/2; {
			n, err := c.ReadBatch(ms, 0)
			if err != nil {
				t.Fatalf("round %d: %v after %d datagrams", round, err, got)
			}
			batches++
			if n < len(ms) {
				mixed++
			}
			for i := range n {
				m := &ms[i]
				if &m.Buffers[0][0] != &bufs[i][0] {
					t.Fatalf("slot %d has another slot's buffer", i)
				}
				from := m.Addr.(*net.UDPAddr).AddrPort()
				want := fmt.Sprintf("port %d round %d", from.Port(), round)
				if payload := string(m.Buffers[0][30:m.N]); payload != want || m.Buffers[0][0] != quicclasstest.ShortHeader(100)[0] {
					t.Fatalf("round %d: datagram %q (first byte %#x) from %v, want %q", round, payload, m.Buffers[0][0], from, want)
				}
				if linux {
					var cm ipv6.ControlMessage
					if err := cm.Parse(m.OOB[:m.NN]); err != nil {
						t.Fatal(err)
					}
					dst, _ := netip.AddrFromSlice(cm.Dst)
					if dst.Unmap().Is4() != from.Addr().Unmap().Is4() {
						t.Fatalf("datagram from %v came with the control message of one to %v", from, dst)
					}
				}
			}
			got += n
		}
	}
	st, _ := l.Stats()
	if st.Invalid[0][1][quicclass.FixedBit] != rounds*4 || st.Invalid[0][2][quicclass.FixedBit] != rounds*4 {
		t.Fatalf("junk dropped: %v ipv4, %v ipv6; want %d each", st.Invalid[0][1][quicclass.FixedBit], st.Invalid[0][2][quicclass.FixedBit], rounds*4)
	}
	t.Logf("%d batches, %d of them with drops", batches, mixed)
}

// TestConnFlood: on a dual-stack socket read as quic-go reads it, a flood of
// Initials from 127.0.0.1 is held at the limit, junk and datagrams from a
// blocked port are dropped and counted by reason, and the established
// traffic of a client on ::1 arrives whole.
func TestConnFlood(t *testing.T) {
	const limit, rate, seconds = 200, 5000, 4
	conn := testutil.Listen(t, "udp", "[::]:0")
	port := testutil.PortOf(conn)
	floodS := sender(t, "127.0.0.1:0")
	junkS := sender(t, "127.0.0.1:0")
	blockedS := sender(t, "127.0.0.1:0")
	legitS := sender(t, "[::1]:0")
	cfg := testutil.QUICLimits(limit, 10_000)
	blocked := *cfg.BlockedPorts
	blocked.Add(testutil.PortOf(blockedS), testutil.PortOf(blockedS))
	cfg.BlockedPorts = &blocked
	l := newTestDecider(t, cfg, nil, -1)
	c := wrap(t, conn, l)
	// Here the limiter decides as quic-go reads, not as the flood is
	// sent: a reader that a loaded machine held back decides a backlog
	// at once. So the Tally counts each datagram in the second it was
	// read, and offered counts the flood's datagrams the limiter decided
	// in each second (its own counters, read after every batch).
	tl := testutil.NewTally()
	start := time.Now()
	v4 := decide.FamilyIndex(sketch.IPv4)
	var offered []int
	var decided uint64
	done := readBatches(c, tl, func() {
		st, _ := l.Stats()
		n := st.Passed[quicclass.Opening][v4]
		for _, d := range st.Dropped[quicclass.Opening][v4] {
			n += d
		}
		sec := int(time.Since(start) / time.Second)
		for len(offered) <= sec {
			offered = append(offered, 0)
		}
		offered[sec] += int(n - decided)
		decided = n
	})

	errs := make(chan error, 3)
	legitSent := 0
	go func() {
		for end := time.Now().Add(seconds * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if _, err := legitS.WriteToUDPAddrPort(quicclasstest.ShortHeader(100), loopbackTo("[::1]:0", port)); err != nil {
				errs <- err
				return
			}
			legitSent++
		}
		errs <- nil
	}()
	go func() { errs <- pace(junkS, loopbackTo("127.0.0.1:0", port), junk(), 100, 100*seconds) }()
	go func() {
		errs <- pace(blockedS, loopbackTo("127.0.0.1:0", port), quicclasstest.Initial(), 100, 100*seconds)
	}()
	if err := pace(floodS, loopbackTo("127.0.0.1:0", port), quicclasstest.Initial(), rate, rate*seconds); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitEmpty(t, conn)
	conn.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	at := func(s *net.UDPConn) netip.AddrPort { return s.LocalAddr().(*net.UDPAddr).AddrPort() }
	flood := tl.PerSecond(at(floodS))
	testutil.CheckHeld(t, "flood", flood, offered, seconds, limit)
	if got := tl.Received(at(legitS)); got != legitSent {
		t.Errorf("legit client on ::1: sent %d, received %d", legitSent, got)
	}
	if j, b := tl.Received(at(junkS)), tl.Received(at(blockedS)); j != 0 || b != 0 {
		t.Errorf("received %d junk datagrams and %d from a blocked port", j, b)
	}
	st, _ := l.Stats()
	if got := st.Invalid[0][v4][quicclass.FixedBit]; got != 100*seconds {
		t.Errorf("junk counted %d, sent %d", got, 100*seconds)
	}
	if got := st.Invalid[0][v4][quicclass.SourcePort]; got != 100*seconds {
		t.Errorf("blocked port counted %d, sent %d", got, 100*seconds)
	}
	var dropped uint64
	for _, d := range st.Dropped[0][v4] {
		dropped += d
	}
	if passed := st.Passed[0][v4]; passed+dropped != rate*seconds {
		t.Errorf("flood: passed %d + dropped %d, sent %d", passed, dropped, rate*seconds)
	}
	t.Logf("flood per second %v; legit %d of %d; dropped %d", flood, tl.Received(at(legitS)), legitSent, dropped)
}

// TestDecideBatchAllocatesNothing: deciding a batch, with drops tracked,
// allocates nothing (and packetconn.TestFilterBatchAllocatesNothing:
// compacting it around the drops neither).
func TestDecideBatchAllocatesNothing(t *testing.T) {
	l := newTestDecider(t, testutil.QUICLimits(100, 100_000), nil, 0)
	// A flood of Initials from 192.0.2.1, dropped, between short-header
	// packets from 192.0.2.0.
	payloads := [][]byte{quicclasstest.ShortHeader(100), quicclasstest.Initial()}
	batch := make([]decide.Datagram, 8)
	for i := range batch {
		batch[i] = dgram(fmt.Sprintf("192.0.2.%d:40000", i%2), payloads[i%2])
	}
	ds := make([]decide.Datagram, len(batch))
	drop := make([]bool, len(ds))
	fill := func() { copy(ds, batch) }
	for range 100 { // past the burst: the flood is dropped and tracked
		fill()
		l.DecideBatch(ds, drop)
	}
	allocs := testing.AllocsPerRun(100, func() {
		fill()
		l.DecideBatch(ds, drop)
		kept := 0
		for _, d := range drop {
			if !d {
				kept++
			}
		}
		if kept != 4 {
			t.Fatalf("kept %d of 8, want the 4 short-header datagrams", kept)
		}
	})
	if allocs != 0 {
		t.Fatalf("DecideBatch allocated %v times per batch", allocs)
	}
}
