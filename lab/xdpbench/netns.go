//go:build linux

package xdpbench

import (
	"fmt"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// lab is the benchmark's network: Caddy's namespace and the sender's,
// joined by a veth pair.
type lab struct {
	server, sender *testutil.NetNS
}

// The veth's name at both ends, and its addresses: Caddy's, the legit
// client's (in Caddy's /64) and the flood's sources (another /48).
const vethName = "rkxb"

func serverAddr() string       { return "fd00:78:b::1" }
func clientAddr() string       { return "fd00:78:b::2" }
func floodSource(i int) string { return fmt.Sprintf("fd00:78:b0::%x", i+1) }

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
		cmds = append(cmds, fmt.Sprintf("addr add %s/128 dev %s nodad", floodSource(i), vethName))
	}
	// The sources' /48 is reached over the veth from Caddy's side too, for
	// whatever Caddy answers.
	if err := sender.Run(cmds...); err != nil {
		l.close()
		return nil, err
	}
	if err := server.Run(fmt.Sprintf("route add fd00:78:b0::/48 dev %s", vethName)); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// close removes both namespaces.
func (l *lab) close() {
	l.server.Close()
	l.sender.Close()
}
