//go:build linux

package kernel

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// Real sockets see the packet differently from BPF_PROG_TEST_RUN (skb->data
// at the UDP header, not the IP header), so the filter is tested on them
// too. Every test here sends only to loopback addresses or to ULA addresses
// inside a network namespace it creates, and every flood is bounded.

// touchedCells returns the indexes of the sketch cells that have been used.
func touchedCells(lines []sketch.Line) []int {
	var out []int
	for i, l := range lines {
		for j, c := range l.Cells {
			if c.Epoch != 0 {
				out = append(out, i*sketch.CellsPerLine+j)
			}
		}
	}
	return out
}

// TestSocketProbes attaches the filter to IPv4, dual-stack and IPv6 sockets
// and sends probes of every payload size from many source addresses and
// ports across the whole range. At a limit no sender reaches, every probe
// must arrive; and the cells the filter touched must be exactly those the Go
// limiter touches for the expected keys, which proves that the filter read
// each packet's address and ports right on a real socket.
func TestSocketProbes(t *testing.T) {
	sizes := []int{0, 1, 7, 8, 35, 36, 64, 1200, 1350}
	ports := []uint16{1, 53, 443, 1023, 1024, 4433, 32767, 32768, 49152, 60999, 65535}
	tests := []struct {
		name    string
		network string
		listen  string
		sources []string
	}{
		{"ipv4 socket", "udp4", "127.0.0.1:0", []string{"127.0.0.1", "127.0.0.2", "127.1.2.3", "127.255.0.9"}},
		{"dual-stack socket", "udp", "[::]:0", []string{"127.0.0.1", "127.3.4.5", "::1"}},
		{"ipv6 socket", "udp6", "[::1]:0", []string{"::1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hk := sketch.SeededHashKey(9)
			c := testutil.Limits(1_000_000)
			f := loadTest(t, c, loadOptions{hashKey: &hk})
			twin, err := sketch.New(c.Limiter, hk)
			if err != nil {
				t.Fatal(err)
			}
			conn := testutil.Listen(t, tt.network, tt.listen)
			if err := f.Attach(conn); err != nil {
				t.Fatal(err)
			}
			dport := uint16(conn.LocalAddr().(*net.UDPAddr).Port)
			r := testutil.Receive(conn)
			sent := 0
			for _, src := range tt.sources {
				for _, port := range ports {
					s, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(src), port)))
					if err != nil {
						continue // port taken on this machine: the others cover the range
					}
					dst := testutil.LoopbackFor(netip.MustParseAddr(src), dport)
					for _, size := range sizes {
						if _, err := s.WriteToUDPAddrPort(make([]byte, size), dst); err != nil {
							t.Fatalf("send from %s:%d: %v", src, port, err)
						}
						sent++
						k := sketch.KeyFrom(netip.AddrPortFrom(netip.MustParseAddr(src), port), dport)
						twin.Decide(&k, int(quicclass.Opening), start, 0)
					}
					s.Close()
				}
			}
			r.Stop(t)
			st, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			var dropped uint64
			for fam := range decide.Families {
				for l := range sketch.MaxLevels {
					dropped += st.Dropped[quicclass.Opening][fam][l]
				}
			}
			if r.Total() != sent || dropped != 0 {
				t.Fatalf("sent %d probes, received %d, filter dropped %d", sent, r.Total(), dropped)
			}
			want := touchedCells(twin.Lines())
			if got := touchedCells(f.lines(t)); !slices.Equal(got, want) {
				t.Fatalf("the filter keyed the probes differently from the Go limiter: cells %v, want %v", got, want)
			}
			t.Logf("%d probes from %d sources, all received", sent, len(tt.sources))
		})
	}
}

// flood sends n packets of random size (0-1350 bytes) from conn to dst at
// about rate packets per second, then stops.
func flood(conn *net.UDPConn, dst netip.AddrPort, rate, n int, rng *rand.Rand) error {
	_, err := stampedFlood(conn, dst, rate, n, rng, time.Time{})
	return err
}

