//go:build linux

package engine

// End-to-end tests of mode xdp on hosts as they are (issue 45): a port
// redirect, a tun device, a bridge and its port, a VLAN, traffic that is
// not the listener's (forwarded, a macvlan child's, another socket's), and
// a Docker-like host. Each runs the real engine in a server's network
// namespace, with its sockets there, and sends from a client's namespace
// across a veth; the engine's counters say what was decided, the
// listener's socket's drop counter who decided (the XDP program's drops
// never reach the socket, the socket filter's are counted there), and the
// sockets what arrived.
//
// Each test runs in a copy of this test binary started inside the server's
// namespace (onXDPHost): the engine reads the host it runs on, as Caddy
// does, from whatever thread (its goroutine that follows rtnetlink and
// /proc/net/udp runs on any), so every thread of the process must be in
// that namespace. A test that entered it on one thread (NetNS.Do) would
// have the engine list the addresses of the test's own namespace at the
// first notification, within a second.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// hostEnv hands a copy of the test binary started inside a server's
// namespace the names of its test's namespaces: the server's, the
// client's and the far one's, comma-separated (onXDPHost).
const hostEnv = "RAKELIMIT_XDP_HOST"

// xdpHost are the network namespaces of an end-to-end test of mode xdp: the
// server's, where the engine and its sockets run (the process that runs the
// test's body is inside it), the client's, which sends across a veth, and
// a far one (a routed destination, a macvlan child's, a container's).
type xdpHost struct {
	server, client, far *testutil.NetNS
}

// onXDPHost runs body for the top-level test t in a copy of this test
// binary started inside a new server namespace (ip netns exec), with a
// client's and a far namespace beside it; this process makes the three and
// removes them when t ends. Inside, body runs with the namespaces joined by
// name; a failure or a skip there is t's.
func onXDPHost(t *testing.T, body func(t *testing.T, h xdpHost)) {
	t.Helper()
	if names := os.Getenv(hostEnv); names != "" {
		ns := strings.Split(names, ",")
		if len(ns) != 3 {
			t.Fatalf("%s=%q: want the server's, the client's and the far namespace's names", hostEnv, names)
		}
		body(t, xdpHost{server: testutil.JoinNetNS(t, ns[0]), client: testutil.JoinNetNS(t, ns[1]),
			far: testutil.JoinNetNS(t, ns[2])})
		return
	}
	testutil.RequireRoot(t)
	h := xdpHost{server: testutil.NewNetNS(t), client: testutil.NewNetNS(t), far: testutil.NewNetNS(t)}
	cmd := exec.CommandContext(t.Context(), "ip", "netns", "exec", h.server.Name(), os.Args[0],
		"-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%s", hostEnv, h.server.Name(), h.client.Name(), h.far.Name()))
	out, err := cmd.CombinedOutput()
	t.Logf("inside the server's namespace:\n%s", out)
	switch {
	case err != nil:
		t.Fatalf("the test inside the server's namespace: %v", err)
	case strings.Contains(string(out), "--- SKIP: "+t.Name()+" "):
		t.Skip("skipped inside the server's namespace (its log above says why)")
	case !strings.Contains(string(out), "--- PASS: "+t.Name()+" "):
		t.Fatal("the test did not run inside the server's namespace")
	}
}

// The traffic of these tests: hostRate datagrams a second at the most, on
// every path; each send bounded in count (hostJunk and hostInitials, or
// fewer); hostWait for them to be decided or to arrive.
const (
	hostRate     = 5000
	hostJunk     = 1000
	hostInitials = 50
	hostWait     = 5 * time.Second
	// hostPort is the listeners' port, and the port of the sockets that
	// are not the listener's: the namespaces are the test's own.
	hostPort = 8443
)

// hostConfig is the limiter of these tests: limits far above what they
// send, so that valid Initials pass and junk alone is dropped.
func hostConfig() decide.Config { return testConfig(100_000) }

// openHost opens mode xdp's engine for o in the process (inside the
// server's namespace), closed when t ends.
func openHost(t *testing.T, h xdpHost, o Options) *xdpEngine {
	t.Helper()
	var e Engine
	var err error
	h.server.Do(t, func() { e, err = OpenXDP(hostConfig(), o) })
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e.(*xdpEngine)
}

// listenHost opens a UDP socket in ns on addr, with SO_REUSEPORT as Caddy's
// listeners have it (another socket with SO_REUSEPORT may then bind a
// specific address on the same port: Linux refuses the second bind unless
// both have SO_REUSEPORT, or both SO_REUSEADDR), closed when t ends.
func listenHost(t *testing.T, ns *testutil.NetNS, addr string) *net.UDPConn {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	var conn *net.UDPConn
	ns.Do(t, func() {
		pc, err := lc.ListenPacket(context.Background(), "udp6", addr)
		if err != nil {
			t.Fatalf("listen %s: %v", addr, err)
		}
		conn = pc.(*net.UDPConn)
	})
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetReadBuffer(testutil.ReadBuffer); err != nil {
		t.Fatal(err)
	}
	return conn
}

