package testutil

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestAllowed(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.9.8.7", true},
		{"::1", true},
		{"::ffff:127.0.0.2", true},
		{"fd00:1:2:3::1", true},
		{"fdff::9", true},
		{"fc00::1", false},
		{"192.0.2.1", false},
		{"10.0.0.1", false},
		{"2001:db8::1", false},
		{"::ffff:192.0.2.1", false},
	}
	for _, tt := range tests {
		if got := Allowed(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Allowed(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

func TestLoopbackFor(t *testing.T) {
	tests := []struct{ src, want string }{
		{"127.0.0.9", "127.0.0.1:443"},
		{"::ffff:127.0.0.9", "127.0.0.1:443"},
		{"::1", "[::1]:443"},
		{"fd00::5", "[::1]:443"},
	}
	for _, tt := range tests {
		if got := LoopbackFor(netip.MustParseAddr(tt.src), 443); got != netip.MustParseAddrPort(tt.want) {
			t.Errorf("LoopbackFor(%s) = %v, want %v", tt.src, got, tt.want)
		}
	}
}

// TestFloodRefuses: a destination outside loopback and fd00::/8 gets an
// error before anything is sent, and so does a flood without a rate, a
// count, a socket or a payload.
func TestFloodRefuses(t *testing.T) {
	conn := Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	sent := 0
	next := func() []byte { sent++; return []byte("x") }
	loop := netip.MustParseAddrPort("127.0.0.1:9")
	tests := []struct {
		name string
		f    Flood
	}{
		{"documentation address", Flood{To: netip.MustParseAddrPort("192.0.2.1:443"), Rate: 100, Count: 10}},
		{"global IPv6", Flood{To: netip.MustParseAddrPort("[2001:db8::1]:443"), Rate: 100, Count: 10}},
		{"mapped global IPv4", Flood{To: netip.MustParseAddrPort("[::ffff:192.0.2.1]:443"), Rate: 100, Count: 10}},
		{"rate 0", Flood{To: loop, Rate: 0, Count: 10}},
		{"count 0", Flood{To: loop, Rate: 100, Count: 0}},
		{"negative duration", Flood{To: loop, Rate: 100, Count: 10, For: -time.Second}},
		{"no socket", Flood{To: loop, Rate: 100, Count: 10, Next: next}},
		{"no payload", Flood{From: []*net.UDPConn{conn}, To: loop, Rate: 100, Count: 10}},
	}
	for _, tt := range tests {
		f := tt.f
		if f.From == nil && tt.name != "no socket" {
			f.From = []*net.UDPConn{conn}
		}
		if f.Next == nil && tt.name != "no payload" {
			f.Next = next
		}
		if n, err := f.Send(); err == nil || n != 0 {
			t.Errorf("%s: Send() = %d, %v; want 0 and an error", tt.name, n, err)
		}
	}
	if err := Pace(conn, netip.MustParseAddrPort("192.0.2.1:443"), 100, 10, next); err == nil {
		t.Error("Pace to 192.0.2.1 = nil, want an error")
	}
	if sent != 0 {
		t.Errorf("%d datagrams made for refused floods", sent)
	}
}

// readAll reads conn until a second passes without a datagram and returns
// how many arrived.
func readAll(t *testing.T, conn *net.UDPConn) int {
	t.Helper()
	buf := make([]byte, 64)
	got := 0
	for {
		if err := conn.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := conn.ReadFromUDPAddrPort(buf); err != nil {
			return got
		}
		got++
	}
}

// TestPaceArrives: a paced stream over loopback arrives whole.
func TestPaceArrives(t *testing.T) {
	const rate, seconds = 200, 2
	rcv := Listen(t, "udp4", "127.0.0.1:0")
	snd := Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	if err := Pace(snd, LoopbackFor(netip.MustParseAddr("127.0.0.1"), PortOf(rcv)), rate, rate*seconds,
		func() []byte { return []byte("paced") }); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, rcv); got != rate*seconds {
		t.Errorf("received %d of %d paced datagrams", got, rate*seconds)
	}
}

// TestFloodBounds: a flood stops at its count, or at its duration when that
// comes first, and sends from its sockets in turn.
func TestFloodBounds(t *testing.T) {
	tests := []struct {
		name        string
		rate, count int
		d           time.Duration
		// wantMin and wantMax bound what is sent.
		wantMin, wantMax int
	}{
		{"count first", 1000, 300, 5 * time.Second, 300, 300},
		// 400 ms at 1000 per second is 400, in bursts of 50: the count
		// of 5000 is never reached.
		{"duration first", 1000, 5000, 400 * time.Millisecond, 50, 450},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rcv := Listen(t, "udp4", "127.0.0.1:0")
			a := Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
			b := Sender(t, netip.MustParseAddrPort("127.0.0.3:0"))
			r := Receive(rcv)
			start := time.Now()
			sent, err := Flood{From: []*net.UDPConn{a, b}, To: LoopbackFor(netip.MustParseAddr("127.0.0.2"), PortOf(rcv)),
				Rate: tt.rate, Count: tt.count, For: tt.d, Next: func() []byte { return []byte("flood") }}.Send()
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			r.Stop(t)
			if sent < tt.wantMin || sent > tt.wantMax {
				t.Errorf("sent %d in %v, want %d to %d", sent, took, tt.wantMin, tt.wantMax)
			}
			if tt.count > sent && took > tt.d+time.Second {
				t.Errorf("a flood of %v took %v", tt.d, took)
			}
			fromA, fromB := r.Received(a.LocalAddr().(*net.UDPAddr).AddrPort()), r.Received(b.LocalAddr().(*net.UDPAddr).AddrPort())
			if fromA+fromB != sent || fromA-fromB > 1 || fromB > fromA {
				t.Errorf("sent %d: received %d from the first socket, %d from the second; want all, in turn", sent, fromA, fromB)
			}
		})
	}
}

// TestFloodStop: closing Stop ends a flood long before its count and
// duration would.
func TestFloodStop(t *testing.T) {
	rcv := Listen(t, "udp4", "127.0.0.1:0")
	snd := Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	stop := make(chan struct{})
	time.AfterFunc(200*time.Millisecond, func() { close(stop) })
	start := time.Now()
	sent, err := Flood{From: []*net.UDPConn{snd}, To: LoopbackFor(netip.MustParseAddr("127.0.0.2"), PortOf(rcv)),
		Rate: 500, Count: 500 * 60, For: time.Minute, Stop: stop, Next: func() []byte { return []byte("flood") }}.Send()
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second || sent >= 500*10 {
		t.Errorf("stopped after 200 ms: sent %d in %v", sent, took)
	}
}
