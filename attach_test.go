//go:build linux

package rakelimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

func init() { caddy.RegisterModule(tapWrapper{}) }

// tapWrapper is a test-only packet conn wrapper, "rakelimit_test_tap": it
// counts what quic-go reads and writes through the conn it returns, which
// shows whether it stays in quic-go's path.
type tapWrapper struct{}

// taps counts the tap conns' reads and writes, over every tap.
var taps struct{ reads, writes atomic.Uint64 }

func (tapWrapper) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.packetconns.rakelimit_test_tap", New: func() caddy.Module { return new(tapWrapper) }}
}

func (*tapWrapper) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

func (*tapWrapper) WrapPacketConn(pc net.PacketConn) net.PacketConn { return &tapConn{PacketConn: pc} }

// tapConn is a basic packet conn (quic-go reads it with ReadFrom).
type tapConn struct{ net.PacketConn }

func (c *tapConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.PacketConn.ReadFrom(b)
	if err == nil {
		taps.reads.Add(1)
	}
	return n, a, err
}

func (c *tapConn) WriteTo(b []byte, a net.Addr) (int, error) {
	taps.writes.Add(1)
	return c.PacketConn.WriteTo(b, a)
}

func (c *tapConn) Unwrap() net.PacketConn { return c.PacketConn }

// TestWrapperBeforeRakelimit: a packet conn wrapper listed before rakelimit
// would be taken out of quic-go's path, so the configuration is refused with
// a line that names it and says why; listed after rakelimit it stays in the
// path (quic-go reads and writes through it) and the flood is held.
func TestWrapperBeforeRakelimit(t *testing.T) {
	const limit = 100
	site := "127.0.0.1:{port}, localhost:{port} {\n\ttls internal\n\trespond \"hello\"\n}\n"
	wrappers := func(list string) string {
		return "servers {\n\t\tpacket_conn_wrappers {\n" + list + "\t\t}\n\t}"
	}
	c := &testCaddy{globalOptions: wrappers("\t\t\trakelimit_test_tap\n\t\t\trakelimit " + fmt.Sprint(limit) + "\n")}
	c.t, c.storage, c.port = t, t.TempDir(), freePort(t)
	err := c.load(site)
	if err == nil {
		caddy.Stop()
		t.Fatal("a wrapper before rakelimit was accepted")
	}
	if !strings.Contains(err.Error(), `packet conn wrapper "rakelimit_test_tap" is listed before rakelimit`) {
		t.Fatalf("refusal %q does not name the wrapper", err)
	}
	t.Logf("refused: %v", err)

	c.globalOptions = wrappers("\t\t\trakelimit " + fmt.Sprint(limit) + "\n\t\t\trakelimit_test_tap\n")
	reads, writes := taps.reads.Load(), taps.writes.Load()
	c = startCaddyWith(t, c, site)
	if taps.reads.Load() == reads || taps.writes.Load() == writes {
		t.Fatalf("the wrapper after rakelimit saw %d reads and %d writes", taps.reads.Load()-reads, taps.writes.Load()-writes)
	}
	if sent, dropped := c.floodDropped(limit); !held(sent, dropped, limit) {
		t.Fatalf("with a wrapper after rakelimit: a flood of %d at 30x the limit, %d dropped", sent, dropped)
	}
}

// lockedSocket opens a UDP socket on loopback port whose socket filter is
// locked (an accept-all classic filter, SO_LOCK_FILTER), so that no BPF
// filter can attach to it, and returns its descriptor for Caddy's fdgram
// network.
func lockedSocket(t *testing.T, port int) uintptr {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f, err := conn.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fd := int(f.Fd())
	acceptAll := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff}}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: 1, Filter: &acceptAll[0]}); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1); err != nil {
		t.Fatal(err)
	}
	return f.Fd()
}

