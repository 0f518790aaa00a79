//go:build linux

package xdpbench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// netns is a network namespace the run made.
type netns struct {
	name string
	fd   int
}

// newNetNS makes a network namespace with its loopback up.
func newNetNS() (*netns, error) {
	name := fmt.Sprintf("rakebench-xdp-%d-%08x", os.Getpid(), rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("creating network namespace %s: %w: %s", name, err, out)
	}
	fd, err := unix.Open("/var/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		exec.Command("ip", "netns", "del", name).Run()
		return nil, fmt.Errorf("opening network namespace %s: %w", name, err)
	}
	n := &netns{name: name, fd: fd}
	if err := n.ip("link set lo up"); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// close removes the namespace, and with it its end of the veth.
func (n *netns) close() {
	unix.Close(n.fd)
	exec.Command("ip", "netns", "del", n.name).Run()
}

// ip runs ip commands in the namespace, as one batch.
func (n *netns) ip(cmds ...string) error {
	cmd := exec.Command("ip", "-n", n.name, "-b", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("configuring network namespace %s (%q): %w: %s", n.name, cmds, err, out)
	}
	return nil
}

// prefix runs a command in the namespace.
func (n *netns) prefix() []string { return []string{"ip", "netns", "exec", n.name} }

// do runs fn with the calling goroutine's thread in the namespace: the
// sockets fn makes belong to it.
func (n *netns) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening this thread's network namespace: %w", err)
	}
	defer unix.Close(home)
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering network namespace %s: %w", n.name, err)
	}
	defer func() {
		if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
			panic(fmt.Sprintf("cannot return to the original network namespace: %v", err))
		}
	}()
	return fn()
}

// lab is the benchmark's network: Caddy's namespace and the sender's,
// joined by a veth pair.
type lab struct {
	server, sender *netns
}

// The veth's name at both ends, and its addresses: Caddy's, the legit
// client's (in Caddy's /64) and the flood's sources (another /48).
const vethName = "rkxb"

func serverAddr() string       { return "fd00:78:b::1" }
func clientAddr() string       { return "fd00:78:b::2" }
func floodSource(i int) string { return fmt.Sprintf("fd00:78:b0::%x", i+1) }

// newLab makes the namespaces and the veth, with sources flood addresses.
func newLab(sources int) (*lab, error) {
	server, err := newNetNS()
	if err != nil {
		return nil, err
	}
	sender, err := newNetNS()
	if err != nil {
		server.close()
		return nil, err
	}
	l := &lab{server: server, sender: sender}
	cmds := []string{fmt.Sprintf("link add %s type veth peer name %s netns %s", vethName, vethName, sender.name),
		"link set " + vethName + " up", fmt.Sprintf("addr add %s/64 dev %s nodad", serverAddr(), vethName)}
	if err := server.ip(cmds...); err != nil {
		l.close()
		return nil, err
	}
	cmds = []string{"link set " + vethName + " up", fmt.Sprintf("addr add %s/64 dev %s nodad", clientAddr(), vethName)}
	for i := range sources {
		cmds = append(cmds, fmt.Sprintf("addr add %s/128 dev %s nodad", floodSource(i), vethName))
	}
	// The sources' /48 is reached over the veth from Caddy's side too, for
	// whatever Caddy answers.
	if err := sender.ip(cmds...); err != nil {
		l.close()
		return nil, err
	}
	if err := server.ip(fmt.Sprintf("route add fd00:78:b0::/48 dev %s", vethName)); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// close removes both namespaces.
func (l *lab) close() {
	l.server.close()
	l.sender.close()
}