// stampedFlood is flood with each packet stamped with its send time since
// epoch (zero: the flood's start), so that a Receiver counts it in the
// second the filter saw it in; it returns what it sent in each second.
func stampedFlood(conn *net.UDPConn, dst netip.AddrPort, rate, n int, rng *rand.Rand, epoch time.Time) (testutil.Sent, error) {
	buf := make([]byte, 1350)
	return testutil.Flood{From: []*net.UDPConn{conn}, To: dst, Rate: rate, Count: n, Stamp: true, Epoch: epoch,
		Next: func() []byte { return buf[:rng.IntN(len(buf)+1)] }}.Run()
}

// trickle sends one packet every interval until stop is closed.
func trickle(conn *net.UDPConn, dst netip.AddrPort, interval time.Duration, stop <-chan struct{}) (int, error) {
	sent := 0
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		if _, err := conn.WriteToUDPAddrPort([]byte("legit"), dst); err != nil {
			return sent, err
		}
		sent++
		select {
		case <-stop:
			return sent, nil
		case <-tk.C:
		}
	}
}

// TestSocketFlood: on IPv4 and dual-stack sockets, a bounded flood of
// random-size packets is held to the limit, and a 5 pps stream from another
// network beside it loses nothing.
func TestSocketFlood(t *testing.T) {
	const limit, rate, seconds = 200, 5000, 4
	tests := []struct {
		name, network, listen string
		flood, legit          string
	}{
		{"ipv4", "udp4", "127.0.0.1:0", "127.0.0.2", "127.1.0.1"},
		{"dual-stack, ipv4 flood, ipv6 legit", "udp", "[::]:0", "127.0.0.2", "::1"},
		{"dual-stack, ipv6 flood, ipv4 legit", "udp", "[::]:0", "::1", "127.1.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadTest(t, testutil.Limits(limit), loadOptions{})
			conn := testutil.Listen(t, tt.network, tt.listen)
			if err := f.Attach(conn); err != nil {
				t.Fatal(err)
			}
			port := testutil.PortOf(conn)
			floodSrc, legitSrc := netip.MustParseAddr(tt.flood), netip.MustParseAddr(tt.legit)
			fs := testutil.Sender(t, netip.AddrPortFrom(floodSrc, 0))
			ls := testutil.Sender(t, netip.AddrPortFrom(legitSrc, 0))
			r := testutil.Receive(conn)
			stop := make(chan struct{})
			var legitSent int
			var legitErr error
			done := make(chan struct{})
			go func() {
				legitSent, legitErr = trickle(ls, testutil.LoopbackFor(legitSrc, port), 200*time.Millisecond, stop)
				close(done)
			}()
			sent, err := stampedFlood(fs, testutil.LoopbackFor(floodSrc, port), rate, rate*seconds, rand.New(rand.NewPCG(1, 2)), time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			close(stop)
			<-done
			if legitErr != nil {
				t.Fatal(legitErr)
			}
			r.Stop(t)
			testutil.CheckHeld(t, "flood", r.PerSecondFrom(floodSrc), sent.PerSecond, seconds, limit)
			legit := r.ReceivedFrom(legitSrc)
			if legit != legitSent {
				t.Errorf("legit: sent %d, received %d", legitSent, legit)
			}
			t.Logf("flood per second %v; legit %d of %d", r.PerSecondFrom(floodSrc), legit, legitSent)
		})
	}
}

