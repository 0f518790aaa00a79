//go:build linux

package virtiobench

import (
	"net"
	"net/netip"

	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// The network between the host and the guest: a tap in a namespace the
// run makes, QEMU's virtio-net NIC in the guest. The guest's address and
// the host's (where the legit client and the agent's controller are) share
// a /64; the flood's sources are xdpbench's /48 (FloodPrefix, which the
// floor's program drops), on the tap too, so that the socket sender can
// bind them and the guest's answers reach them. Nothing else is sent to or
// from anywhere: every address is in fd00::/8, in that namespace.
const (
	tapName   = "rkvt"
	guestIf   = "eth0"
	guestAddr = "fd00:78:c::1"
	hostAddr  = "fd00:78:c::2"
	guestMAC  = "52:54:00:78:0c:01"
	hostMAC   = "52:54:00:78:0c:02"
	agentPort = 9000
)

// guestMACAddr is guestMAC parsed.
func guestMACAddr() net.HardwareAddr {
	mac, err := net.ParseMAC(guestMAC)
	if err != nil {
		panic(err)
	}
	return mac
}

// floodTarget is where the flood goes: Caddy's HTTP/3 port in the guest.
func floodTarget() netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(guestAddr), xdpbench.HTTPSPort)
}

// agentAddr is the agent's address in the guest.
func agentAddr() string {
	return netip.AddrPortFrom(netip.MustParseAddr(guestAddr), agentPort).String()
}