// ap parses an address and port.
func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// path is one way datagrams reach a server: from a UDP socket to to, or
// written raw (a tun device's file, a packet socket) by write, which makes
// a packet to to of each payload.
type path struct {
	to    netip.AddrPort
	from  *net.UDPConn
	write func(payload []byte) error
}

// udpPath sends from the socket from to to, a loopback or fd00::/8
// address.
func udpPath(t *testing.T, from *net.UDPConn, to netip.AddrPort) path {
	t.Helper()
	if !testutil.Allowed(to.Addr()) {
		t.Fatalf("a path to %v, neither loopback nor fd00::/8", to)
	}
	return path{to: to, from: from}
}

// send sends n datagrams along p, each next's payload, at hostRate at the
// most: a socket's through testutil.Pace, a raw writer's in bursts of 50.
func (p path) send(t *testing.T, n int, next func() []byte) {
	t.Helper()
	if p.from != nil {
		if err := testutil.Pace(p.from, p.to, hostRate, n, next); err != nil {
			t.Fatal(err)
		}
		return
	}
	const burst = 50
	for i := 0; i < n; i++ {
		if err := p.write(next()); err != nil {
			t.Fatalf("writing a datagram to %v: %v", p.to, err)
		}
		if i%burst == burst-1 {
			time.Sleep(time.Second * burst / hostRate)
		}
	}
}

// junk returns payloads a QUIC server never takes: a short header whose
// fixed bit is 0 (invalid, always dropped), each different.
func junk() func() []byte {
	n := uint32(0)
	return func() []byte {
		n++
		b := make([]byte, 32)
		binary.BigEndian.PutUint32(b[1:], n)
		return b
	}
}

// udp6Packet is the IPv6 packet of a UDP datagram from src to dst, a
// loopback or fd00::/8 address, with the checksum IPv6 requires (a
// socket's receive path checks it before its filter runs): what a tun
// device's file and a packet socket write.
func udp6Packet(src, dst netip.AddrPort, payload []byte) ([]byte, error) {
	if !testutil.Allowed(dst.Addr()) || !src.Addr().Is6() || !dst.Addr().Is6() {
		return nil, fmt.Errorf("a packet from %v to %v: IPv6 to loopback or fd00::/8 only", src, dst)
	}
	b := testutil.Frame{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), Data: payload}.Bytes()
	b = b[testutil.EthHdrLen:]
	udp := b[testutil.IPv6HdrLen:]
	// The Internet checksum of the pseudo-header (the addresses, the
	// datagram's length and protocol) and the datagram, whose checksum
	// field is 0.
	var sum uint32
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(p[i:]))
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	add(b[8:testutil.IPv6HdrLen])
	sum += uint32(len(udp)) + testutil.ProtoUDP
	add(udp)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	if c == 0 {
		c = 0xffff // 0 says "no checksum", which IPv6 refuses
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	return b, nil
}

// tunPath makes a tun device (layer 3: IPv6 packets without an Ethernet
// header) called name in ns with the address fd00:45:2::1/64, up, and
// writes to its file the datagrams of a sender at fd00:45:2::2 to
// fd00:45:2::1 on port: the kernel receives them as from the wire. The
// device goes when t ends.
func tunPath(t *testing.T, ns *testutil.NetNS, name string, port uint16) path {
	t.Helper()
	var fd int
	ns.Do(t, func() {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			testutil.SkipOrFail(t, "a tun device needs /dev/net/tun: %v", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			t.Fatal(err)
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			t.Fatalf("making tun device %s: %v", name, err)
		}
	})
	t.Cleanup(func() { unix.Close(fd) })
	ns.IP(t, "link set "+name+" up", "addr add fd00:45:2::1/64 dev "+name+" nodad")
	src, to := ap("[fd00:45:2::2]:40000"), netip.AddrPortFrom(netip.MustParseAddr("fd00:45:2::1"), port)
	return path{to: to, write: func(payload []byte) error {
		pkt, err := udp6Packet(src, to, payload)
		if err != nil {
			return err
		}
		_, err = unix.Write(fd, pkt)
		return err
	}}
}

// taggedPath sends from ns's interface ifname raw Ethernet frames to the
// MAC address dstMAC with an 802.1Q tag of VLAN vid in the frame (0: a
// priority tag, which a host without a VLAN device takes as untagged), each
// carrying a datagram from src to to.
func taggedPath(t *testing.T, ns *testutil.NetNS, ifname string, dstMAC net.HardwareAddr, vid uint16,
	src, to netip.AddrPort) path {
	t.Helper()
	var fd int
	var iface *net.Interface
	ns.Do(t, func() {
		var err error
		if iface, err = net.InterfaceByName(ifname); err != nil {
			t.Fatal(err)
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			t.Fatalf("opening a packet socket: %v", err)
		}
	})
	t.Cleanup(func() { unix.Close(fd) })
	sa := &unix.SockaddrLinklayer{Ifindex: iface.Index, Protocol: htons(unix.ETH_P_8021Q), Halen: 6}
	copy(sa.Addr[:], dstMAC)
	return path{to: to, write: func(payload []byte) error {
		pkt, err := udp6Packet(src, to, payload)
		if err != nil {
			return err
		}
		frame := append([]byte{}, dstMAC...)
		frame = append(frame, iface.HardwareAddr...)
		frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_8021Q)
		frame = binary.BigEndian.AppendUint16(frame, vid)
		frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_IPV6)
		return unix.Sendto(fd, append(frame, pkt...), 0, sa)
	}}
}

