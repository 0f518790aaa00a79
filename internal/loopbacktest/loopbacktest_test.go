package loopbacktest

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

// TestPaceRefuses: a destination outside loopback and fd00::/8 gets an
// error before anything is sent, and so does a rate of 0.
func TestPaceRefuses(t *testing.T) {
	conn := Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	sent := 0
	next := func() []byte { sent++; return []byte("x") }
	for _, tt := range []struct {
		dst  string
		rate int
	}{
		{"192.0.2.1:443", 100},
		{"[2001:db8::1]:443", 100},
		{"127.0.0.1:9", 0},
	} {
		if err := Pace(conn, netip.MustParseAddrPort(tt.dst), tt.rate, 10, next); err == nil {
			t.Errorf("Pace(%s, rate %d) = nil, want an error", tt.dst, tt.rate)
		}
	}
	if sent != 0 {
		t.Errorf("Pace sent %d datagrams to refused destinations", sent)
	}
}

// TestPaceArrives: a paced stream over loopback arrives whole.
func TestPaceArrives(t *testing.T) {
	const rate, seconds = 200, 2
	rcv := Listen(t, "udp4", "127.0.0.1:0")
	dst := rcv.LocalAddr().(*net.UDPAddr).AddrPort()
	snd := Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	if err := Pace(snd, dst, rate, rate*seconds, func() []byte { return []byte("paced") }); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	got := 0
	for got < rate*seconds {
		if err := rcv.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := rcv.ReadFromUDPAddrPort(buf); err != nil {
			break
		}
		got++
	}
	if got != rate*seconds {
		t.Errorf("received %d of %d paced datagrams", got, rate*seconds)
	}
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(string, ...any)     { r.errors++ }
func (r *recorder) Fatalf(f string, a ...any) { r.errors++ }

func TestCheckHeld(t *testing.T) {
	tests := []struct {
		name      string
		perSecond []int
		wantFail  bool
	}{
		{"at the limit", []int{500, 100, 100, 100}, false},
		{"within 10%", []int{0, 91, 109, 100}, false},
		{"over", []int{100, 100, 120, 100}, true},
		{"under", []int{100, 100, 100, 50}, true},
		{"first second ignored", []int{1000, 100, 100, 100}, false},
	}
	for _, tt := range tests {
		r := &recorder{TB: t}
		CheckHeld(r, tt.name, tt.perSecond, 4, 100)
		if got := r.errors > 0; got != tt.wantFail {
			t.Errorf("%s: CheckHeld(%v) failed = %v, want %v", tt.name, tt.perSecond, got, tt.wantFail)
		}
	}
}
