package userspace

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestSocketOptionsThroughConn makes, through the Conn's raw connection, the
// calls quic-go makes on Linux to choose its capabilities: the GSO probe
// (getsockopt UDP_SEGMENT), the don't-fragment setting (IP_MTU_DISCOVER and
// IPV6_MTU_DISCOVER, for path MTU discovery) and the ECN and packet info
// options. Each must reach the socket itself.
func TestSocketOptionsThroughConn(t *testing.T) {
	conn := testutil.Listen(t, "udp", "[::]:0")
	c := wrap(t, conn, newTestDecider(t, testutil.Limits(100), nil, -1))
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var gsoErr, dfErr, df6Err, tosErr, pktErr error
	if err := rc.Control(func(fd uintptr) {
		_, gsoErr = unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
		dfErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
		df6Err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE)
		tosErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		pktErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
	}); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"UDP_SEGMENT": gsoErr, "IP_MTU_DISCOVER": dfErr,
		"IPV6_MTU_DISCOVER": df6Err, "IP_RECVTOS": tosErr, "IPV6_RECVPKTINFO": pktErr} {
		if err != nil {
			t.Errorf("%s through the Conn: %v", name, err)
		}
	}
	// Read the settings back from the socket itself.
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var pmtu, recvtos int
	raw.Control(func(fd uintptr) {
		pmtu, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER)
		recvtos, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS)
	})
	if pmtu != unix.IPV6_PMTUDISC_PROBE || recvtos != 1 {
		t.Fatalf("the socket has IPV6_MTU_DISCOVER %d, IP_RECVTOS %d: the options did not reach it", pmtu, recvtos)
	}
}

// unprivilegedTests are the tests the unprivileged children run: the
// limiter on a real socket and quic-go over the wrapper, under a flood.
const unprivilegedTests = "^(TestUnprivilegedChild|TestEveryReadFilters|TestReadBatchPairs|TestQUICGoUnderFlood|TestQUICGoKeepsFastPath)$"

// TestUnprivilegedChild runs only inside TestWithoutPrivileges's children:
// it asserts that they lack CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN.
func TestUnprivilegedChild(t *testing.T) {
	if os.Getenv(testutil.Unprivileged) == "" {
		t.Skip("runs in TestWithoutPrivileges's children")
	}
	caps := testutil.EffectiveCaps(t)
	for name, c := range map[string]uint{"CAP_BPF": unix.CAP_BPF, "CAP_PERFMON": unix.CAP_PERFMON, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN} {
		if caps>>c&1 != 0 {
			t.Errorf("the child has %s (CapEff %#x)", name, caps)
		}
	}
}

// TestWithoutPrivileges runs the socket and quic-go tests of this package
// again where BPF cannot load: as nobody with no capabilities, and as root
// with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN dropped. The userspace mode
// needs none of them.
func TestWithoutPrivileges(t *testing.T) {
	if os.Getenv(testutil.Unprivileged) != "" {
		t.Skip("already a child")
	}
	if os.Geteuid() != 0 {
		// Every test of this run is already unprivileged.
		if caps := testutil.EffectiveCaps(t); caps>>unix.CAP_BPF&1 != 0 || caps>>unix.CAP_SYS_ADMIN&1 != 0 {
			t.Fatalf("not root, yet CapEff %#x has CAP_BPF or CAP_SYS_ADMIN", caps)
		}
		return
	}
	testutil.RerunUnprivileged(t, "userspace.test", unprivilegedTests, []string{"bpf", "perfmon", "sys_admin"},
		[]string{"TestUnprivilegedChild", "TestEveryReadFilters", "TestQUICGoUnderFlood", "TestQUICGoKeepsFastPath"})
}
