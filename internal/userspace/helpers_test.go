package userspace

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// Every socket test here sends only to loopback addresses (127.0.0.1 and
// ::1, which every system has), and every flood is bounded in count and
// time.

// newTestDecider returns a limiter with a fixed hash key and seed, on clk
// when it is not nil, tracking one drop in 2^shift (shift < 0: the default).
func newTestDecider(t testing.TB, c decide.Config, clk *testutil.Clock, shift int) *Decider {
	t.Helper()
	hk := sketch.SeededHashKey(1)
	o := options{hashKey: &hk, seed: 0x9e3779b97f4a7c15}
	if clk != nil {
		o.now = clk.Now
	}
	if shift >= 0 {
		s := uint8(shift)
		o.trackShift = &s
	}
	l, err := newDecider(c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// dgram is a datagram from src to port 443 with payload b.
func dgram(src string, b []byte) decide.Datagram {
	return decide.Datagram{Key: sketch.KeyFrom(netip.MustParseAddrPort(src), 443), Length: len(b),
		Probe: b[:min(len(b), quicclass.ProbeBytes)]}
}

// junk is a datagram with the fixed bit clear (the other kinds of datagram
// are quicclasstest.Initial, quicclasstest.ShortHeader and quicclasstest.UnknownVersion).
func junk() []byte { return make([]byte, 50) }

// wrap wraps conn in the conn quic-go reads through, its reads decided by
// l (nil: every datagram passes), for a test.
func wrap(t testing.TB, conn *net.UDPConn, l *Decider) *packetconn.Conn {
	t.Helper()
	c, err := packetconn.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	if l != nil {
		c.SetDecider(l)
	}
	return c
}

// sender opens a socket bound to src (port 0: any).
func sender(t testing.TB, src string) *net.UDPConn {
	t.Helper()
	return testutil.Sender(t, netip.MustParseAddrPort(src))
}

// loopbackTo is the loopback address of src's family with port.
func loopbackTo(src string, port uint16) netip.AddrPort {
	return testutil.LoopbackFor(netip.MustParseAddrPort(src).Addr(), port)
}

var (
	errZeroBatch = errors.New("ReadBatch returned 0 datagrams without an error")
	errSwapped   = errors.New("ReadBatch moved a buffer between messages")
)

// quicGoBatch is a batch of 8 messages as quic-go reads them: each with
// one buffer of its own, of 1452 bytes, and room for control messages;
// bufs are the buffers, to check that they stay in place.
func quicGoBatch() (ms []ipv4.Message, bufs [][]byte) {
	ms = make([]ipv4.Message, 8)
	bufs = make([][]byte, len(ms))
	for i := range ms {
		bufs[i] = make([]byte, 1452)
		ms[i].Buffers = [][]byte{bufs[i]}
		ms[i].OOB = make([]byte, 128)
	}
	return ms, bufs
}

// readBatches reads c into tl with ReadBatch in batches of 8, as quic-go
// does, each slot with its own buffer, until the socket is closed; it checks
// that ReadBatch never returns 0 without an error and never swaps buffers.
// after, when not nil, runs after each batch is counted.
func readBatches(c *packetconn.Conn, tl *testutil.Tally, after func()) <-chan error {
	done := make(chan error, 1)
	ms, bufs := quicGoBatch()
	go func() {
		for {
			n, err := c.ReadBatch(ms, 0)
			if err != nil {
				done <- nil
				return
			}
			if n == 0 {
				done <- errZeroBatch
				return
			}
			for i := range n {
				if &ms[i].Buffers[0][0] != &bufs[i][0] {
					done <- errSwapped
					return
				}
				tl.Add(ms[i].Addr.(*net.UDPAddr).AddrPort())
			}
			if after != nil {
				after()
			}
		}
	}()
	return done
}

// pace sends n copies of payload from conn to dst at about rate per second
// (in bursts of 50), then stops.
func pace(conn *net.UDPConn, dst netip.AddrPort, payload []byte, rate, n int) error {
	return testutil.Pace(conn, dst, rate, n, func() []byte { return payload })
}

// hammer runs each of fns in a goroutine of its own, over and over (with
// the call's number, a millisecond apart), until stop is closed; bg counts
// the goroutines.
func hammer(stop <-chan struct{}, bg *sync.WaitGroup, fns []func(i int)) {
	for _, fn := range fns {
		bg.Add(1)
		go func() {
			defer bg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				fn(i)
				time.Sleep(time.Millisecond)
			}
		}()
	}
}