// TestSocketConcurrentFlood floods one address from every CPU at once: the
// sketches are shared, updated without locks, and must still hold the flood.
func TestSocketConcurrentFlood(t *testing.T) {
	const limit, rate, seconds = 200, 4000, 4
	cpus := runtime.NumCPU()
	if cpus < 2 {
		testutil.SkipOrFail(t, "needs two CPUs, have %d", cpus)
	}
	f := loadTest(t, testutil.Limits(limit), loadOptions{})
	conn := testutil.Listen(t, "udp4", "127.0.0.1:0")
	if err := f.Attach(conn); err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddr("127.0.0.7")
	dst := testutil.LoopbackFor(src, testutil.PortOf(conn))
	r := testutil.Receive(conn)
	var wg sync.WaitGroup
	errs := make(chan error, cpus)
	sent := make([]testutil.Sent, cpus)
	epoch := time.Now()
	for cpu := range cpus {
		s := testutil.Sender(t, netip.AddrPortFrom(src, 0))
		wg.Add(1)
		go func() {
			defer wg.Done()
			// On loopback the receive path runs on the sending CPU.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errs <- err
				return
			}
			var err error
			sent[cpu], err = stampedFlood(s, dst, rate/cpus, rate/cpus*seconds, rand.New(rand.NewPCG(uint64(cpu), 3)), epoch)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	r.Stop(t)
	testutil.CheckHeld(t, "flood from every CPU", r.PerSecondFrom(src), testutil.SumSent(sent...).PerSecond, seconds, limit)
	t.Logf("flood from %d CPUs, per second: %v", cpus, r.PerSecondFrom(src))
}

// TestSocketIPv6Prefixes: in a namespace of its own, with ULA addresses on
// loopback, a flood spread over 32 addresses of one /64 is held at the /64
// (level 1, "/64 sport=*"), and one spread over 32 /64s of one /48 at the
// /48 (level 2, "/48 sport=*"); each source alone stays under the limit, and
// a 5 pps stream from another /48 loses nothing.
func TestSocketIPv6Prefixes(t *testing.T) {
	const limit, perSource, seconds = 100, 75, 3
	var in64, in48, addrs []string
	for i := range 32 {
		in64 = append(in64, fmt.Sprintf("fd00:1:2:3::%x", 0x10+i))
		in48 = append(in48, fmt.Sprintf("fd00:1:2:%x::1", 0x100+i))
	}
	for _, a := range append(append([]string{"fd00:1:2:3::1", "fd00:9::5"}, in64...), in48...) {
		addrs = append(addrs, a+"/128")
	}
	ns := testutil.NewNetNS(t, addrs...)
	tests := []struct {
		name    string
		sources []string
		level   int
	}{
		{"one /64", in64, 1},
		{"one /48", in48, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The premise, each source under its limit, holds for a
			// sender that keeps its pace. A loaded machine stalls the
			// sender, which then catches up in a burst that takes some
			// sources over their own limit: the filter counts their
			// survivors in the prefix's limited budget, which has a limit
			// of its own, and more than the limit passes (drops at level
			// 0 show it). That is the machine, not the filter: a filter
			// that did not hold the prefix fails every attempt.
			const attempts = 3
			var errs []string
			for a := range attempts {
				err := ipv6PrefixFlood(t, ns, tt.sources, tt.level, limit, perSource, seconds)
				if err == nil {
					return
				}
				t.Logf("attempt %d: %v", a+1, err)
				errs = append(errs, err.Error())
			}
			t.Errorf("%d attempts: %s", attempts, strings.Join(errs, "; "))
		})
	}
}

