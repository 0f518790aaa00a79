//go:build linux

package engine

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// xdpOn reports what ip link shows of XDP on the interface name of
// namespace ns: "" for none, else "xdp" (native) or "xdpgeneric".
func xdpOn(t testing.TB, ns *testutil.NetNS, name string) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns.Name(), "-d", "link", "show", "dev", name).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show %s: %v: %s", name, err, out)
	}
	for _, f := range strings.Fields(string(out)) {
		if f == "xdp" || f == "xdpgeneric" {
			return f
		}
	}
	return ""
}

// xdpServer makes a namespace with a veth, rl38 (fd00:38:1::1), to a client
// namespace, and fd00:38::1 on its loopback; with bridge, a bridge without
// ports too, rl38d, which has no native XDP.
func xdpServer(t *testing.T, bridge bool) *testutil.NetNS {
	t.Helper()
	testutil.RequireRoot(t)
	server, client := testutil.NewNetNS(t, "fd00:38::1/128"), testutil.NewNetNS(t)
	client.Link(t, server, "rl38", []string{"fd00:38:1::2/64"}, []string{"fd00:38:1::1/64"})
	if bridge {
		server.IP(t, "link add rl38d type bridge", "link set rl38d up")
	}
	return server
}

// filtered reports whether the engine decides what reaches conn, a socket
// in ns: a junk datagram sent to it from ns is counted invalid.
func filtered(t *testing.T, ns *testutil.NetNS, e Engine, conn *net.UDPConn) bool {
	t.Helper()
	invalid := func() uint64 {
		st, err := e.Stats()
		if err != nil {
			t.Fatal(err)
		}
		n := uint64(0)
		for _, dry := range st.Invalid {
			for _, fam := range dry {
				for _, r := range fam {
					n += r
				}
			}
		}
		return n
	}
	before := invalid()
	ns.Do(t, func() {
		s := testutil.Sender(t, netip.MustParseAddrPort("[fd00:38::1]:0"))
		to := netip.AddrPortFrom(netip.MustParseAddr("fd00:38::1"), testutil.PortOf(conn))
		if _, err := s.WriteToUDPAddrPort([]byte{0, 1, 2, 3}, to); err != nil {
			t.Fatal(err)
		}
	})
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if invalid() > before {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// openXDP opens mode xdp's engine in ns for o, closed when the test ends.
func openXDP(t *testing.T, ns *testutil.NetNS, o Options) *xdpEngine {
	t.Helper()
	var e Engine
	var err error
	ns.Do(t, func() { e, err = OpenXDP(testConfig(100), o) })
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e.(*xdpEngine)
}

// TestXDPEngine: the XDP program goes on the interfaces that hold a
// listener's address (every one but loopback for a wildcard), once for
// two listeners there, and none for a listener on a loopback address;
// the report lists it with the listeners it serves; it stays while one of
// them is protected, and leaves when the last is taken away or closed
// (a reload that removed it), and on Close.
func TestXDPEngine(t *testing.T) {
	server := xdpServer(t, false)
	e := openXDP(t, server, Options{})
	var wild, veth, lo *net.UDPConn
	server.Do(t, func() {
		wild = testutil.Listen(t, "udp6", "[::]:0")
		veth = testutil.Listen(t, "udp6", "[fd00:38:1::1]:0")
		lo = testutil.Listen(t, "udp6", "[fd00:38::1]:0")
		for _, c := range []*net.UDPConn{wild, veth, lo} {
			if err := e.Protect(c, nil); err != nil {
				t.Fatalf("protecting %v: %v", c.LocalAddr(), err)
			}
		}
	})
	names := func(xs []report.XDPInterface) []string {
		var out []string
		for _, x := range xs {
			out = append(out, fmt.Sprintf("%s %s %v", x.Name, x.Attach, x.Listeners))
		}
		return out
	}
	listeners := []string{wild.LocalAddr().String(), veth.LocalAddr().String()}
	slices.Sort(listeners)
	want := []string{fmt.Sprintf("rl38 native %v", listeners)}
	if got := names(e.XDPInterfaces()); !slices.Equal(got, want) {
		t.Fatalf("the XDP program runs on %v, want %v", got, want)
	}
	if got := xdpOn(t, server, "rl38"); got != "xdp" {
		t.Fatalf("ip link shows %q on the veth, want xdp", got)
	}
	if _, err := e.Unprotect(wild); err != nil {
		t.Fatal(err)
	}
	if got := xdpOn(t, server, "rl38"); got != "xdp" {
		t.Fatalf("ip link shows %q on the veth while a listener needs it, want xdp", got)
	}
	veth.Close()
	e.ForgetClosed()
	if got := xdpOn(t, server, "rl38"); got != "" {
		t.Fatalf("ip link shows %q on the veth after its last listener closed, want nothing", got)
	}
	if got := e.XDPInterfaces(); len(got) != 0 {
		t.Fatalf("the report lists %v after every listener left", names(got))
	}
	server.Do(t, func() {
		if err := e.Protect(wild, nil); err != nil {
			t.Fatal(err)
		}
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got := xdpOn(t, server, "rl38"); got != "" {
		t.Fatalf("ip link shows %q on the veth after Close, want nothing", got)
	}
}

// TestXDPWithoutNativeDriver: on an interface whose driver has no native
// XDP, mode xdp fails closed: the listener keeps the socket filter, the
// report lists the interface as socket filter only with the kernel's
// reason, which says to set xdp_generic; generic XDP runs there; mode auto,
// asked to try XDP there, falls back to the BPF filter with one warning.
func TestXDPWithoutNativeDriver(t *testing.T) {
	server := xdpServer(t, true)
	named := Options{XDPInterfaces: []string{"rl38d"}}
	var conn *net.UDPConn
	server.Do(t, func() { conn = testutil.Listen(t, "udp6", "[::]:0") })
	e := openXDP(t, server, named)
	var err error
	server.Do(t, func() { err = e.Protect(conn, nil) })
	var only *SocketFilterOnlyError
	if !errors.As(err, &only) || !strings.Contains(err.Error(), "no native XDP; set xdp_generic") {
		t.Fatalf("mode xdp on a bridge: %v, want the socket filter only, saying to set xdp_generic", err)
	}
	if !filtered(t, server, e, conn) {
		t.Fatal("the listener lost its socket filter when the XDP program was refused")
	}
	if got := xdpOn(t, server, "rl38d"); got != "" {
		t.Fatalf("ip link shows %q after the refusal", got)
	}
	if x := e.XDPInterfaces(); len(x) != 1 || x[0].Name != "rl38d" || x[0].Attach != report.XDPSocketFilterOnly ||
		x[0].LeftOut || !strings.Contains(x[0].Reason, "no native XDP") {
		t.Fatalf("the report lists %+v, want rl38d, socket filter only, refused", x)
	}
	if _, err := e.Unprotect(conn); err != nil {
		t.Fatal(err)
	}
	e.Close()

	generic := openXDP(t, server, Options{XDPInterfaces: []string{"rl38d"}, XDPGeneric: true})
	server.Do(t, func() { err = generic.Protect(conn, nil) })
	if err != nil {
		t.Fatal(err)
	}
	if got := xdpOn(t, server, "rl38d"); got != "xdpgeneric" {
		t.Fatalf("ip link shows %q with xdp_generic, want xdpgeneric", got)
	}
	if x := generic.XDPInterfaces(); len(x) != 1 || x[0].Attach != report.XDPGeneric {
		t.Fatalf("the report lists %+v, want rl38d generic", x)
	}
	generic.Close()

	core, logs := observer.New(zapcore.InfoLevel)
	var l *Limiter
	server.Do(t, func() {
		l, err = NewWith("auto-xdp", Setting{Config: testConfig(100), Mode: ModeAuto, Options: named, Logger: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		if l.Mode() != ModeXDP {
			t.Fatalf("mode auto asked for XDP runs %s", l.Mode())
		}
		if _, _, err := l.Attach(conn); err != nil {
			t.Fatal(err)
		}
	})
	if l.Mode() != ModeBPF {
		t.Fatalf("mode auto whose XDP program cannot attach runs %s, want bpf", l.Mode())
	}
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 1 || !strings.Contains(warns[0].Message, "because the XDP program cannot attach to the listener's interfaces; grant CAP_NET_ADMIN") {
		t.Fatalf("warnings %+v, want one that says the XDP program cannot attach", warns)
	}
}

// TestOpenXDPRefusals: mode xdp refuses to open without CAP_NET_ADMIN
// (this test binary again, without it), saying what to grant, and with an
// interface that does not exist, naming it.
func TestOpenXDPRefusals(t *testing.T) {
	if os.Getenv("RAKELIMIT_CHILD") == "open-xdp" {
		_, err := OpenXDP(testConfig(100), Options{})
		fmt.Printf("OPEN-RESULT: %v\n", err)
		return
	}
	testutil.RequireRoot(t)
	_, err := OpenXDP(testConfig(100), Options{XDPInterfaces: []string{"rl38-none"}})
	if err == nil || !strings.Contains(err.Error(), `xdp_interfaces: no interface "rl38-none" on this host`) {
		t.Errorf("an interface that does not exist: %v", err)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testutil.SkipOrFail(t, "needs setpriv (util-linux): %v", err)
	}
	cmd := exec.Command(setpriv, "--bounding-set=-net_admin", "--inh-caps=-net_admin",
		os.Args[0], "-test.run=^TestOpenXDPRefusals$", "-test.v")
	cmd.Env = append(os.Environ(), "RAKELIMIT_CHILD=open-xdp")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	_, result, ok := strings.Cut(string(out), "OPEN-RESULT: ")
	if !ok {
		t.Fatalf("child printed no result:\n%s", out)
	}
	result, _, _ = strings.Cut(result, "\n")
	for _, want := range []string{"needs CAP_NET_ADMIN besides CAP_BPF and CAP_PERFMON", "lacks CAP_NET_ADMIN",
		"setcap cap_bpf,cap_perfmon,cap_net_admin,cap_net_bind_service+p"} {
		if !strings.Contains(result, want) {
			t.Errorf("error without CAP_NET_ADMIN = %q, want it to contain %q", result, want)
		}
	}
	t.Logf("without CAP_NET_ADMIN: %s", result)
}
