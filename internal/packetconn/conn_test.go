package packetconn

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/net/ipv4"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// fixedBitDecider drops the datagrams whose fixed bit is clear (junk, as
// junk makes them), and with dropLong every long header.
type fixedBitDecider struct{ dropLong bool }

func (f fixedBitDecider) drop(d *decide.Datagram) bool {
	if len(d.Probe) == 0 || d.Probe[0]&0x40 == 0 {
		return true
	}
	return f.dropLong && d.Probe[0]&0x80 != 0
}

func (f fixedBitDecider) Decide(d *decide.Datagram) decide.Outcome {
	return decide.Outcome{Drop: f.drop(d)}
}

func (f fixedBitDecider) DecideBatch(ds []decide.Datagram, drop []bool) {
	for i := range ds {
		drop[i] = f.drop(&ds[i])
	}
}

// junk is a datagram with the fixed bit clear.
func junk() []byte { return make([]byte, 50) }

// wrap wraps conn with d for a test.
func wrap(t testing.TB, conn *net.UDPConn, d Decider) *Conn {
	t.Helper()
	c, err := New(conn)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDecider(d)
	return c
}

// quicGoBatch is a batch of 8 messages as quic-go reads them: each with
// one buffer of its own, of 1452 bytes, and room for control messages.
func quicGoBatch() []ipv4.Message {
	ms := make([]ipv4.Message, 8)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1452)}
		ms[i].OOB = make([]byte, 128)
	}
	return ms
}

// TestRawConnRefusesRead: the raw connection controls the socket (quic-go
// sets its options through it) but cannot read around the Decider.
func TestRawConnRefusesRead(t *testing.T) {
	c := wrap(t, testutil.Listen(t, "udp4", "127.0.0.1:0"), fixedBitDecider{})
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Read(func(uintptr) bool { return true }); !errors.Is(err, errRawRead) {
		t.Fatalf("raw Read: %v, want it refused", err)
	}
	called := false
	if err := rc.Control(func(uintptr) { called = true }); err != nil || !called {
		t.Fatalf("raw Control: %v, called %v", err, called)
	}
	if c.Unwrap() != net.PacketConn(c.UDPConn) {
		t.Fatal("Unwrap does not return the socket")
	}
}

// TestNewRefuses: no socket, no wrapper.
func TestNewRefuses(t *testing.T) {
	if _, err := New(nil); err == nil || !strings.Contains(err.Error(), "no UDP socket") {
		t.Fatalf("New(nil): %v", err)
	}
}