// ipv6PrefixFlood runs one attempt of TestSocketIPv6Prefixes: a flood of
// perSource pps from each of sources for seconds, and a trickle from
// fd00:9::5, into a new filter at limit. It reports a flood not held at the
// limit, drops at another level than level, or a lost legit datagram; it
// fails t on an error of the setup.
func ipv6PrefixFlood(t *testing.T, ns *testutil.NetNS, sources []string, level, limit, perSource, seconds int) error {
	t.Helper()
	f := loadTest(t, testutil.Limits(uint32(limit)), loadOptions{})
	var conn, legit *net.UDPConn
	var floods []*net.UDPConn
	ns.Do(t, func() {
		conn = testutil.Listen(t, "udp6", "[fd00:1:2:3::1]:0")
		legit = testutil.Sender(t, netip.MustParseAddrPort("[fd00:9::5]:0"))
		for _, s := range sources {
			floods = append(floods, testutil.Sender(t, netip.AddrPortFrom(netip.MustParseAddr(s), 0)))
		}
	})
	if err := f.Attach(conn); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr("fd00:1:2:3::1"), testutil.PortOf(conn))
	r := testutil.Receive(conn)
	stop := make(chan struct{})
	var legitSent int
	done := make(chan struct{})
	go func() { legitSent, _ = trickle(legit, dst, 200*time.Millisecond, stop); close(done) }()
	// Round robin over the sources, each at perSource pps.
	buf := make([]byte, 100)
	rate := perSource * len(floods)
	sent, err := testutil.Flood{From: floods, To: dst, Rate: rate, Count: rate * seconds, For: time.Duration(seconds) * time.Second,
		Stamp: true, Next: func() []byte { return buf }}.Run()
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-done
	r.Stop(t)
	perSecond := make([]int, seconds)
	for _, s := range sources {
		for sec, c := range r.PerSecondFrom(netip.MustParseAddr(s)) {
			if sec < seconds {
				perSecond[sec] += c
			}
		}
	}
	var bad []string
	if err := testutil.HeldPerSecond(perSecond, sent.PerSecond, seconds, float64(limit)); err != nil {
		bad = append(bad, "flood: "+err.Error())
	}
	legitGot := r.ReceivedFrom(netip.MustParseAddr("fd00:9::5"))
	if legitGot != legitSent {
		bad = append(bad, fmt.Sprintf("legit from another /48: sent %d, received %d", legitSent, legitGot))
	}
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	v6 := decide.FamilyIndex(sketch.IPv6)
	for l, d := range st.Dropped[quicclass.Opening][v6] {
		if (l == level) != (d > 0) {
			bad = append(bad, fmt.Sprintf("dropped by level %v, want drops at level %d only", st.Dropped[quicclass.Opening][v6], level))
			break
		}
	}
	t.Logf("flood per second %v, dropped by level %v, legit %d of %d", perSecond, st.Dropped[quicclass.Opening][v6], legitGot, legitSent)
	if bad != nil {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

// TestLoadWithoutCapBPF runs this test binary again without CAP_BPF and
// CAP_SYS_ADMIN and checks that loading fails with an error that names the
// capability and how to grant it.
func TestLoadWithoutCapBPF(t *testing.T) {
	if os.Getenv("RAKELIMIT_CHILD") == "load" {
		_, err := Load(testutil.Limits(10), nil)
		fmt.Printf("LOAD-RESULT: %v\n", err)
		return
	}
	testutil.RequireRoot(t)
	if v := sysctl("kernel/unprivileged_bpf_disabled"); v == "0" {
		testutil.SkipOrFail(t, "kernel.unprivileged_bpf_disabled=0: any process may load socket filters here")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testutil.SkipOrFail(t, "needs setpriv (util-linux): %v", err)
	}
	cmd := exec.Command(setpriv, "--bounding-set=-bpf,-sys_admin", "--inh-caps=-bpf,-sys_admin",
		os.Args[0], "-test.run=^TestLoadWithoutCapBPF$", "-test.v")
	cmd.Env = append(os.Environ(), "RAKELIMIT_CHILD=load")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	_, result, ok := strings.Cut(string(out), "LOAD-RESULT: ")
	if !ok {
		t.Fatalf("child printed no result:\n%s", out)
	}
	result, _, _ = strings.Cut(result, "\n")
	for _, want := range []string{"operation not permitted", "lacks CAP_BPF", "setcap cap_bpf,cap_perfmon,cap_net_bind_service+p",
		"AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_BIND_SERVICE"} {
		if !strings.Contains(result, want) {
			t.Errorf("error without CAP_BPF = %q, want it to contain %q", result, want)
		}
	}
	t.Logf("without CAP_BPF: %s", result)
}
