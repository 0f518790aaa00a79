package userspace

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/bpf"
)

// TestSocketOptionsThroughConn makes, through the Conn's raw connection, the
// calls quic-go makes on Linux to choose its capabilities: the GSO probe
// (getsockopt UDP_SEGMENT), the don't-fragment setting (IP_MTU_DISCOVER and
// IPV6_MTU_DISCOVER, for path MTU discovery) and the ECN and packet info
// options. Each must reach the socket itself.
func TestSocketOptionsThroughConn(t *testing.T) {
	conn := listen(t, "udp", "[::]:0")
	c := wrap(t, conn, newTestLimiter(t, limits(100), nil, -1))
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

// TestKernelDimensions: the userspace limiter accepts and tracks exactly
// what the kernel filter does.
func TestKernelDimensions(t *testing.T) {
	if bpf.MaxAllow != MaxAllow || bpf.DefaultTrackShift != DefaultTrackShift {
		t.Fatalf("bpf: MaxAllow %d, DefaultTrackShift %d; userspace: %d, %d",
			bpf.MaxAllow, bpf.DefaultTrackShift, MaxAllow, DefaultTrackShift)
	}
	src, err := os.ReadFile("../../bpf/rakelimit.c")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`#define MAX_TRACKED_STREAMS (\d+)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("MAX_TRACKED_STREAMS not found in bpf/rakelimit.c")
	}
	if n, _ := strconv.Atoi(string(m[1])); n != MaxTrackedStreams {
		t.Fatalf("the kernel tracks %d streams, userspace %d", n, MaxTrackedStreams)
	}
}