// htons is v in network byte order, as a packet socket's address wants
// its protocol.
func htons(v uint16) uint16 { return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v)) }

// macOf is the MAC address of ns's interface name.
func macOf(t *testing.T, ns *testutil.NetNS, name string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	ns.Do(t, func() {
		iface, err := net.InterfaceByName(name)
		if err != nil {
			t.Fatal(err)
		}
		mac = iface.HardwareAddr
	})
	return mac
}

// decisions counts the datagrams the engine decided, however (each is in
// exactly one of its counters), those of them it dropped (over a limit,
// invalid, of an unknown version over the cap), the invalid ones it
// dropped, and those the limiter passed.
func decisions(st decide.Stats) (decided, dropped, invalid, passed uint64) {
	// rest: neither dropped nor passed by the limiter: over a limit or
	// invalid in a dry run, of an unknown version under the cap or in a
	// dry run, allowlisted.
	var rest uint64
	for c := range st.Passed {
		for f := range st.Passed[c] {
			passed += st.Passed[c][f]
			for l := range st.Dropped[c][f] {
				dropped += st.Dropped[c][f][l]
				rest += st.WouldDrop[c][f][l]
			}
		}
	}
	for f := range decide.Families {
		for r := range st.Invalid[0][f] {
			invalid += st.Invalid[0][f][r]
			rest += st.Invalid[1][f][r]
		}
		dropped += st.Negotiation[f][decide.NegotiationDropped]
		rest += st.Negotiation[f][decide.NegotiationPassed] + st.Negotiation[f][decide.NegotiationWouldDrop]
		rest += st.Allowed[f]
	}
	dropped += invalid
	return passed + dropped + rest, dropped, invalid, passed
}

// counted is what one send moved: the engine's counters (every decision,
// the drops of any kind, the invalid datagrams dropped, the datagrams
// passed), the drop counter of the listener's socket, which counts its
// socket filter's drops and not the XDP program's (filtered), and the
// datagrams that reached the socket they were sent to.
type counted struct {
	sent                              int
	decided, dropped, invalid, passed uint64
	filtered                          uint64
	received                          int
}

func (c counted) String() string {
	return fmt.Sprintf("sent %d: decided %d (passed %d, dropped %d of which invalid %d), dropped by the listener's "+
		"socket filter %d, received %d", c.sent, c.decided, c.passed, c.dropped, c.invalid, c.filtered, c.received)
}

// readCounts reads the engine's counters and the listener's socket's drop
// counter.
func readCounts(e Engine, conn *net.UDPConn) (counted, error) {
	st, err := e.Stats()
	if err != nil {
		return counted{}, err
	}
	var c counted
	c.decided, c.dropped, c.invalid, c.passed = decisions(st)
	if _, _, c.filtered, err = backlog.ReadSockets([]*net.UDPConn{conn}); err != nil {
		return counted{}, err
	}
	return c, nil
}

// exchange sends junk and then valid Initials along p, and returns what
// they moved: the engine e's counters, the drop counter of its listener's
// socket conn, and what reached rx, the reader of the socket they are for
// (the listener's, or another's when they are not the listener's, ours
// false). First it warms the path up with Initials until one arrives (is
// decided, or reaches rx): the first datagrams to a new neighbour wait for
// it, and beyond a few are lost. Then it waits until every datagram is
// decided (ours) or received, hostWait at the most, and a moment longer
// for any decided twice.
func exchange(t *testing.T, e Engine, conn *net.UDPConn, rx *testutil.Receiver, p path, junkN, initials int,
	ours bool) counted {
	t.Helper()
	read := func() counted {
		t.Helper()
		c, err := readCounts(e, conn)
		if err != nil {
			t.Fatal(err)
		}
		c.received = rx.Total()
		return c
	}
	arrived := func(c0, c counted) int {
		if ours {
			return int(c.decided - c0.decided)
		}
		return c.received - c0.received
	}
	warm := testutil.NewInitials(uint64(p.to.Port()))
	c0 := read()
	for deadline := time.Now().Add(hostWait); arrived(c0, read()) == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("nothing sent to %v arrived in %v", p.to, hostWait)
		}
		p.send(t, 1, warm.Next)
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the warm-up's last datagrams
	rx.Drain(t)
	c0 = read()
	p.send(t, junkN, junk())
	p.send(t, initials, testutil.NewInitials(uint64(junkN)).Next)
	sent := junkN + initials
	for deadline := time.Now().Add(hostWait); arrived(c0, read()) < sent && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	rx.Drain(t)
	c := read()
	return counted{sent: sent, decided: c.decided - c0.decided, dropped: c.dropped - c0.dropped,
		invalid: c.invalid - c0.invalid, passed: c.passed - c0.passed, filtered: c.filtered - c0.filtered,
		received: c.received - c0.received}
}

// Where a listener's datagrams must have been decided.
const (
	atXDP    = "xdp"    // the XDP program: the socket's drop counter unmoved
	atSocket = "socket" // the socket filter: it counted every drop
	atEither = ""       // either (it depends on the driver)
)

