//go:build linux

package testutil

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace made for one test: the place for the fd00::/8
// addresses (and links between namespaces) that tests may send to. It is
// removed when the test ends; sockets made in it stay there.
type NetNS struct {
	name string
	fd   int
	// joined: another process made the namespace (JoinNetNS), and
	// removes it.
	joined bool
}

// OpenNetNS makes a network namespace named after prefix, this process and
// a random number, with its loopback up; Close removes it. NewNetNS is the
// same for a test; the lab's benchmarks, which are not tests, call this.
func OpenNetNS(prefix string) (*NetNS, error) {
	name := fmt.Sprintf("%s-%d-%08x", prefix, os.Getpid(), rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("creating network namespace %s: %w: %s", name, err, out)
	}
	fd, err := unix.Open("/var/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		exec.Command("ip", "netns", "del", name).Run()
		return nil, fmt.Errorf("opening network namespace %s: %w", name, err)
	}
	n := &NetNS{name: name, fd: fd}
	if err := n.Run("link set lo up"); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// NewNetNS makes a network namespace (OpenNetNS) with each of addrs
// (prefixes such as "fd00:1::1/128") on its loopback, usable at once (no
// duplicate address detection). It is removed when t ends. Without
// iproute2's ip, or the privilege to make a namespace, it skips t (or, when
// Required, fails it).
func NewNetNS(t testing.TB, addrs ...string) *NetNS {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		SkipOrFail(t, "needs iproute2: %v", err)
	}
	n, err := OpenNetNS("rakelimit-test")
	if err != nil {
		SkipOrFail(t, "%v", err)
	}
	t.Cleanup(n.Close)
	var cmds []string
	for _, a := range addrs {
		cmds = append(cmds, fmt.Sprintf("addr add %s dev lo nodad", a))
	}
	if len(cmds) > 0 {
		n.IP(t, cmds...)
	}
	return n
}

// JoinNetNS opens the network namespace name, which another process made
// (a test that runs a copy of its binary inside one of its namespaces hands
// it their names), to enter it and to link it; it is closed when t ends,
// and not removed: its maker removes it.
func JoinNetNS(t testing.TB, name string) *NetNS {
	t.Helper()
	fd, err := unix.Open("/var/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("opening network namespace %s: %v", name, err)
	}
	n := &NetNS{name: name, fd: fd, joined: true}
	t.Cleanup(n.Close)
	return n
}

// Name is the namespace's name, as `ip netns` lists it.
func (n *NetNS) Name() string { return n.name }

// Close removes the namespace, and with it the links that end there; a
// namespace joined (JoinNetNS) is only closed.
func (n *NetNS) Close() {
	unix.Close(n.fd)
	if !n.joined {
		exec.Command("ip", "netns", "del", n.name).Run()
	}
}

// Run runs ip commands (such as "addr add fd00::1/128 dev lo") in the
// namespace, as one batch.
func (n *NetNS) Run(cmds ...string) error {
	cmd := exec.Command("ip", "-n", n.name, "-b", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("configuring network namespace %s (%q): %w: %s", n.name, cmds, err, out)
	}
	return nil
}

// IP is Run for a test: it fails t when a command fails.
func (n *NetNS) IP(t testing.TB, cmds ...string) {
	t.Helper()
	if err := n.Run(cmds...); err != nil {
		t.Fatal(err)
	}
}

// Enter runs fn with the calling goroutine's thread inside the namespace:
// sockets fn makes belong to it, and stay there once fn returns. fn must
// not start goroutines that make sockets: they may run on other threads.
func (n *NetNS) Enter(fn func() error) error {
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

// Do is Enter for a test: it fails t when the namespace cannot be entered.
func (n *NetNS) Do(t testing.TB, fn func()) {
	t.Helper()
	if err := n.Enter(func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// Link joins namespaces n and peer with a veth pair whose ends are both
// called name, brings them up and puts addrs on n's end and peerAddrs on
// peer's (prefixes such as "fd00:a::1/64", usable at once: no duplicate
// address detection, and the ends are up before they get addresses, so
// that the first neighbour solicitation is answered). The pair goes with
// the namespaces.
func (n *NetNS) Link(t testing.TB, peer *NetNS, name string, addrs, peerAddrs []string) {
	t.Helper()
	n.IP(t, fmt.Sprintf("link add %s type veth peer name %s netns %s", name, name, peer.name), "link set "+name+" up")
	peer.IP(t, "link set "+name+" up")
	for _, end := range []struct {
		ns    *NetNS
		addrs []string
	}{{n, addrs}, {peer, peerAddrs}} {
		if len(end.addrs) == 0 {
			continue
		}
		var cmds []string
		for _, a := range end.addrs {
			cmds = append(cmds, fmt.Sprintf("addr add %s dev %s nodad", a, name))
		}
		end.ns.IP(t, cmds...)
	}
}
