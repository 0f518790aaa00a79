//go:build linux

package prefilter

import (
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// sendAll sends each payload, from the senders in turn, to the listener's
// port on loopback at a pace the receiver keeps up with, and returns what
// the listener received, by payload.
func sendAll(t *testing.T, ln *net.UDPConn, from []*net.UDPConn, payloads [][]byte) map[string]int {
	t.Helper()
	got := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, err := ln.Read(buf)
			if err != nil {
				return
			}
			got[string(buf[:n])]++
		}
	}()
	port := testutil.PortOf(ln)
	for i, p := range payloads {
		s := from[i%len(from)]
		la := s.LocalAddr().(*net.UDPAddr).AddrPort()
		if _, err := s.WriteToUDPAddrPort(p, testutil.LoopbackFor(la.Addr(), port)); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			time.Sleep(time.Millisecond) // about 50,000 a second at most
		}
	}
	time.Sleep(300 * time.Millisecond)
	ln.SetReadDeadline(time.Now())
	<-done
	ln.SetReadDeadline(time.Time{})
	return got
}

func keyOf(p []byte) string { return string(p) }

// TestKernelDropsInvalid attaches the stateless program to a dual-stack
// socket and sends it valid and invalid datagrams from IPv4 and IPv6
// loopback: without sampling every invalid one is dropped in the kernel and
// every valid one arrives; with sampling about one in 2^SampleShift of the
// invalid ones arrives (at a shift of 6, which gives enough samples in 4,000
// datagrams to tell the sample's size from none or all).
func TestKernelDropsInvalid(t *testing.T) {
	blocked := quicclass.DefaultBlockedPorts()
	valid := [][]byte{
		quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200),
		quicclasstest.LongHeader(quicclass.Version2, 1, 8, 8, 1250),
		quicclasstest.LongHeader(quicclass.Version1, 2, 4, 4, 100),
		quicclasstest.LongHeader(0x1a2a3a4a, 0, 8, 8, 1300),
		quicclasstest.ShortHeader(21),
		quicclasstest.ShortHeader(400),
	}
	invalid := [][]byte{
		{},
		quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1199),
		quicclasstest.LongHeader(quicclass.Version1, 3, 8, 8, 1200),
		quicclasstest.LongHeader(quicclass.Version1, 2, 21, 4, 100),
		quicclasstest.LongHeader(quicclass.Version1, 2, 4, 21, 100),
		quicclasstest.LongHeader(0, 0, 8, 8, 1200),
		quicclasstest.LongHeader(0x1a2a3a4a, 0, 8, 8, 1199),
		quicclasstest.LongHeader(quicclass.Version1, 2, 20, 20, 30),
		quicclasstest.ShortHeader(20),
		{0x00, 0x01, 0x02},
	}
	for _, b := range valid {
		if c, r := quicclass.Classify(blocked, 50000, b, len(b)); c == quicclass.Invalid {
			t.Fatalf("valid datagram % x is %v", b[:8], r)
		}
	}
	for _, b := range invalid {
		if c, _ := quicclass.Classify(blocked, 50000, b, len(b)); c != quicclass.Invalid {
			t.Fatalf("invalid datagram % x is %v", b, c)
		}
	}
	for _, tt := range []struct {
		name  string
		shift uint8
	}{{"every invalid datagram", 0}, {"sampled", 6}} {
		t.Run(tt.name, func(t *testing.T) {
			ln := testutil.Listen(t, "udp", "[::]:0")
			p, err := Build(Spec{Classify: true, BlockedPorts: blocked, SampleShift: tt.shift})
			if err != nil {
				t.Fatal(err)
			}
			if err := Attach(ln, p.Raw); err != nil {
				t.Fatal(err)
			}
			from := []*net.UDPConn{testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0")),
				testutil.Sender(t, netip.MustParseAddrPort("[::1]:0"))}
			rounds := 1
			if tt.shift > 0 {
				rounds = 400
			}
			var payloads [][]byte
			for range rounds {
				payloads = append(payloads, invalid...)
			}
			payloads = append(payloads, valid...)
			got := sendAll(t, ln, from, payloads)
			for _, b := range valid {
				if got[keyOf(b)] != 1 {
					t.Errorf("valid datagram % x arrived %d times, want 1", b[:8], got[keyOf(b)])
				}
				delete(got, keyOf(b))
			}
			arrived := 0
			for _, n := range got {
				arrived += n
			}
			sent := rounds * len(invalid)
			want := sent >> tt.shift
			if tt.shift == 0 {
				want = 0
			}
			// The sample is binomial: within six standard deviations.
			if slack := 6 * isqrt(want); arrived < want-slack || arrived > want+slack {
				t.Errorf("%d of %d invalid datagrams arrived, want %d±%d", arrived, sent, want, slack)
			}
			t.Logf("%d of %d invalid datagrams arrived", arrived, sent)
			// The kernel counts a socket filter's drops among the
			// socket's (with any overflow of its receive queue).
			_, _, drops, err := backlog.ReadSockets([]*net.UDPConn{ln})
			if err != nil {
				t.Fatal(err)
			}
			if drops < uint64(sent-arrived) {
				t.Errorf("the socket counts %d drops, the filter made %d", drops, sent-arrived)
			}
		})
	}
}