// checkOnce fails t unless every datagram of c was decided exactly once,
// at least 99% of the junk dropped (junkN sent), and every datagram passed
// reached the listener, decided where at says.
func checkOnce(t *testing.T, c counted, junkN int, at string) {
	t.Helper()
	t.Log(c)
	if c.decided != uint64(c.sent) {
		t.Errorf("%d decisions of %d datagrams sent to the listener, want one each", c.decided, c.sent)
	}
	if c.invalid*100 < uint64(junkN)*99 {
		t.Errorf("%d of %d junk datagrams dropped, want 99%% at least", c.invalid, junkN)
	}
	if uint64(c.received) != c.passed {
		t.Errorf("the listener received %d datagrams, and %d were passed", c.received, c.passed)
	}
	switch at {
	case atXDP:
		if c.filtered != 0 {
			t.Errorf("the listener's socket filter dropped %d datagrams, want none: the XDP program decides them",
				c.filtered)
		}
	case atSocket:
		if c.filtered != c.dropped {
			t.Errorf("the listener's socket filter dropped %d datagrams, want all %d drops: the XDP program "+
				"passes them undecided", c.filtered, c.dropped)
		}
	}
}

// checkNotOurs fails t unless none of c's datagrams was decided and every
// one reached its own socket.
func checkNotOurs(t *testing.T, c counted) {
	t.Helper()
	t.Log(c)
	if c.decided != 0 || c.dropped != 0 {
		t.Errorf("%d decisions (%d drops) of datagrams that are not the listener's, want none", c.decided, c.dropped)
	}
	if c.received != c.sent {
		t.Errorf("%d of %d datagrams reached their socket, want every one", c.received, c.sent)
	}
}

// protect has e protect conn, in ns, and fails t on an error.
func protect(t *testing.T, ns *testutil.NetNS, e Engine, conn *net.UDPConn) {
	t.Helper()
	var err error
	ns.Do(t, func() { err = e.Protect(conn, nil) })
	if err != nil {
		t.Fatalf("protecting %v: %v", conn.LocalAddr(), err)
	}
}

// xdpReport is the engine's report of its interfaces, by name.
func xdpReport(e Engine) map[string]report.XDPInterface {
	out := map[string]report.XDPInterface{}
	for _, x := range e.(xdpReporter).XDPInterfaces() {
		out[x.Name] = x
	}
	return out
}

// iface is an interface as a test expects the report and ip link to show
// it: attach (report.XDPNative, XDPGeneric or XDPSocketFilterOnly), left
// out by default, and a part of the reason.
type iface struct {
	name, attach string
	leftOut      bool
	reason       string
}

// checkInterfaces fails t unless e reports exactly want, and ip link shows
// the program on ns's interfaces as the report does.
func checkInterfaces(t *testing.T, ns *testutil.NetNS, e Engine, want []iface) {
	t.Helper()
	got := xdpReport(e)
	for _, w := range want {
		x, ok := got[w.name]
		if !ok {
			t.Errorf("the report leaves out %s: %+v", w.name, got)
			continue
		}
		delete(got, w.name)
		if x.Attach != w.attach || x.LeftOut != w.leftOut || !strings.Contains(x.Reason, w.reason) {
			t.Errorf("%s reported %s, left out %v (%q), want %s, left out %v (%q)", w.name, x.Attach, x.LeftOut, x.Reason,
				w.attach, w.leftOut, w.reason)
		}
		shown := map[string]string{report.XDPNative: "xdp", report.XDPGeneric: "xdpgeneric"}[w.attach]
		if on := xdpOn(t, ns, w.name); on != shown {
			t.Errorf("ip link shows %q on %s, want %q", on, w.name, shown)
		}
	}
	for name, x := range got {
		t.Errorf("the report lists %s too: %+v", name, x)
	}
}

