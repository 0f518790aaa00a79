//go:build linux

package xdpbench

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// lab is the benchmark's network: Caddy's namespace and the sender's,
// joined by a veth pair.
type lab struct {
	server, sender *testutil.NetNS
}

// The veth's name at both ends, and its addresses: Caddy's and the legit
// client's (in Caddy's /64); the flood's sources are another /48
// (FloodSource).
const vethName = "rkxb"

func serverAddr() string { return "fd00:78:b::1" }
func clientAddr() string { return "fd00:78:b::2" }

// FloodPrefix is the /48 of the flood's sources, which the floor's program
// drops.
const FloodPrefix = "fd00:78:b0::/48"

// FloodSource is the flood's i-th source address (from 0), in FloodPrefix.
func FloodSource(i int) string { return fmt.Sprintf("fd00:78:b0::%x", i+1) }

// newLab makes the namespaces and the veth, with sources flood addresses.
func newLab(sources int) (*lab, error) {
	server, err := testutil.OpenNetNS("rakebench-xdp")
	if err != nil {
		return nil, err
	}
	sender, err := testutil.OpenNetNS("rakebench-xdp")
	if err != nil {
		server.Close()
		return nil, err
	}
	l := &lab{server: server, sender: sender}
	cmds := []string{fmt.Sprintf("link add %s type veth peer name %s netns %s", vethName, vethName, sender.Name()),
		"link set " + vethName + " up", fmt.Sprintf("addr add %s/64 dev %s nodad", serverAddr(), vethName)}
	if err := server.Run(cmds...); err != nil {
		l.close()
		return nil, err
	}
	cmds = []string{"link set " + vethName + " up", fmt.Sprintf("addr add %s/64 dev %s nodad", clientAddr(), vethName)}
	for i := range sources {
		cmds = append(cmds, fmt.Sprintf("addr add %s/128 dev %s nodad", FloodSource(i), vethName))
	}
	// The sources' /48 is reached over the veth from Caddy's side too, for
	// whatever Caddy answers.
	if err := sender.Run(cmds...); err != nil {
		l.close()
		return nil, err
	}
	if err := server.Run(fmt.Sprintf("route add %s dev %s", FloodPrefix, vethName)); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// sendFrames sends fl to dst as XDP frames into the sender's end of the
// veth, addressed to the server's end.
func (l *lab) sendFrames(fl Flood, dst netip.AddrPort) (int, time.Duration, error) {
	var dstMAC net.HardwareAddr
	if err := l.server.Enter(func() error {
		iface, err := net.InterfaceByName(vethName)
		if err == nil {
			dstMAC = iface.HardwareAddr
		}
		return err
	}); err != nil {
		return 0, 0, err
	}
	return fl.SendFrames(l.sender, vethName, dstMAC, dst)
}

// close removes both namespaces.
func (l *lab) close() {
	l.server.Close()
	l.sender.Close()
}