func isqrt(n int) int {
	r := 1
	for r*r < n {
		r++
	}
	return r
}

// TestKernelEnforcesRules attaches a program with a rule for one source
// (drop one in two) and one for another source's port (drop all) and sends
// valid short headers from three sources.
func TestKernelEnforcesRules(t *testing.T) {
	ln := testutil.Listen(t, "udp", "[::]:0")
	half := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	all := testutil.Sender(t, netip.MustParseAddrPort("[::1]:0"))
	free := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.3:0"))
	port := testutil.PortOf(ln)
	allPort := testutil.PortOf(all)
	p, err := Build(Spec{Classify: true, BlockedPorts: quicclass.DefaultBlockedPorts(), Rules: []Rule{
		{Family: sketch.IPv4, Words: [4]uint32{0x7f000002}, Bits: 32, DstPort: port, MatchDstPort: true, Form: ShortForm, Drop: 0.5},
		{Family: sketch.IPv6, Words: [4]uint32{0, 0, 0, 1}, Bits: 128, SrcPort: allPort, MatchSrcPort: true, Form: ShortForm, Drop: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Attach(ln, p.Raw); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	var payloads [][]byte
	senders := []*net.UDPConn{half, all, free}
	for i := range 3 * n {
		b := quicclasstest.ShortHeader(100)
		b[1] = byte(i % 3) // which sender
		payloads = append(payloads, b)
	}
	got := sendAll(t, ln, senders, payloads)
	count := func(s int) int {
		b := quicclasstest.ShortHeader(100)
		b[1] = byte(s)
		return got[keyOf(b)]
	}
	if c := count(0); c < n/2-6*isqrt(n/4) || c > n/2+6*isqrt(n/4) {
		t.Errorf("the half-dropped source delivered %d of %d", c, n)
	}
	if c := count(1); c != 0 {
		t.Errorf("the dropped source port delivered %d of %d", c, n)
	}
	if c := count(2); c != n {
		t.Errorf("the free source delivered %d of %d", c, n)
	}
	// Replacing the program works while the socket runs, and detaching
	// lets everything through.
	if err := Detach(ln); err != nil {
		t.Fatal(err)
	}
	if err := Detach(ln); err != nil {
		t.Errorf("detaching twice: %v", err)
	}
}

// TestKernelTakesLargestProgram attaches the largest program Build makes:
// rules of several forms, and the shed.
func TestKernelTakesLargestProgram(t *testing.T) {
	var rules []Rule
	forms := []Form{ShortForm, EstablishedForm, AnsweringForm}
	for i := range 2000 {
		rules = append(rules, Rule{Family: sketch.IPv6, Words: [4]uint32{0xfd000000, uint32(i), 0, 1}, Bits: 128,
			SrcPort: uint16(2000 + i), MatchSrcPort: true, DstPort: 443, MatchDstPort: true, Form: forms[i%len(forms)], Drop: 0.5})
	}
	var allow []netip.Prefix
	for i := range 60 {
		allow = append(allow, netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 1, byte(i), 15: 1}), 64))
	}
	p, err := Build(Spec{Classify: true, BlockedPorts: quicclass.DefaultBlockedPorts(), Allow: allow, Rules: rules, Shed: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	ln := testutil.Listen(t, "udp", "[::]:0")
	if err := Attach(ln, p.Raw); err != nil {
		t.Fatalf("%d instructions: %v", p.Len(), err)
	}
	t.Logf("attached %d instructions, %d rules", p.Len(), p.Rules)
}

// unprivilegedTests are the tests the unprivileged children run.
const unprivilegedTests = "^(TestUnprivilegedChild|TestKernelDropsInvalid|TestKernelEnforcesRules|TestKernelTakesLargestProgram)$"

// TestUnprivilegedChild runs only in TestWithoutPrivileges's children and
// asserts that they lack CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN and
// CAP_NET_ADMIN.
func TestUnprivilegedChild(t *testing.T) {
	if os.Getenv(testutil.Unprivileged) == "" {
		t.Skip("runs in TestWithoutPrivileges's children")
	}
	caps := testutil.EffectiveCaps(t)
	for name, c := range map[string]uint{"CAP_NET_ADMIN": unix.CAP_NET_ADMIN, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN,
		"CAP_PERFMON": unix.CAP_PERFMON, "CAP_BPF": unix.CAP_BPF} {
		if caps>>c&1 != 0 {
			t.Errorf("the child has %s (CapEff %#x)", name, caps)
		}
	}
}

// TestWithoutPrivileges runs the socket tests again as nobody with no
// capability, and as root without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN:
// a classic filter on one's own socket needs none.
func TestWithoutPrivileges(t *testing.T) {
	if os.Getenv(testutil.Unprivileged) != "" {
		t.Skip("already a child")
	}
	testutil.RequireRoot(t)
	testutil.RerunUnprivileged(t, "prefilter.test", unprivilegedTests, []string{"bpf", "perfmon", "sys_admin", "net_admin"},
		[]string{"TestUnprivilegedChild", "TestKernelDropsInvalid", "TestKernelEnforcesRules", "TestKernelTakesLargestProgram"})
}