// redirect adds to ns a rule that redirects UDP to port from to port to
// (nft, or ip6tables without it), as a host does for Caddy on an
// unprivileged port.
func redirect(t *testing.T, ns *testutil.NetNS, from, to uint16) {
	t.Helper()
	var cmd *exec.Cmd
	if _, err := exec.LookPath("nft"); err == nil {
		cmd = exec.Command("ip", "netns", "exec", ns.Name(), "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(fmt.Sprintf("table ip6 rl45 {\n chain prerouting {\n"+
			"  type nat hook prerouting priority dstnat;\n  udp dport %d redirect to :%d\n }\n}\n", from, to))
	} else if _, err := exec.LookPath("ip6tables"); err == nil {
		cmd = exec.Command("ip", "netns", "exec", ns.Name(), "ip6tables", "-t", "nat", "-A", "PREROUTING", "-p", "udp",
			"--dport", fmt.Sprint(from), "-j", "REDIRECT", "--to-ports", fmt.Sprint(to))
	} else {
		testutil.SkipOrFail(t, "a port redirect needs nft or ip6tables")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redirecting port %d to %d: %v: %s", from, to, err, out)
	}
}

// TestXDPPortRedirect: the review's finding 4. With a rule that redirects
// port 443 to the listener's (8443), a junk flood and valid Initials to
// port 443 are each decided once, by the socket filter (the XDP program
// saw port 443, no listener's, and passed them unrecorded), the junk all
// dropped, the Initials delivered; the same sent to 8443 straight are each
// decided once by the XDP program, the junk dropped there. So are they from
// the source port that reached port 443 before: netfilter gives that flow
// another source port (its reply would be the redirected flow's), which
// the XDP program, before netfilter, did not see.
func TestXDPPortRedirect(t *testing.T) {
	onXDPHost(t, func(t *testing.T, h xdpHost) {
		h.server.Link(t, h.client, "rl45", []string{"fd00:45:1::1/64"}, []string{"fd00:45:1::2/64"})
		redirect(t, h.server, 443, hostPort)
		conn := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort))
		e := openHost(t, h, Options{})
		protect(t, h.server, e, conn)
		checkInterfaces(t, h.server, e, []iface{{name: "rl45", attach: report.XDPNative}})
		rx := testutil.Receive(conn)
		var redirected, straight *net.UDPConn
		h.client.Do(t, func() {
			redirected = testutil.Sender(t, ap("[fd00:45:1::2]:0"))
			straight = testutil.Sender(t, ap("[fd00:45:1::2]:0"))
		})
		tests := []struct {
			name string
			from *net.UDPConn
			port uint16
			at   string
			// moved: netfilter gives the datagrams another source
			// port, so that the listener receives none from from's.
			moved bool
		}{
			{"to 443, redirected: the socket filter decides", redirected, 443, atSocket, false},
			{"to 8443: the XDP program decides", straight, hostPort, atXDP, false},
			{"to 8443 from the port redirected before: netfilter changes it", redirected, hostPort, atXDP, true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				src := tt.from.LocalAddr().(*net.UDPAddr).AddrPort()
				before := rx.Received(src)
				p := udpPath(t, tt.from, netip.AddrPortFrom(netip.MustParseAddr("fd00:45:1::1"), tt.port))
				c := exchange(t, e, conn, rx, p, hostJunk, hostInitials, true)
				checkOnce(t, c, hostJunk, tt.at)
				if c.passed != hostInitials {
					t.Errorf("%d of the %d valid Initials passed", c.passed, hostInitials)
				}
				if moved := rx.Received(src) == before; moved != tt.moved {
					t.Errorf("the listener received the Initials from another source port than %v: %v, want %v",
						src, moved, tt.moved)
				}
			})
		}
	})
}

// TestXDPTun: a tun device (IP packets without an Ethernet header, which
// the XDP program would misread): named in xdp_interfaces beside the
// veth, it is refused (socket filter only, with the reason) and the veth
// runs the program; chosen by default, it is left out; in mode auto with
// the tun alone named, the limiter falls back to the socket filter (mode
// bpf), as it does for an interface the kernel refuses. Datagrams written
// to the tun's file to the server's address there are each decided once,
// by the socket filter; those across the veth by the XDP program.
func TestXDPTun(t *testing.T) {
	onXDPHost(t, func(t *testing.T, h xdpHost) {
		h.server.Link(t, h.client, "rl45", []string{"fd00:45:1::1/64"}, []string{"fd00:45:1::2/64"})
		var from *net.UDPConn
		h.client.Do(t, func() { from = testutil.Sender(t, ap("[fd00:45:1::2]:0")) })
		tun := tunPath(t, h.server, "rl45u", hostPort)
		veth := udpPath(t, from, ap("[fd00:45:1::1]:8443"))
		tests := []struct {
			name string
			o    Options
			want []iface
		}{
			{"named", Options{XDPInterfaces: []string{"rl45", "rl45u"}}, []iface{
				{name: "rl45", attach: report.XDPNative},
				{name: "rl45u", attach: report.XDPSocketFilterOnly,
					reason: "xdp_interfaces: rl45u: its frames have no Ethernet header"}}},
			{"by default", Options{}, []iface{
				{name: "rl45", attach: report.XDPNative},
				{name: "rl45u", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "no Ethernet header"}}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				conn := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort))
				e := openHost(t, h, tt.o)
				protect(t, h.server, e, conn)
				checkInterfaces(t, h.server, e, tt.want)
				rx := testutil.Receive(conn)
				t.Run("through the tun", func(t *testing.T) {
					checkOnce(t, exchange(t, e, conn, rx, tun, hostJunk, hostInitials, true), hostJunk, atSocket)
				})
				t.Run("across the veth", func(t *testing.T) {
					checkOnce(t, exchange(t, e, conn, rx, veth, hostJunk, hostInitials, true), hostJunk, atXDP)
				})
			})
		}
		t.Run("mode auto, the tun alone named", func(t *testing.T) {
			conn := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort))
			core, logs := observer.New(zapcore.InfoLevel)
			var l *Limiter
			var err error
			h.server.Do(t, func() {
				l, err = NewWith("auto-tun", Setting{Config: hostConfig(), Mode: ModeAuto,
					Options: Options{XDPInterfaces: []string{"rl45u"}}, Logger: zap.New(core)})
				testutil.RequireBPF(t, err)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				if _, _, err := l.Attach(conn); err != nil {
					t.Fatal(err)
				}
			})
			if l.Mode() != ModeBPF {
				t.Errorf("mode auto whose XDP program runs on none of the listener's interfaces runs %s, want bpf", l.Mode())
			}
			warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
			if len(warns) != 1 ||
				!strings.Contains(fmt.Sprint(warns[0].ContextMap()["reason"]), "rl45u: its frames have no Ethernet header") {
				t.Errorf("warnings %+v, want one that gives the tun's refusal as the reason", warns)
			}
			rx := testutil.Receive(conn)
			checkOnce(t, exchange(t, l.Engine(), conn, rx, tun, hostJunk, hostInitials, true), hostJunk, atSocket)
		})
	})
}