// TestFilterBatchCompaction decides batches with drops in every pattern:
// the kept datagrams come first, in order, each with its own bytes, length,
// control messages, address and flags, in the buffers of the slot it lands
// in; no slot's buffers change.
func TestFilterBatchCompaction(t *testing.T) {
	tests := []struct {
		name    string
		pattern string // per slot: k kept, d dropped
		split   bool   // each slot's buffer in two pieces
	}{
		{"all kept", "kkkkkkkk", false},
		{"all dropped", "dddddddd", false},
		{"first dropped", "dkkkkkkk", false},
		{"alternate", "dkdkdkdk", false},
		{"last kept only", "dddddddk", false},
		{"runs", "kkddkkdd", false},
		{"scattered buffers", "dkkdkddk", true},
		{"longer than a chunk", strings.Repeat("dkkdk", 30), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Conn{port: 443}
			n := len(tt.pattern)
			ms := make([]ipv4.Message, n)
			own := make([][][]byte, n)
			var want []ipv4.Message
			var wantBytes [][]byte
			for i := range ms {
				b := quicclasstest.ShortHeader(100)
				if tt.pattern[i] == 'd' {
					b = junk()
				}
				b = append(b, fmt.Sprintf("slot %d", i)...)
				buf := make([]byte, 1452)
				copy(buf, b)
				ms[i].Buffers = [][]byte{buf}
				if tt.split {
					ms[i].Buffers = [][]byte{buf[:30], buf[30:]}
				}
				own[i] = ms[i].Buffers
				ms[i].N = len(b)
				ms[i].OOB = make([]byte, 128)
				ms[i].NN = copy(ms[i].OOB, fmt.Sprintf("oob of %d", i))
				ms[i].Addr = &net.UDPAddr{IP: net.IPv4(192, 0, 2, byte(i)), Port: 40000 + i}
				ms[i].Flags = i
				if tt.pattern[i] == 'k' {
					w := ms[i]
					w.OOB = bytes.Clone(ms[i].OOB) // ms[i].OOB may be written over
					want = append(want, w)
					wantBytes = append(wantBytes, b)
				}
			}
			kept := c.filterBatch(fixedBitDecider{}, ms)
			if kept != len(want) {
				t.Fatalf("kept %d, want %d", kept, len(want))
			}
			for i := range ms {
				if !reflect.DeepEqual(ms[i].Buffers, own[i]) || &ms[i].Buffers[0][0] != &own[i][0][0] {
					t.Fatalf("slot %d has other buffers", i)
				}
			}
			for i, w := range want {
				m := ms[i]
				var got []byte
				for _, b := range m.Buffers {
					got = append(got, b...)
				}
				got = got[:m.N]
				if !bytes.Equal(got, wantBytes[i]) || m.NN != w.NN || !bytes.Equal(m.OOB[:m.NN], w.OOB[:w.NN]) ||
					m.Addr != w.Addr || m.Flags != w.Flags {
					t.Fatalf("slot %d holds %q from %v (oob %q, flags %d), want %q from %v (oob %q, flags %d)",
						i, got, m.Addr, m.OOB[:m.NN], m.Flags, wantBytes[i], w.Addr, w.OOB[:w.NN], w.Flags)
				}
			}
		})
	}
}

// TestMoveMessageCuts: a slot smaller than the datagram gets it cut and
// flagged, never overrun.
func TestMoveMessageCuts(t *testing.T) {
	src := ipv4.Message{Buffers: [][]byte{bytes.Repeat([]byte{1}, 100)}, N: 100, OOB: bytes.Repeat([]byte{2}, 64), NN: 64}
	dst := ipv4.Message{Buffers: [][]byte{make([]byte, 40)}, OOB: make([]byte, 16)}
	moveMessage(&dst, &src)
	if dst.N != 40 || dst.NN != 16 || dst.Flags&msgTrunc != msgTrunc || dst.Flags&msgCtrunc != msgCtrunc {
		t.Fatalf("moved into a short slot: N %d NN %d flags %#x", dst.N, dst.NN, dst.Flags)
	}
}

// TestFilterBatchAllocatesNothing: compacting a batch around the datagrams
// dropped allocates nothing (the userspace limiter's DecideBatch allocates
// nothing either: userspace.TestDecideBatchAllocatesNothing).
func TestFilterBatchAllocatesNothing(t *testing.T) {
	d := fixedBitDecider{dropLong: true}
	c := &Conn{port: 443}
	ms := quicGoBatch()
	for i := range ms {
		ms[i].Addr = &net.UDPAddr{IP: net.IPv4(192, 0, 2, byte(i%2)), Port: 40000}
	}
	// Initials from 192.0.2.1, dropped, between short-header packets from
	// 192.0.2.0.
	payloads := [][]byte{quicclasstest.ShortHeader(100), quicclasstest.Initial()}
	fill := func() {
		for i := range ms {
			payload := payloads[i%2]
			ms[i].N = copy(ms[i].Buffers[0], payload)
			ms[i].NN = 16
		}
	}
	allocs := testing.AllocsPerRun(100, func() {
		fill()
		if kept := c.filterBatch(d, ms); kept != 4 {
			t.Fatalf("kept %d of 8, want the 4 short-header datagrams", kept)
		}
	})
	if allocs != 0 {
		t.Fatalf("filterBatch allocated %v times per batch", allocs)
	}
}
