//go:build linux

package main

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/quic-go/quic-go"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// The handshakes at 30% loss follow quic-interop-runner's handshakeloss
// case: 50 new connections, each a handshake and a request, with 30% of
// the datagrams lost each way; at least 45 must get the page. This kernel
// has no netem: Caddy and the clients run in two network namespaces joined
// by a veth pair (fd00::/8 addresses), and a BPF program on each end's
// egress (tcx, no qdisc needed) drops 30% of the UDP datagrams over IPv6,
// at random.
const (
	lossPercent    = 30
	lossHandshakes = 50
	lossMinimum    = 45
	// lossParallel handshakes run at a time; lossTimeout bounds each.
	lossParallel = 10
	lossTimeout  = 20 * time.Second
)

// The lossy link's addresses.
var (
	lossServer = netip.MustParseAddr("fd00:6c6f:7373::1")
	lossClient = netip.MustParseAddr("fd00:6c6f:7373::2")
)

// lossLink is the veth pair's name at both ends.
const lossLink = "rkloss"

// lossProgram is a tcx program that drops lossPercent% of the UDP datagrams
// over IPv6 at random and passes everything else (neighbour discovery
// among it).
func lossProgram(t *testing.T) *ebpf.Program {
	t.Helper()
	const (
		ethTypeIPv6  = 0x86dd
		ipv6NextAt   = 14 + 6 // the Ethernet header, then IPv6's next header
		protoUDP     = 17
		tcxPass      = 0
		tcxDrop      = 2
		ethTypeAt    = 12
		percentRange = 100
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "rakelimit_loss",
		Type: ebpf.SchedCLS,
		Instructions: asm.Instructions{
			// LD_ABS reads the packet through the context in R6.
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadAbs(ethTypeAt, asm.Half),
			asm.JNE.Imm(asm.R0, ethTypeIPv6, "pass"),
			asm.LoadAbs(ipv6NextAt, asm.Byte),
			asm.JNE.Imm(asm.R0, protoUDP, "pass"),
			asm.FnGetPrandomU32.Call(),
			asm.Mod.Imm(asm.R0, percentRange),
			asm.JGE.Imm(asm.R0, lossPercent, "pass"),
			asm.Mov.Imm(asm.R0, tcxDrop),
			asm.Return(),
			asm.Mov.Imm(asm.R0, tcxPass).WithSymbol("pass"),
			asm.Return(),
		},
		License: "Dual BSD/GPL",
	})
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatalf("loading the loss program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

// attachLoss attaches prog to the egress of the lossy link's end in ns.
func attachLoss(t *testing.T, ns *testutil.NetNS, prog *ebpf.Program) {
	t.Helper()
	ns.Do(t, func() {
		ifc, err := net.InterfaceByName(lossLink)
		if err != nil {
			t.Fatalf("the lossy link in %s: %v", ns.Name(), err)
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: prog, Attach: ebpf.AttachTCXEgress})
		testutil.RequireBPF(t, err)
		if err != nil {
			t.Fatalf("attaching the loss program in %s: %v", ns.Name(), err)
		}
		t.Cleanup(func() { l.Close() })
	})
}

// checkLoss sends 1,000 datagrams from the client's end to the server's
// and fails t unless about 70% arrive: the loss program works.
func checkLoss(t *testing.T, srv, cli *testutil.NetNS) {
	t.Helper()
	const n = 1000
	var rx, tx *net.UDPConn
	srv.Do(t, func() { rx = testutil.Listen(t, "udp6", netip.AddrPortFrom(lossServer, 0).String()) })
	cli.Do(t, func() { tx = testutil.Sender(t, netip.AddrPortFrom(lossClient, 0)) })
	if err := testutil.Pace(tx, netip.AddrPortFrom(lossServer, testutil.PortOf(rx)), 20_000, n,
		func() []byte { return []byte("loss") }); err != nil {
		t.Fatal(err)
	}
	got := 0
	buf := make([]byte, 64)
	for {
		rx.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := rx.Read(buf); err != nil {
			break
		}
		got++
	}
	if lost := 100 * (n - got) / n; lost < lossPercent-10 || lost > lossPercent+10 {
		t.Fatalf("%d of %d datagrams crossed the lossy link: %d%% lost, want about %d%%", got, n, lost, lossPercent)
	}
	t.Logf("%d of %d datagrams crossed the lossy link", got, n)
}

// handshakeLoss runs the handshakes at 30% loss, quic-go's and ngtcp2's,
// against bin as Caddy in mode.
func handshakeLoss(t *testing.T, bin, mode string) {
	srv, cli := testutil.NewNetNS(t), testutil.NewNetNS(t)
	srv.Link(t, cli, lossLink, []string{lossServer.String() + "/64"}, []string{lossClient.String() + "/64"})
	s := startClientSite(t, bin, mode, srv, cli, lossClient, lossServer.String())
	prog := lossProgram(t)
	attachLoss(t, srv, prog)
	attachLoss(t, cli, prog)
	checkLoss(t, srv, cli)
	// The quic-go clients' sockets, made here: t may fail only in its own
	// goroutine.
	var socks [lossHandshakes]*net.UDPConn
	for i := range socks {
		socks[i] = s.udp(t, lossClient)
	}
	clients := []struct {
		name string
		get  func(t *testing.T, i int) error
	}{
		{"quic-go", func(t *testing.T, i int) error {
			c := newH3Client(t, quicTransport(t, socks[i]), nil,
				&quic.Config{HandshakeIdleTimeout: lossTimeout, MaxIdleTimeout: lossTimeout})
			defer c.rt.Close()
			return c.get(http.MethodGet, s.url(lossServer.String()), lossTimeout)
		}},
		{"ngtcp2", func(t *testing.T, _ int) error {
			timeout := fmt.Sprintf("%ds", int(lossTimeout.Seconds()))
			if r := ngtcp2Get(t, s, lossServer.String(), s.port, lossTimeout, true, "--handshake-timeout="+timeout, "--timeout="+timeout); !r.ok() {
				return fmt.Errorf("ngtcp2 did not get the page: %s", testutil.LastLine([]byte(r.Out)))
			}
			return nil
		}},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "ngtcp2" {
				gtlsclient(t)
			}
			s.expectVerified(t, "ipv6", func() {
				start := time.Now()
				var ok atomic.Int32
				var wg sync.WaitGroup
				sem := make(chan struct{}, lossParallel)
				for i := range lossHandshakes {
					sem <- struct{}{}
					wg.Go(func() {
						defer func() { <-sem }()
						if err := c.get(t, i); err != nil {
							t.Logf("a handshake at %d%% loss failed: %v", lossPercent, err)
							return
						}
						ok.Add(1)
					})
				}
				wg.Wait()
				t.Logf("%s mode, %s: %d of %d handshakes at %d%% loss got the page, in %v",
					mode, c.name, ok.Load(), lossHandshakes, lossPercent, time.Since(start).Round(time.Millisecond))
				if ok.Load() < lossMinimum {
					t.Errorf("%d of %d handshakes at %d%% loss got the page, want %d at least", ok.Load(), lossHandshakes, lossPercent, lossMinimum)
				}
			})
		})
	}
}