// TestXDPBridge: a bridge with the veth as its port and the server's
// address on the bridge. Both named under xdp_generic, the program runs
// on both (stacked: a datagram meets it twice), and each datagram is
// decided once: by the run on the port, the run on the bridge passing what
// it recorded; the junk dropped at the port. By default both are left out
// (a bridge, a port of it), and the socket filter decides each datagram
// once.
func TestXDPBridge(t *testing.T) {
	onXDPHost(t, func(t *testing.T, h xdpHost) {
		h.server.Link(t, h.client, "rl45", nil, []string{"fd00:45:3::2/64"})
		h.server.IP(t, "link add rl45b type bridge forward_delay 0", "link set rl45 master rl45b", "link set rl45b up",
			"addr add fd00:45:3::1/64 dev rl45b nodad")
		var from *net.UDPConn
		h.client.Do(t, func() { from = testutil.Sender(t, ap("[fd00:45:3::2]:0")) })
		p := udpPath(t, from, ap("[fd00:45:3::1]:8443"))
		tests := []struct {
			name    string
			o       Options
			want    []iface
			stacked bool
			at      string
		}{
			{"both named, generic", Options{XDPInterfaces: []string{"rl45", "rl45b"}, XDPGeneric: true}, []iface{
				{name: "rl45", attach: report.XDPGeneric},
				{name: "rl45b", attach: report.XDPGeneric}}, true, atXDP},
			{"by default", Options{}, []iface{
				{name: "rl45", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a port of rl45b"},
				{name: "rl45b", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a bridge"}}, false, atSocket},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				conn := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort))
				e := openHost(t, h, tt.o)
				protect(t, h.server, e, conn)
				checkInterfaces(t, h.server, e, tt.want)
				e.mu.Lock()
				stacked := e.stacked
				e.mu.Unlock()
				if stacked != tt.stacked {
					t.Errorf("the program is told it runs stacked: %v, want %v", stacked, tt.stacked)
				}
				rx := testutil.Receive(conn)
				c := exchange(t, e, conn, rx, p, hostJunk, hostInitials, true)
				checkOnce(t, c, hostJunk, tt.at)
				if c.passed != hostInitials {
					t.Errorf("%d of the %d valid Initials passed", c.passed, hostInitials)
				}
			})
		}
	})
}

// addVLAN adds to ns the VLAN vid on its interface parent, called name,
// up, with addr; it skips t where the kernel has no 802.1Q (a kernel
// built without CONFIG_VLAN_8021Q: "Unknown device type"), a kernel's
// limit, not a missing privilege or tool.
func addVLAN(t *testing.T, ns *testutil.NetNS, parent, name string, vid int, addr string) {
	t.Helper()
	err := ns.Run(fmt.Sprintf("link add link %s name %s type vlan id %d", parent, name, vid))
	if err != nil && strings.Contains(err.Error(), "Unknown device type") {
		t.Skipf("this kernel has no 802.1Q VLAN devices (CONFIG_VLAN_8021Q): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	ns.IP(t, "link set "+name+" up", fmt.Sprintf("addr add %s dev %s nodad", addr, name))
}

// TestXDPVLAN: VLAN-tagged traffic, with the program on the veth by default.
// A VLAN device (left out) carries the server's address: over it, each
// datagram is decided once, at the XDP program where the veth hands it the
// frame untagged (the tag offloaded to the packet's metadata) or at the
// socket where the tag is in the frame. Frames whose 802.1Q tag is in the
// frame pass the XDP program undecided and are decided once by the socket
// filter: VLAN 7 to the VLAN device, and a priority tag (VLAN 0), which the
// stack takes as untagged, to the veth's own address (this one runs on a
// kernel without 802.1Q devices too).
func TestXDPVLAN(t *testing.T) {
	onXDPHost(t, func(t *testing.T, h xdpHost) {
		h.server.Link(t, h.client, "rl45", []string{"fd00:45:1::1/64"}, []string{"fd00:45:1::2/64"})
		serverMAC := macOf(t, h.server, "rl45")
		tests := []struct {
			name string
			vlan bool // needs VLAN 7's devices
			path func(t *testing.T) path
			at   string
		}{
			{"a VLAN device", true, func(t *testing.T) path {
				var from *net.UDPConn
				h.client.Do(t, func() { from = testutil.Sender(t, ap("[fd00:45:4::2]:0")) })
				return udpPath(t, from, ap("[fd00:45:4::1]:8443"))
			}, atEither},
			{"VLAN 7's tag in the frame", true, func(t *testing.T) path {
				return taggedPath(t, h.client, "rl45", serverMAC, 7, ap("[fd00:45:4::2]:40007"), ap("[fd00:45:4::1]:8443"))
			}, atSocket},
			{"a priority tag in the frame (VLAN 0)", false, func(t *testing.T) path {
				return taggedPath(t, h.client, "rl45", serverMAC, 0, ap("[fd00:45:1::2]:40000"), ap("[fd00:45:1::1]:8443"))
			}, atSocket},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				want := []iface{{name: "rl45", attach: report.XDPNative}}
				if tt.vlan {
					addVLAN(t, h.server, "rl45", "rl45.7", 7, "fd00:45:4::1/64")
					addVLAN(t, h.client, "rl45", "rl45.7", 7, "fd00:45:4::2/64")
					t.Cleanup(func() {
						h.server.Run("link del rl45.7")
						h.client.Run("link del rl45.7")
					})
					want = append(want, iface{name: "rl45.7", attach: report.XDPSocketFilterOnly, leftOut: true,
						reason: "a VLAN"})
				}
				conn := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort))
				e := openHost(t, h, Options{})
				protect(t, h.server, e, conn)
				checkInterfaces(t, h.server, e, want)
				rx := testutil.Receive(conn)
				c := exchange(t, e, conn, rx, tt.path(t), hostJunk, hostInitials, true)
				checkOnce(t, c, hostJunk, tt.at)
				if c.passed != hostInitials {
					t.Errorf("%d of the %d valid Initials passed", c.passed, hostInitials)
				}
			})
		}
	})
}

