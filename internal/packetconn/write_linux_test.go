//go:build linux

package packetconn

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// pad pads p with zeros to size bytes.
func pad(p []byte, size int) []byte { return append(p, make([]byte, size-len(p))...) }

// TestFastPathThroughConn: what quic-go does with the socket works through
// a Conn: a GSO batch leaves as one datagram per segment, each segment's
// ID taught; an ECN mark reaches the wire; ReadBatch reads a batch of
// datagrams with one call, as quic-go's batched reader does.
func TestFastPathThroughConn(t *testing.T) {
	rx := testutil.Listen(t, "udp4", "127.0.0.1:0")
	raw, err := rx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1) })
	if err != nil {
		t.Fatal(err)
	}
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	c, sink := newWriter(t, testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0")))

	const size = 1200 // a server pads a datagram with an ack-eliciting Initial to it
	batch := slices.Concat(pad(quicclasstest.AppendLongPacket(nil, quicclass.Version1, typeInitial, client[:4], idA[:], nil, 300), size),
		pad(handshakeTo(idB), size), quicclasstest.ShortHeader(400))
	if _, _, err := c.WriteMsgUDPAddrPort(batch, segmentMsg(size), to); err != nil {
		t.Fatalf("GSO write: %v", err)
	}
	const ect0 = 2
	if _, _, err := c.WriteMsgUDPAddrPort(quicclasstest.ShortHeader(100), cmsgTOS(), to); err != nil {
		t.Fatalf("ECN write: %v", err)
	}
	if a, _ := sink.Times(idA, to.Addr()); a != 1 {
		t.Fatalf("the batch taught %v, want both IDs", sink.IDs())
	}
	if b, _ := sink.Times(idB, to.Addr()); b != 1 {
		t.Fatalf("the batch taught %v, want both IDs", sink.IDs())
	}

	rx.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, oob := make([]byte, 1500), make([]byte, 128)
	for i, want := range []int{size, size, 400, 100} {
		n, oobn, _, _, err := rx.ReadMsgUDPAddrPort(b, oob)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("datagram %d: %d bytes, want %d (a GSO batch cut at its segments)", i, n, want)
		}
		if i == 3 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil || len(msgs) != 1 || msgs[0].Header.Type != unix.IP_TOS || msgs[0].Data[0]&3 != ect0 {
				t.Fatalf("the ECN-marked datagram arrived with control messages %v (%v)", msgs, err)
			}
		}
	}

	// The other way: the Conn reads a batch.
	rc, err := New(rx)
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := c.WriteToUDPAddrPort(quicclasstest.ShortHeader(50), to); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // all four queued
	ms := make([]ipv4.Message, 8)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1500)}
	}
	rc.SetReadDeadline(time.Now().Add(2 * time.Second))
	most := 0
	for got := 0; got < 4; {
		n, err := rc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("ReadBatch through the Conn: %v after %d datagrams", err, got)
		}
		got, most = got+n, max(most, n)
	}
	if most < 2 {
		t.Fatal("ReadBatch through the Conn read one datagram per call")
	}
}