// TestAttachFailure forces the BPF filter's attach to fail on a real Caddy
// listener (a socket handed over by descriptor, with its filter locked):
// in mode bpf the listener is served unprotected and a reload is accepted
// (the socket is not taken for one added by a reload); a reload to mode
// auto moves the limiter to userspace, which holds a flood; and in mode
// auto a listener added later whose attach fails moves the whole limiter,
// the listener the filter protected included.
func TestAttachFailure(t *testing.T) {
	const limit = 100
	lockedSite := func(fd uintptr, port int, limit int, mode string) string {
		return fmt.Sprintf("127.0.0.1:%[1]d, localhost:%[1]d {\n\tbind fdgram/%d {\n\t\tprotocols h3\n\t}\n\ttls internal\n\trakelimit {\n\t\tlimit %d\n\t\tmode %s\n\t}\n\trespond \"locked\"\n}\n",
			port, fd, limit, mode)
	}
	get := func(t *testing.T, port int) string {
		t.Helper()
		var body string
		var err error
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			body, _, err = h3Get(ctx, legitSrc, fmt.Sprintf("https://127.0.0.1:%d/", port))
			cancel()
			if err == nil {
				return body
			}
		}
		t.Fatalf("https://127.0.0.1:%d/ never answered over HTTP/3: %v", port, err)
		return ""
	}
	flood := func(t *testing.T, port int) {
		t.Helper()
		dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
		d0, p0 := filterDrops(t), passedUserspace(t)
		sent := quicFlood(t, floodSrc, dst, 30*limit, time.Second)
		if dropped := floodHeld(t, sent, d0, p0); !held(sent, dropped, limit) {
			t.Fatalf("a flood of %d at 30x the limit on :%d, %d dropped", sent, port, dropped)
		}
	}

	t.Run("bpf, then a reload, then auto", func(t *testing.T) {
		requireBPF(t)
		c := &testCaddy{}
		c.t, c.storage, c.port = t, t.TempDir(), freePort(t)
		fd := lockedSocket(t, c.port)
		if err := c.load(lockedSite(fd, c.port, limit, engine.ModeBPF)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { caddy.Stop() })
		if body := get(t, c.port); body != "locked" {
			t.Fatalf("body %q", body)
		}
		lim := limiterNamed(DefaultName)
		// One attempt when Caddy opened the listener, and one more when
		// the configuration was put in force after it: Caddy starts its
		// apps in map order, so the limiter's settings may come first
		// (nothing to retry yet) or second.
		if lim == nil || lim.Mode() != engine.ModeBPF || len(lim.Unprotected()) != 1 || lim.AttachErrors() < 1 || lim.AttachErrors() > 2 {
			t.Fatalf("limiter in mode %s, %d unprotected, %d failed attaches: want mode bpf with one unprotected listener, 1 or 2 failed attaches",
				lim.Mode(), len(lim.Unprotected()), lim.AttachErrors())
		}
		failed := lim.AttachErrors()
		if err := c.load(lockedSite(fd, c.port, 2*limit, engine.ModeBPF)); err != nil {
			t.Fatalf("a reload after a failed attach: %v", err)
		}
		if limiterNamed(DefaultName) != lim || lim.Setting().Config.Limiter.Limit != 2*limit || lim.AttachErrors() != failed+1 {
			t.Fatalf("after the reload: limit %d, %d failed attaches; want %d, %d (attached again, in vain)",
				lim.Setting().Config.Limiter.Limit, lim.AttachErrors(), 2*limit, failed+1)
		}
		if err := c.load(lockedSite(fd, c.port, limit, engine.ModeAuto)); err != nil {
			t.Fatalf("a reload to mode auto: %v", err)
		}
		if lim.Mode() != engine.ModeUserspace || len(lim.Unprotected()) != 0 || len(lim.Sockets()) != 1 {
			t.Fatalf("after the reload to auto: mode %s, %d unprotected, %d protected; want userspace, 0, 1",
				lim.Mode(), len(lim.Unprotected()), len(lim.Sockets()))
		}
		flood(t, c.port)
		if body := get(t, c.port); body != "locked" {
			t.Fatalf("body %q", body)
		}
	})

	t.Run("auto, a later listener", func(t *testing.T) {
		requireBPF(t)
		site := fmt.Sprintf(siteWithMode, limit, engine.ModeAuto)
		c := startCaddy(t, site)
		lim := limiterNamed(DefaultName)
		if lim == nil || lim.Mode() != engine.ModeBPF {
			t.Fatalf("limiter %v not in bpf mode", lim)
		}
		other := freePort(t)
		if err := c.load(site + lockedSite(lockedSocket(t, other), other, limit, engine.ModeAuto)); err != nil {
			t.Fatal(err)
		}
		if limiterNamed(DefaultName) != lim || lim.Mode() != engine.ModeUserspace || len(lim.Sockets()) != 2 {
			t.Fatalf("after a listener the filter cannot attach to: mode %s, %d sockets; want userspace, 2",
				lim.Mode(), len(lim.Sockets()))
		}
		flood(t, c.port)
		flood(t, other)
		if body := get(t, other); body != "locked" {
			t.Fatalf("body %q", body)
		}
	})
}