// sysctl sets the network sysctl name ("net/ipv6/conf/all/forwarding") of
// namespace ns to value.
func sysctl(t *testing.T, ns *testutil.NetNS, name, value string) {
	t.Helper()
	ns.Do(t, func() {
		if err := os.WriteFile("/proc/sys/"+name, []byte(value+"\n"), 0); err != nil {
			t.Fatalf("setting %s: %v", name, err)
		}
	})
}

// TestXDPNotOurs: the review's finding 5. A wildcard listener's XDP
// program decides only what is the listener's: datagrams to its port that
// the server forwards to a routed destination (a third namespace), that a
// macvlan child of its veth takes into another namespace, or that another
// socket bound to one of the server's addresses on the port receives
// (bound before the listener was protected: the engine reads it in
// /proc/net/udp6) pass untouched, none decided, each reaching its socket;
// what is sent to the listener's own address is decided, once, by the XDP
// program.
func TestXDPNotOurs(t *testing.T) {
	onXDPHost(t, func(t *testing.T, h xdpHost) {
		// A router forwards; its interfaces' link-local addresses, the
		// source of its neighbour solicitations for what it forwards,
		// usable at once (without duplicate address detection, a
		// second or two).
		sysctl(t, h.server, "net/ipv6/conf/all/forwarding", "1")
		sysctl(t, h.server, "net/ipv6/conf/default/accept_dad", "0")
		h.server.Link(t, h.client, "rl45c", []string{"fd00:45:5::1/64", "fd00:45:5::4/64"}, []string{"fd00:45:5::2/64"})
		h.server.Link(t, h.far, "rl45f", []string{"fd00:45:6::1/64"}, []string{"fd00:45:6::2/64"})
		h.client.IP(t, "route add fd00:45:6::/64 via fd00:45:5::1")
		h.server.IP(t, "link add rl45m link rl45c type macvlan mode bridge", "link set rl45m netns "+h.far.Name())
		h.far.IP(t, "link set rl45m up", "addr add fd00:45:5::3/64 dev rl45m nodad")

		conn := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort))
		other := listenHost(t, h.server, fmt.Sprintf("[fd00:45:5::4]:%d", hostPort))
		routed := listenHost(t, h.far, fmt.Sprintf("[fd00:45:6::2]:%d", hostPort))
		child := listenHost(t, h.far, fmt.Sprintf("[fd00:45:5::3]:%d", hostPort))
		e := openHost(t, h, Options{})
		protect(t, h.server, e, conn)
		checkInterfaces(t, h.server, e, []iface{{name: "rl45c", attach: report.XDPNative},
			{name: "rl45f", attach: report.XDPNative}})
		e.mu.Lock()
		targets := slices.Clone(e.table.addrs)
		e.mu.Unlock()
		if slices.Contains(targets, ap("[fd00:45:5::4]:8443")) || !slices.Contains(targets, ap("[fd00:45:5::1]:8443")) {
			t.Errorf("the program decides for %v: want [fd00:45:5::1]:8443 and not [fd00:45:5::4]:8443, another "+
				"socket's", targets)
		}
		var from *net.UDPConn
		h.client.Do(t, func() { from = testutil.Sender(t, ap("[fd00:45:5::2]:0")) })
		tests := []struct {
			name string
			to   netip.AddrPort
			at   *net.UDPConn
			ours bool
		}{
			{"forwarded to a routed destination", ap("[fd00:45:6::2]:8443"), routed, false},
			{"a macvlan child's, in another namespace", ap("[fd00:45:5::3]:8443"), child, false},
			{"another socket's address", ap("[fd00:45:5::4]:8443"), other, false},
			{"the listener's own address", ap("[fd00:45:5::1]:8443"), conn, true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				rx := testutil.Receive(tt.at)
				defer rx.Stop(t)
				c := exchange(t, e, conn, rx, udpPath(t, from, tt.to), hostJunk, hostInitials, tt.ours)
				if tt.ours {
					checkOnce(t, c, hostJunk, atXDP)
				} else {
					checkNotOurs(t, c)
				}
			})
		}
	})
}

// TestXDPDockerHost: mode xdp on a wildcard listener, on a host with a
// bridge without ports (docker0), a bridge with a container's veth as its
// port, a macvlan child, a tap and a tun device, and a VLAN where the
// kernel has them. The limiter attaches without an error; the program runs
// on the veth alone; the others are reported socket filter only, left out,
// each with its reason, in one INFO line (a second listener logs it no
// more), and no WARN line. The listener is protected on every path:
// across the veth each datagram is decided once at the XDP program, from
// the container once by the socket filter.
func TestXDPDockerHost(t *testing.T) {
	onXDPHost(t, func(t *testing.T, h xdpHost) {
		h.server.Link(t, h.client, "rl45", []string{"fd00:45:1::1/64"}, []string{"fd00:45:1::2/64"})
		h.server.IP(t, "link add rl45d type bridge", "link set rl45d up", "addr add fd00:45:7::1/64 dev rl45d nodad")
		h.server.Link(t, h.far, "rl45p", nil, []string{"fd00:45:8::2/64"})
		h.server.IP(t, "link add rl45b type bridge forward_delay 0", "link set rl45p master rl45b", "link set rl45b up",
			"addr add fd00:45:8::1/64 dev rl45b nodad",
			"link add rl45m link rl45 type macvlan mode bridge", "link set rl45m up",
			"tuntap add rl45t mode tap", "link set rl45t up", "tuntap add rl45u mode tun", "link set rl45u up")
		want := []iface{
			{name: "rl45", attach: report.XDPNative},
			{name: "rl45d", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a bridge"},
			{name: "rl45b", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a bridge"},
			{name: "rl45p", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a port of rl45b"},
			{name: "rl45m", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a macvlan child"},
			{name: "rl45t", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a tap device"},
			{name: "rl45u", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "no Ethernet header"},
		}
		err := h.server.Run("link add link rl45 name rl45.9 type vlan id 9", "link set rl45.9 up")
		switch {
		case err == nil:
			want = append(want, iface{name: "rl45.9", attach: report.XDPSocketFilterOnly, leftOut: true, reason: "a VLAN"})
		case strings.Contains(err.Error(), "Unknown device type"):
			t.Logf("no VLAN: this kernel has no 802.1Q VLAN devices: %v", err)
		default:
			t.Fatal(err)
		}

		conn := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort))
		second := listenHost(t, h.server, fmt.Sprintf("[::]:%d", hostPort+1))
		core, logs := observer.New(zapcore.InfoLevel)
		var l *Limiter
		h.server.Do(t, func() {
			var err error
			l, err = NewWith("docker-host", Setting{Config: hostConfig(), Mode: ModeXDP, Logger: zap.New(core)})
			testutil.RequireBPF(t, err)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			for _, c := range []*net.UDPConn{conn, second} {
				if _, attached, err := l.Attach(c); err != nil || !attached {
					t.Fatalf("attaching to %v: attached %v, %v", c.LocalAddr(), attached, err)
				}
			}
		})
		if l.Mode() != ModeXDP {
			t.Fatalf("mode xdp runs %s", l.Mode())
		}
		e := l.Engine()
		checkInterfaces(t, h.server, e, want)
		infos := logs.FilterMessageSnippet("not put on these interfaces by default").All()
		if len(infos) != 1 || infos[0].Level != zapcore.InfoLevel {
			t.Errorf("%d lines say which interfaces are left out (%+v), want one, at INFO", len(infos), infos)
		} else {
			listed := infos[0].ContextMap()["interfaces"]
			for _, w := range want[1:] {
				if !strings.Contains(fmt.Sprint(listed), w.name+" (") {
					t.Errorf("the INFO line lists %v, without %s", listed, w.name)
				}
			}
		}
		if warns := logs.FilterLevelExact(zapcore.WarnLevel).All(); len(warns) != 0 {
			t.Errorf("WARN lines %+v, want none", warns)
		}

		rx := testutil.Receive(conn)
		var client, container *net.UDPConn
		h.client.Do(t, func() { client = testutil.Sender(t, ap("[fd00:45:1::2]:0")) })
		h.far.Do(t, func() { container = testutil.Sender(t, ap("[fd00:45:8::2]:0")) })
		t.Run("across the veth", func(t *testing.T) {
			p := udpPath(t, client, ap("[fd00:45:1::1]:8443"))
			checkOnce(t, exchange(t, e, conn, rx, p, hostJunk, hostInitials, true), hostJunk, atXDP)
		})
		t.Run("from the container, through the bridge", func(t *testing.T) {
			p := udpPath(t, container, ap("[fd00:45:8::1]:8443"))
			checkOnce(t, exchange(t, e, conn, rx, p, hostJunk, hostInitials, true), hostJunk, atSocket)
		})
	})
}
